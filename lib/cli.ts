// The shape every `bashible <command>` module has. main.ts loads a command's module only
// when that command runs, so the resident daemon never pays for code it does not use.
import type { ParseArgsConfig } from "node:util";
import type { Logger } from "./log/log.ts";

/**
 * Exit codes are a contract: scripts and systemd act on them. `problems`: the node is as close
 * to the bundle as it can get, but steps reported problems that hold part of it back (a NodeUser
 * refused, a link refused for one user); waiting will not fix them, a person must.
 */
export const EXIT = { ok: 0, error: 1, changesPending: 2, problems: 3 } as const;
export type ExitCode = (typeof EXIT)[keyof typeof EXIT];

export type OptionSpec = NonNullable<ParseArgsConfig["options"]>;
export type ParsedValues = Record<string, string | boolean | (string | boolean)[] | undefined>;

export interface CommandContext {
  values: ParsedValues;
  positionals: string[];
  log: Logger;
  /** Filesystem root the command acts on ("/" on a real node). */
  root: string;
  stdout: (text: string) => void;
}

export interface Command {
  /** One line for the command list. */
  summary: string;
  /** Full help text shown by `bashible <command> --help` (after the usage line). */
  help: string;
  /** `usage: bashible <name> …` tail, e.g. "[--root DIR]". */
  usage: string;
  options?: OptionSpec;
  /** Commands whose stdout is their result keep logs on stderr. */
  logTo?: "stdout" | "stderr";
  /** Not listed in `bashible --help` (internal plumbing). */
  hidden?: boolean;
  /** A long-running process that must stay small: gets the light logger, not pino. */
  resident?: boolean;
  /** Whether `--root` means something to this command. */
  takesRoot?: boolean;
  /**
   * Why the command cannot work as any other user (it changes the node's files and their
   * owners, even under --root): main refuses to start it then, saying so, instead of failing
   * halfway on the first file.
   */
  needsRoot?: string;
  run(ctx: CommandContext): Promise<ExitCode>;
}

/** An error the user caused or can fix; main prints its message without a stack. */
export class UsageError extends Error {
  override name = "UsageError";
}
