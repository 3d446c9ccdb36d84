// The node as steps see it. Every effect on the machine goes through here: files (atomic
// writes with explicit mode and owner), commands, systemd. Paths are node paths ("/etc/…");
// the host maps them under its root, so the same step converges "/", a sandbox or a test tree.
// In a sandbox (root ≠ "/") actions that would reach the real machine (unit restarts, reboot)
// are recorded in <root>/var/lib/bashible/sandbox-actions.log instead of performed.
import { randomBytes } from "node:crypto";
import { spawn } from "node:child_process";
import { createReadStream } from "node:fs";
import { appendFile, chmod, chown, lstat, mkdir, open, readdir, readFile, rename, rm } from "node:fs/promises";
import path from "node:path";
import type { BundleFamily } from "../../bundles/os-families.ts";

export interface OsProfile {
  id: string;
  versionId: string;
  family: BundleFamily;
  packageManager: "apt" | "dnf" | "apt-rpm";
}

export interface FileStat {
  mode: number;
  uid: number;
  gid: number;
  size: number;
  mtimeMs: number;
  isFile: boolean;
  isDirectory: boolean;
  isSymlink: boolean;
}

export interface WriteOptions {
  mode: number;
  uid?: number;
  gid?: number;
}

export interface RunOptions {
  env?: Record<string, string>;
  input?: string | Buffer;
  cwd?: string;
  timeoutMs?: number;
  /** Append stdout+stderr to this node path (e.g. a step log). */
  logFile?: string;
  signal?: AbortSignal;
}

export interface RunResult {
  exitCode: number;
  stdout: string;
  stderr: string;
}

export class CommandError extends Error {
  override name = "CommandError";
  readonly argv: string[];
  readonly result: RunResult;
  constructor(argv: string[], result: RunResult) {
    // One line: the last line of output says most; the full output is in .result and the step log.
    const last = (result.stderr.trim() || result.stdout.trim()).split("\n").pop() ?? "";
    super(`command failed (exit ${result.exitCode}): ${argv.join(" ")}${last ? `: ${last}` : ""}`);
    this.argv = argv;
    this.result = result;
  }
}

export const SANDBOX_ACTIONS_LOG = "/var/lib/bashible/sandbox-actions.log";

export class Host {
  readonly root: string;
  readonly os: OsProfile;
  readonly sandbox: boolean;

  constructor(root: string, os: OsProfile) {
    this.root = path.resolve(root);
    this.os = os;
    this.sandbox = this.root !== "/";
  }

  /** Maps a node path to the real path under the root. */
  path(nodePath: string): string {
    if (!path.isAbsolute(nodePath)) throw new Error(`host: node paths are absolute, got '${nodePath}'`);
    const real = path.join(this.root, nodePath);
    if (real !== this.root && !real.startsWith(this.root === "/" ? "/" : `${this.root}/`)) {
      throw new Error(`host: ${nodePath} escapes the root ${this.root}`);
    }
    return real;
  }

  async readFile(p: string): Promise<Buffer | undefined> {
    try {
      return await readFile(this.path(p));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
      throw err;
    }
  }

  async readText(p: string): Promise<string | undefined> {
    return (await this.readFile(p))?.toString("utf8");
  }

  async stat(p: string): Promise<FileStat | undefined> {
    try {
      const s = await lstat(this.path(p));
      return {
        mode: s.mode & 0o7777,
        uid: s.uid,
        gid: s.gid,
        size: s.size,
        mtimeMs: s.mtimeMs,
        isFile: s.isFile(),
        isDirectory: s.isDirectory(),
        isSymlink: s.isSymbolicLink(),
      };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
      throw err;
    }
  }

  async exists(p: string): Promise<boolean> {
    return (await this.stat(p)) !== undefined;
  }

  /** Entry names of a directory; [] when it does not exist. */
  async listDir(p: string): Promise<string[]> {
    try {
      return (await readdir(this.path(p))).sort();
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return [];
      throw err;
    }
  }

  /** mkdir -p, then mode and owner on the last component. */
  async mkdir(p: string, opts: WriteOptions = { mode: 0o755 }): Promise<void> {
    const real = this.path(p);
    await mkdir(real, { recursive: true, mode: opts.mode });
    await chmod(real, opts.mode);
    if (opts.uid !== undefined || opts.gid !== undefined) await chown(real, opts.uid ?? 0, opts.gid ?? 0);
  }

  /**
   * Atomic write: temp file in the same directory, fsync, chmod/chown, rename, fsync the
   * directory. A crash leaves either the old or the new file, never a torn one.
   */
  async writeFile(p: string, content: string | Buffer, opts: WriteOptions): Promise<void> {
    await this.writeFileStream(p, [typeof content === "string" ? Buffer.from(content) : content], opts);
  }

