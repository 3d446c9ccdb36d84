#!/usr/bin/env node
// bashible: the node agent's single entry point. Parses the command line, sets up logging,
// loads the one command module asked for, and turns its outcome into an exit code.
import { parseArgs } from "node:util";
import { stat } from "node:fs/promises";
import path from "node:path";
import { EXIT, UsageError, type Command, type OptionSpec } from "../lib/cli.ts";
import type { LogFormat, Logger } from "../lib/log/log.ts";

const COMMANDS: Record<string, () => Promise<{ default: Command }>> = {
  run: () => import("./commands/run.ts"),
  once: () => import("./commands/once.ts"),
  plan: () => import("./commands/plan.ts"),
  status: () => import("./commands/status.ts"),
  facts: () => import("./commands/facts.ts"),
  "early-oom": () => import("./commands/early-oom.ts"),
  fencing: () => import("./commands/fencing.ts"),
  "packages-proxy": () => import("../cluster/packages-proxy/command.ts"),
  package: () => import("./commands/package.ts"),
  "internal-disruption": () => import("./commands/internal-disruption.ts"),
  adopt: () => import("./commands/adopt.ts"),
  version: () => import("./commands/version.ts"),
  "internal-connections": () => import("./commands/connections.ts"),
  server: () => import("../cluster/server/command.ts"),
  controllers: () => import("../cluster/controllers/command.ts"),
};

const GLOBAL_OPTIONS: OptionSpec = {
  help: { type: "boolean", short: "h" },
  "log-format": { type: "string" },
  "log-level": { type: "string" },
};
const ROOT_OPTION: OptionSpec = { root: { type: "string" } };

const GLOBAL_HELP = `Global options:
  -h, --help              show help for the command
      --log-format FMT    json (default when not a terminal) or pretty
      --log-level LEVEL   trace, debug, info (default), warn, error`;

async function mainHelp(): Promise<string> {
  const commands = await Promise.all(
    Object.entries(COMMANDS).map(async ([name, load]) => [name, (await load()).default] as const),
  );
  const lines = commands.filter(([, c]) => !c.hidden).map(([name, c]) => `  ${name.padEnd(14)} ${c.summary}`);
  return `bashible: the node agent of a Deckhouse-style Kubernetes cluster

usage: bashible <command> [options]

Commands:
${lines.join("\n")}

${GLOBAL_HELP}

Exit codes: 0 ok, 1 error, 2 changes pending (plan), 3 problems reported: the rest of the
bundle is applied or in sync, the parts the problems name are not (once, plan).
Run 'bashible <command> --help' for a command's options.
`;
}

function commandHelp(name: string, cmd: Command): string {
  const root = cmd.takesRoot ? "\n      --root DIR          act on the tree under DIR instead of /" : "";
  return `usage: bashible ${name} ${cmd.usage}\n\n${cmd.summary}\n\n${cmd.help.trimEnd()}\n\n${GLOBAL_HELP}${root}\n`;
}

async function makeLogger(cmd: Command, format: LogFormat | undefined, level: string | undefined): Promise<Logger> {
  if (cmd.resident) {
    const { createLightLogger } = await import("../lib/log/light.ts");
    return createLightLogger({
      format: format ?? (process.stdout.isTTY ? "pretty" : "json"),
      level: level ?? process.env.BASHIBLE_LOG_LEVEL ?? "info",
    });
  }
  const { createLogger } = await import("../lib/log/log.ts");
  return createLogger({ format, level, to: cmd.logTo ?? "stdout" });
}

/** Why `--root DIR` cannot be a node's root, or undefined when it can (or is not given). */
async function checkRoot(dir: string | undefined): Promise<string | undefined> {
  if (dir === undefined) return undefined;
  if (dir === "")
    return "--root needs a directory: the tree to act on instead of / (a node's root, with etc/os-release)";
  const st = await stat(dir).catch((err: NodeJS.ErrnoException) => err);
  if (st instanceof Error) {
    if (st.code === "ENOENT")
      return `--root ${dir} does not exist: point it at a node's root (a directory with etc/os-release)`;
    return `--root ${dir} cannot be used: ${st.message}`;
  }
  if (!st.isDirectory())
    return `--root ${dir} is not a directory: point it at a node's root (a directory with etc/os-release)`;
  return undefined;
}

export async function main(argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
  if (name === undefined || name === "help" || name === "--help" || name === "-h") {
    const target = name === "help" ? rest[0] : undefined;
    if (target && COMMANDS[target]) {
      process.stdout.write(commandHelp(target, (await COMMANDS[target]()).default));
      return EXIT.ok;
    }
    process.stdout.write(await mainHelp());
    return name === undefined ? EXIT.error : EXIT.ok;
  }
  if (name === "--version") return main(["version", ...rest]);
  const load = COMMANDS[name];
  if (!load) {
    process.stderr.write(`bashible: unknown command '${name}'. Run 'bashible --help' for the list.\n`);
    return EXIT.error;
  }
  const cmd = (await load()).default;
  let parsed: ReturnType<typeof parseArgs>;
  try {
    parsed = parseArgs({
      args: rest,
      options: { ...GLOBAL_OPTIONS, ...(cmd.takesRoot ? ROOT_OPTION : {}), ...cmd.options },
      allowPositionals: true,
      strict: true,
    });
  } catch (err) {
    process.stderr.write(`bashible ${name}: ${(err as Error).message}\nRun 'bashible ${name} --help' for usage.\n`);
    return EXIT.error;
  }
  const { values, positionals } = parsed;
  if (values.help) {
    process.stdout.write(commandHelp(name, cmd));
    return EXIT.ok;
  }
  const format = values["log-format"] as string | undefined;
  if (format !== undefined && format !== "json" && format !== "pretty") {
    process.stderr.write(`bashible ${name}: --log-format must be json or pretty, not '${format}'\n`);
    return EXIT.error;
  }
  if (cmd.needsRoot && process.geteuid?.() !== 0) {
    process.stderr.write(
      `bashible ${name} needs root (${cmd.needsRoot}); this is uid ${process.geteuid?.()}: run it with sudo\n`,
    );
    return EXIT.error;
  }
  const rootProblem = await checkRoot(values.root as string | undefined);
  if (rootProblem) {
    process.stderr.write(`bashible ${name}: ${rootProblem}\n`);
    return EXIT.error;
  }
  const log = await makeLogger(cmd, format as LogFormat | undefined, values["log-level"] as string | undefined);
  const root = path.resolve((values.root as string | undefined) ?? "/");
  try {
    return await cmd.run({ values, positionals, log, root, stdout: (t) => process.stdout.write(t) });
  } catch (err) {
    if (err instanceof UsageError) {
      process.stderr.write(`bashible ${name}: ${err.message}\n`);
    } else {
      // The message says what and where (the class name says nothing to a person); the stack
      // is for debugging only.
      log.debug({ err }, "stack");
      log.error(`${name} failed: ${(err as Error).message}`);
    }
    return EXIT.error;
  }
}

// No top-level await: the same entry also bundles as CommonJS (single-executable builds).
// exitCode instead of exit(): pending stdout writes drain; exiting early would truncate output.
main(process.argv.slice(2)).then((code) => {
  process.exitCode = code;
});
