// The node as steps see it. Every effect on the machine goes through here: files (confined to
// the root, never through a link: confined.ts), commands (runner.ts), systemd. Paths are node
// paths ("/etc/…"); the host maps them under its root, so the same step converges "/", a
// sandbox or a test tree. In a sandbox (root ≠ "/") actions that would reach the real machine
// (unit restarts, reboot) are recorded in <root>/var/lib/bashible/sandbox-actions.log instead.
import { createReadStream } from "node:fs";
import type { FileHandle } from "node:fs/promises";
import { constants as C } from "node:fs";
import { open } from "node:fs/promises";
import path from "node:path";
import type { BundleFamily } from "../bundles/os-families.ts";
import { PATHS } from "../bundles/paths.ts";
import { ConfinedFs, type FileStat, type Ownership } from "./confined.ts";
import { redact } from "../lib/log/redact.ts";
import { CommandError, mustRun, run, type RunOptions, type RunResult } from "./runner.ts";

export type { FileStat, Ownership } from "./confined.ts";
export { CommandError, MissingProgramError, type RunResult } from "./runner.ts";

export interface OsProfile {
  id: string;
  versionId: string;
  family: BundleFamily;
  packageManager: "apt" | "dnf" | "apt-rpm";
}

export interface HostRunOptions extends Omit<RunOptions, "cwd" | "onLine"> {
  /** Node path of the working directory. */
  cwd?: string;
  /** Node path of a log file each output line is appended to (a step log). */
  logFile?: string;
  /** Each output line (already redacted), e.g. to the journal. */
  onLine?: RunOptions["onLine"];
}

export class Host {
  readonly root: string;
  readonly os: OsProfile;
  readonly sandbox: boolean;
  readonly fs: ConfinedFs;

  constructor(root: string, os: OsProfile) {
    this.root = path.resolve(root);
    this.os = os;
    this.sandbox = this.root !== "/";
    this.fs = new ConfinedFs(this.root);
  }

  /**
   * The real path of a node path, lexically (for messages and for arguments of programs, which
   * `run` checks for links before it starts them). File access goes through the confined
   * methods below, never through this string.
   */
  path(nodePath: string): string {
    if (!path.posix.isAbsolute(nodePath)) throw new Error(`host: node paths are absolute, got '${nodePath}'`);
    if (nodePath.split("/").includes("..")) throw new Error(`host: node path '${nodePath}' contains '..'`);
    return path.join(this.root, path.posix.normalize(nodePath));
  }

  /** The node path of a real path under the root, or undefined when it is outside. */
  nodePathOf(real: string): string | undefined {
    if (this.root === "/") return real.startsWith("/") ? real : undefined;
    if (real === this.root) return "/";
    return real.startsWith(`${this.root}/`) ? real.slice(this.root.length) : undefined;
  }

  readFile(p: string, maxBytes?: number): Promise<Buffer | undefined> {
    return this.fs.readFile(p, maxBytes);
  }

  async readText(p: string, maxBytes?: number): Promise<string | undefined> {
    return (await this.fs.readFile(p, maxBytes))?.toString("utf8");
  }

  stat(p: string): Promise<FileStat | undefined> {
    return this.fs.lstat(p);
  }

  async exists(p: string): Promise<boolean> {
    return (await this.fs.lstat(p)) !== undefined;
  }

  listDir(p: string): Promise<string[]> {
    return this.fs.listDir(p);
  }

  /** mkdir -p, then exactly this mode and owner on the last component. */
  mkdir(p: string, own: Ownership = { mode: 0o755 }): Promise<void> {
    return this.fs.mkdir(p, own);
  }

  /** Atomic write (temp file, fsync, rename, fsync dir); `check` validates the candidate first. */
  writeFile(
    p: string,
    content: string | Buffer,
    own: Ownership,
    o: { check?: (candidate: string) => Promise<void> } = {},
  ): Promise<void> {
    return this.fs.writeAtomic(p, [typeof content === "string" ? Buffer.from(content) : content], own, o);
  }

  /**
   * Atomic write from a stream: only when the source ends without throwing is the file
   * renamed into place. A source that throws (a network error, a failed digest check) leaves
   * the target untouched and no temp file behind.
   */
  writeFileStream(p: string, source: Iterable<Uint8Array> | AsyncIterable<Uint8Array>, own: Ownership): Promise<void> {
    return this.fs.writeAtomic(p, source, own);
  }