  /**
   * Atomic write from a stream: chunks go to a temp file beside the target; only when the
   * source ends without throwing is the file fsynced and renamed into place. A source that
   * throws (a network error, a failed checksum check in the caller's generator) leaves the
   * target untouched and no temp file behind; a killed process leaves a dot-file that the next
   * write of the same file sweeps up.
   */
  async writeFileStream(
    p: string,
    source: Iterable<Uint8Array> | AsyncIterable<Uint8Array>,
    opts: WriteOptions,
  ): Promise<void> {
    const real = this.path(p);
    const dir = path.dirname(real);
    await mkdir(dir, { recursive: true });
    const tmpPrefix = `.${path.basename(real)}.bashible-`;
    for (const name of await readdir(dir)) {
      if (name.startsWith(tmpPrefix)) await rm(path.join(dir, name), { force: true });
    }
    const tmp = path.join(dir, `${tmpPrefix}${randomBytes(4).toString("hex")}`);
    const fh = await open(tmp, "w", opts.mode);
    try {
      for await (const chunk of source) await fh.write(chunk);
      await fh.chmod(opts.mode);
      if (opts.uid !== undefined || opts.gid !== undefined) await fh.chown(opts.uid ?? 0, opts.gid ?? 0);
      await fh.sync();
    } catch (err) {
      await fh.close();
      await rm(tmp, { force: true });
      throw err;
    }
    await fh.close();
    await rename(tmp, real);
    await fsyncDir(dir);
  }

  /** Reads a file as a stream of chunks (for hashing large files without loading them). */
  async *readStream(p: string): AsyncGenerator<Buffer> {
    for await (const chunk of createReadStream(this.path(p))) yield chunk as Buffer;
  }

  /** Appends to a log-like file (not atomic; for logs only). */
  async appendFile(p: string, text: string): Promise<void> {
    const real = this.path(p);
    await mkdir(path.dirname(real), { recursive: true });
    await appendFile(real, text);
  }

  async remove(p: string, opts: { recursive?: boolean } = {}): Promise<void> {
    await rm(this.path(p), { force: true, recursive: opts.recursive ?? false });
  }

  /** Runs a command on this machine (argv[0] found on PATH). Steps make argv root-aware. */
  run(argv: string[], opts: RunOptions = {}): Promise<RunResult> {
    const [cmd, ...args] = argv;
    if (!cmd) return Promise.reject(new Error("host.run: empty argv"));
    return new Promise((resolve, reject) => {
      const child = spawn(cmd, args, {
        cwd: opts.cwd ? this.path(opts.cwd) : undefined,
        env: { ...process.env, ...opts.env },
        stdio: ["pipe", "pipe", "pipe"],
        signal: opts.signal,
        timeout: opts.timeoutMs,
        killSignal: "SIGKILL",
      });
      const out: Buffer[] = [];
      const err: Buffer[] = [];
      child.stdout.on("data", (d: Buffer) => out.push(d));
      child.stderr.on("data", (d: Buffer) => err.push(d));
      child.once("error", reject);
      child.once("close", async (code, signal) => {
        const result = {
          exitCode: code ?? (signal ? 128 : 1),
          stdout: Buffer.concat(out).toString("utf8"),
          stderr: Buffer.concat(err).toString("utf8") + (signal ? `\nkilled by ${signal}` : ""),
        };
        if (opts.logFile) {
          await this.appendFile(opts.logFile, `$ ${argv.join(" ")}\n${result.stdout}${result.stderr}`).catch(
            () => undefined,
          );
        }
        resolve(result);
      });
      child.stdin.end(opts.input);
    });
  }

  /** Like run, but a non-zero exit throws CommandError. */
  async mustRun(argv: string[], opts: RunOptions = {}): Promise<RunResult> {
    const r = await this.run(argv, opts);
    if (r.exitCode !== 0) throw new CommandError(argv, r);
    return r;
  }

  /**
   * systemctl. On "/" it runs; in a sandbox, enable/disable work offline (`--root`) and
   * everything that touches running units is recorded instead.
   */
  async systemctl(action: "daemon-reload" | "restart" | "start" | "stop" | "enable" | "disable", unit?: string) {
    const argv = ["systemctl", action, ...(unit ? [unit] : [])];
    if (!this.sandbox) return this.mustRun(argv);
    if (action === "enable" || action === "disable") {
      return this.mustRun(["systemctl", `--root=${this.root}`, action, ...(unit ? [unit] : [])]);
    }
    await this.recordSandboxAction(argv.join(" "));
    return { exitCode: 0, stdout: "", stderr: "" };
  }

  /** Asks for a reboot; recorded in a sandbox. */
  async reboot(): Promise<void> {
    if (this.sandbox) return this.recordSandboxAction("reboot");
    await this.mustRun(["shutdown", "-r", "+0"]);
  }

  async recordSandboxAction(what: string): Promise<void> {
    await mkdir(path.dirname(this.path(SANDBOX_ACTIONS_LOG)), { recursive: true });
    await appendFile(this.path(SANDBOX_ACTIONS_LOG), `${new Date().toISOString()} ${what}\n`);
  }
}

/** fsync a directory, so a rename in it survives a crash. */
export async function fsyncDir(dir: string): Promise<void> {
  const fh = await open(dir, "r");
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}
