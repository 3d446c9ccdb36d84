// The one way the converge runs programs: exact argv, a timeout, the whole process tree killed
// on abort or timeout (each command leads its own process group), and output streamed line by
// line to the step log and the journal as it happens, with secrets redacted. Built on execa,
// which only ever loads in the short-lived converge child (docs/benchmarks.md compares it with a
// bare spawn).
import { constants } from "node:os";
import { PROGRAM_PACKAGES } from "../bundles/os-families.ts";
import { redact } from "../lib/log/redact.ts";

/** execa loads with the first command: a plan that runs none never pays for it. */
let execaModule: Promise<typeof import("execa")> | undefined;
const loadExeca = () => (execaModule ??= import("execa"));


/** A program is not installed: waiting will not help, so the step fails at once. */
export class MissingProgramError extends Error {
  override name = "MissingProgramError";
  readonly permanent = true;
  readonly program: string;
  constructor(program: string) {
    const pkg = PROGRAM_PACKAGES[program];
    super(
      `'${program}' is not installed (not found on PATH)${pkg ? `; install package ${pkg.debian} (Debian/Ubuntu) or ${pkg.rhel} (RHEL family)` : ""}`,
    );
    this.program = program;
  }
}

export interface RunOptions {
  env?: Record<string, string>;
  /** Replace the environment instead of extending it. */
  cleanEnv?: boolean;
  input?: string | Buffer;
  /** Real (host) path; callers resolve node paths first. */
  cwd?: string;
  timeoutMs?: number;
  signal?: AbortSignal;
  /** Each output line, as it happens (step log, journal). Secrets are already redacted. */
  onLine?: (stream: "stdout" | "stderr", line: string) => void;
  /** Values never to show in onLine or in the captured output. */
  secrets?: string[];
  /** Run as this user and group (for work inside a directory another user owns). */
  uid?: number;
  gid?: number;
}

export interface RunResult {
  exitCode: number;
  stdout: string;
  stderr: string;
  /** Set when the command was killed (timeout or abort). */
  killed?: "timeout" | "aborted";
}

export class CommandError extends Error {
  override name = "CommandError";
  readonly argv: string[];
  readonly result: RunResult;
  constructor(argv: string[], result: RunResult, shown?: string) {
    // One line: the last line of output says most; the full output is in the step log.
    const last = (result.stderr.trim() || result.stdout.trim()).split("\n").pop() ?? "";
    const how =
      result.killed === "timeout" ? "timed out" : result.killed === "aborted" ? "aborted" : `exit ${result.exitCode}`;
    super(`command failed (${how}): ${shown ?? argv.join(" ")}${last ? `: ${last}` : ""}`);
    this.argv = argv;
    this.result = result;
  }
}

const KEEP_BYTES = 64 * 1024;


function tail(lines: string[]): string {
  let text = lines.join("\n");
  if (text.length > KEEP_BYTES) text = `…${text.slice(-KEEP_BYTES)}`;
  return text;
}

/** Runs argv; resolves with its result (a non-zero exit is a result, not an error). */
export async function run(argv: string[], o: RunOptions = {}): Promise<RunResult> {
  const [file, ...args] = argv;
  if (!file) throw new Error("run: empty argv");
  const secrets = o.secrets ?? [];
  const captured = { stdout: [] as string[], stderr: [] as string[] };
  const lineSink = (stream: "stdout" | "stderr") =>
    // biome-ignore lint/correctness/useYield: each line is consumed here; nothing is passed on
    function* (line: unknown) {
      const shown = redact(String(line), secrets);
      const keep = captured[stream];
      keep.push(shown);
      if (keep.length > 4000) keep.splice(0, keep.length - 2000);
      o.onLine?.(stream, shown);
      // Nothing is kept by execa itself: the captured tail above is what callers see.
    };
  const { execa } = await loadExeca();
  const sub = execa(file, args, {
    env: o.env,
    extendEnv: !o.cleanEnv,
    ...(o.input !== undefined ? { input: o.input } : { stdin: "ignore" }),
    cwd: o.cwd,
    reject: false,
    detached: true,
    cleanup: true,
    buffer: false,
    stdout: lineSink("stdout"),
    stderr: lineSink("stderr"),
    ...(o.uid !== undefined ? { uid: o.uid } : {}),
    ...(o.gid !== undefined ? { gid: o.gid } : {}),
  });
  let killed: RunResult["killed"];
  let forceTimer: NodeJS.Timeout | undefined;
  const killTree = (why: "timeout" | "aborted") => {
    if (killed || sub.pid === undefined) return;
    killed = why;
    try {
      process.kill(-sub.pid, "SIGTERM");
    } catch {
      // already gone
    }
    forceTimer = setTimeout(() => {
      try {
        process.kill(-(sub.pid as number), "SIGKILL");
      } catch {
        // already gone
      }
    }, 3000);
    forceTimer.unref();
  };
  const timer = o.timeoutMs ? setTimeout(() => killTree("timeout"), o.timeoutMs) : undefined;
  const onAbort = () => killTree("aborted");
  if (o.signal?.aborted) onAbort();
  o.signal?.addEventListener("abort", onAbort, { once: true });
  try {
    const r = await sub;
    if (r.failed && r.exitCode === undefined && !r.signal && (r.cause as NodeJS.ErrnoException)?.code === "ENOENT") {
      throw new MissingProgramError(file);
    }
    // Members of the group that outlived the leader (a daemon a script forgot) go with it.
    if (killed) {
      try {
        process.kill(-(sub.pid as number), "SIGKILL");
      } catch {
        // none left
      }
    }
    return {
      exitCode: r.exitCode ?? 128 + (r.signal ? (constants.signals[r.signal as NodeJS.Signals] ?? 0) : 0),
      stdout: tail(captured.stdout),
      stderr: tail(captured.stderr) + (r.signal ? `\nkilled by ${r.signal}` : ""),
      ...(killed ? { killed } : {}),
    };
  } finally {
    clearTimeout(timer);
    clearTimeout(forceTimer);
    o.signal?.removeEventListener("abort", onAbort);
  }
}

/** Like run, but a non-zero exit throws CommandError (its message redacts secrets). */
export async function mustRun(argv: string[], o: RunOptions = {}): Promise<RunResult> {
  const r = await run(argv, o);
  if (r.exitCode !== 0 || r.killed) {
    throw new CommandError(argv, r, redact(argv.join(" "), o.secrets));
  }
  return r;
}