  /** Reads a regular file as a stream of chunks (hashing large files without loading them). */
  async *readStream(p: string): AsyncGenerator<Buffer> {
    const f = await this.fs.openFile(p);
    if (!f) throw Object.assign(new Error(`${p}: no such file`), { code: "ENOENT" });
    for await (const chunk of createReadStream("", { fd: f.fh, autoClose: true })) yield chunk as Buffer;
  }

  /** Appends to a log-like file (not atomic; for logs only). */
  appendFile(p: string, text: string): Promise<void> {
    return this.fs.append(p, text);
  }

  remove(p: string, opts: { recursive?: boolean } = {}): Promise<void> {
    return this.fs.remove(p, opts);
  }

  symlink(p: string, target: string): Promise<void> {
    return this.fs.symlink(p, target);
  }

  /** Refuses to start a program on a path under the root that runs through a link. */
  private async checkPaths(argv: string[], cwd: string | undefined): Promise<void> {
    for (const a of [...argv, ...(cwd ? [cwd] : [])]) {
      const nodePath = this.root === "/" ? undefined : this.nodePathOf(a);
      if (nodePath) await this.fs.realPath(nodePath);
    }
  }

  private async openLog(p: string): Promise<FileHandle> {
    await this.fs.mkdir(path.posix.dirname(p), { mode: 0o755 });
    const real = await this.fs.realPath(p);
    return open(real, C.O_WRONLY | C.O_CREAT | C.O_APPEND | C.O_NOFOLLOW, 0o640);
  }

  /** Runs a program on this machine (argv[0] found on PATH); output streams to logFile and onLine. */
  async run(argv: string[], o: HostRunOptions = {}): Promise<RunResult> {
    const cwd = o.cwd ? await this.fs.realPath(o.cwd) : undefined;
    await this.checkPaths(argv, cwd);
    const log = o.logFile ? await this.openLog(o.logFile) : undefined;
    let pending = Promise.resolve();
    try {
      if (log) await log.write(`$ ${redact(argv.join(" "), o.secrets)}\n`);
      const r = await run(argv, {
        ...o,
        cwd,
        onLine: (stream, line) => {
          o.onLine?.(stream, line);
          if (log) pending = pending.then(() => log.write(`${line}\n`).then(() => undefined));
        },
      });
      await pending;
      return r;
    } finally {
      await pending.catch(() => undefined);
      await log?.close();
    }
  }

  /** Like run, but a non-zero exit throws CommandError. */
  async mustRun(argv: string[], o: HostRunOptions = {}): Promise<RunResult> {
    const r = await this.run(argv, o);
    if (r.exitCode !== 0 || r.killed) throw new CommandError(argv, r, redact(argv.join(" "), o.secrets));
    return r;
  }

  /**
   * systemctl. On "/" it runs; in a sandbox, enable/disable work offline (`--root`) and
   * everything that touches running units is recorded instead.
   */
  async systemctl(
    action: "daemon-reload" | "restart" | "reload" | "start" | "stop" | "enable" | "disable" | "is-enabled",
    unit?: string,
  ): Promise<RunResult> {
    const argv = ["systemctl", action, ...(unit ? [unit] : [])];
    if (!this.sandbox) return action === "is-enabled" ? run(argv) : mustRun(argv);
    if (action === "enable" || action === "disable" || action === "is-enabled") {
      const offline = ["systemctl", `--root=${this.root}`, action, ...(unit ? [unit] : [])];
      return action === "is-enabled" ? run(offline) : mustRun(offline);
    }
    await this.recordSandboxAction(argv.join(" "));
    return { exitCode: 0, stdout: "", stderr: "" };
  }

  /** Asks systemd for a reboot; recorded in a sandbox. */
  async reboot(): Promise<void> {
    if (this.sandbox) return this.recordSandboxAction("reboot");
    await mustRun(["systemctl", "reboot"]);
  }

  async recordSandboxAction(what: string): Promise<void> {
    await this.fs.append(PATHS.sandboxActions, `${new Date().toISOString()} ${what}\n`);
  }
}
