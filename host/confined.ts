// The node's files, confined to a root and never reached through a link the agent did not
// expect. Every operation walks the path one component at a time from an open descriptor of
// the root (an openat-style walk: `/proc/self/fd/<dir>/<name>` resolves <name> inside the
// directory the descriptor holds, whatever happens to the path string meanwhile), opening each
// directory with O_NOFOLLOW. So a user who owns a directory the agent writes into (a NodeUser's
// home) cannot redirect a write, chmod, chown, read or removal elsewhere by planting or swapping
// a symlink, not even between plan and apply.
//
// Links that real systems ship (/var/lock → /run/lock, /etc/os-release → /usr/lib/os-release)
// are followed only when they are listed in SYSTEM_LINKS, are owned by root and sit in a
// directory only root can write; they are resolved inside the root, as a chroot would. Any
// other link is refused with LinkRefusedError naming the path and where it points.
import { constants as C } from "node:fs";
import {
  type FileHandle,
  lstat as lstatPath,
  mkdir as mkdirPath,
  open,
  readdir,
  readlink,
  rename as renamePath,
  rm as rmPath,
  unlink as unlinkPath,
} from "node:fs/promises";
import type { Stats } from "node:fs";
import path from "node:path";
import { randomBytes } from "node:crypto";
import { writeAtomic } from "../lib/atomic-write.ts";

/** Links a real system ships; followed (inside the root) when root owns them and their directory. */
export const SYSTEM_LINKS: ReadonlySet<string> = new Set([
  "/bin",
  "/sbin",
  "/lib",
  "/lib32",
  "/lib64",
  "/libx32",
  "/var/lock",
  "/var/run",
  "/etc/os-release",
  "/etc/mtab",
]);

const MAX_LINK_HOPS = 16;

export class LinkRefusedError extends Error {
  override name = "LinkRefusedError";
  readonly permanent = true;
  readonly nodePath: string;
  readonly target: string;
  constructor(nodePath: string, target: string, why = "") {
    super(
      `${nodePath} is a symbolic link (to ${target}); refused: the agent does not follow links it does not manage${why ? ` (${why})` : ""}`,
    );
    this.nodePath = nodePath;
    this.target = target;
  }
}

export class NotRegularFileError extends Error {
  override name = "NotRegularFileError";
  readonly permanent = true;
  readonly nodePath: string;
  constructor(nodePath: string, what: string) {
    super(`${nodePath} is ${what}, not a regular file; refused`);
    this.nodePath = nodePath;
  }
}

export class NotDirectoryError extends Error {
  override name = "NotDirectoryError";
  readonly permanent = true;
  readonly nodePath: string;
  constructor(nodePath: string) {
    super(`${nodePath} exists and is not a directory`);
    this.nodePath = nodePath;
  }
}

export class UntrustedDirectoryError extends Error {
  override name = "UntrustedDirectoryError";
  readonly permanent = true;
  readonly nodePath: string;
  constructor(nodePath: string, st: Stats) {
    super(
      `${nodePath} can be written by others (owner uid ${st.uid}, mode ${(st.mode & 0o7777).toString(8).padStart(4, "0")}); refused: a program the agent runs as root is only handed paths that root alone controls`,
    );
    this.nodePath = nodePath;
  }
}

/**
 * The kernel said no (EACCES, EPERM): a node path the agent cannot read or change as this
 * user. The message names the real path and what was tried, and when the agent is not root,
 * the fix; never retried (waiting does not grant permissions).
 */
export class AccessDeniedError extends Error {
  override name = "AccessDeniedError";
  readonly permanent = true;
  readonly code: string;
  readonly realPath: string;
  constructor(op: string, realPath: string, code: string) {
    const why = code === "EPERM" ? "operation not permitted" : "permission denied";
    const fix = EUID === 0 ? "" : `; this is uid ${EUID}, not root: run it with sudo`;
    super(`cannot ${op} ${realPath}: ${why} (${code})${fix}`);
    this.code = code;
    this.realPath = realPath;
  }
}

export class TooLargeError extends Error {
  override name = "TooLargeError";
  readonly permanent = true;
}

export interface FileStat {
  mode: number;
  uid: number;
  gid: number;
  size: number;
  nlink: number;
  mtimeMs: number;
  isFile: boolean;
  isDirectory: boolean;
  isSymlink: boolean;
}

export interface Ownership {
  mode: number;
  uid?: number;
  gid?: number;
}

const toStat = (s: Stats): FileStat => ({
  mode: s.mode & 0o7777,
  uid: s.uid,
  gid: s.gid,
  size: s.size,
  nlink: s.nlink,
  mtimeMs: s.mtimeMs,
  isFile: s.isFile(),
  isDirectory: s.isDirectory(),
  isSymlink: s.isSymbolicLink(),
});

function kindOf(s: Stats): string {
  if (s.isDirectory()) return "a directory";
  if (s.isSymbolicLink()) return "a symbolic link";
  if (s.isFIFO()) return "a FIFO";
  if (s.isSocket()) return "a socket";
  if (s.isCharacterDevice() || s.isBlockDevice()) return "a device";
  return "not a regular file";
}

const EUID = process.geteuid?.() ?? 0;
const isTrusted = (s: Stats) => (s.uid === 0 || s.uid === EUID) && (s.mode & 0o022) === 0;

const code = (err: unknown) => (err as NodeJS.ErrnoException).code;

/** Splits an absolute node path into components; refuses `..` (node paths name things, they do not climb). */
export function components(nodePath: string): string[] {
  if (!path.posix.isAbsolute(nodePath)) throw new Error(`node paths are absolute, got '${nodePath}'`);
  const parts = nodePath.split("/").filter((p) => p !== "" && p !== ".");
  if (parts.includes("..")) throw new Error(`node path '${nodePath}' contains '..'; refused`);
  return parts;
}

/** An open directory inside the root; `at(name)` names an entry relative to it. */
export class Dir {
  readonly fh: FileHandle;
  readonly nodePath: string;
  readonly stat: Stats;
  constructor(fh: FileHandle, nodePath: string, stat: Stats) {
    this.fh = fh;
    this.nodePath = nodePath;
    this.stat = stat;
  }
  at(name: string): string {
    return `/proc/self/fd/${this.fh.fd}/${name}`;
  }
  /** Only root (or the agent's own user, in a sandbox run unprivileged) can create or replace entries here. */
  get trusted(): boolean {
    return isTrusted(this.stat);
  }
  close(): Promise<void> {
    return this.fh.close();
  }
}

export interface OpenDirOptions {
  /** Create missing directories (root-owned, 0755 unless `last` says otherwise for the final one). */
  create?: boolean;
  /** Mode and owner for the final directory when it is created. */
  last?: Ownership;
  /**
   * Refuse (UntrustedDirectoryError) any directory on the way, the root included, that someone
   * other than root can write: a path string handed to a program is resolved again by it, so
   * nobody else may be able to swap anything along it.
   */
  trustedOnly?: boolean;
}

export class ConfinedFs {
  readonly root: string;

  constructor(root: string) {
    this.root = path.resolve(root);
  }

  /** Runs one operation on nodePath; EACCES/EPERM become an AccessDeniedError naming the real path. */
  private async named<T>(op: string, nodePath: string, fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (err) {
      const c = code(err);
      if (err instanceof AccessDeniedError || (c !== "EACCES" && c !== "EPERM")) throw err;
      throw new AccessDeniedError(op, path.join(this.root, nodePath), c);
    }
  }

  private async openRoot(): Promise<Dir> {
    const fh = await open(this.root, C.O_RDONLY | C.O_DIRECTORY);
    return new Dir(fh, "/", await fh.stat());
  }

  /**
   * Opens the directory at `nodePath` by walking from the root without following links (except
   * SYSTEM_LINKS, inside the root). Returns undefined when a component is missing and `create`
   * is not set.
   */
  async openDir(nodePath: string, o: OpenDirOptions = {}): Promise<Dir | undefined> {
    return this.named("open the directory", nodePath, async () => {
      let queue = components(nodePath);
      let cur = await this.openRoot();
      let hops = 0;
      try {
        if (o.trustedOnly && !cur.trusted) throw new UntrustedDirectoryError("/", cur.stat);
        while (queue.length > 0) {
          const name = queue.shift() as string;
          const here = path.posix.join(cur.nodePath, name);
          const isLast = queue.length === 0;
          let fh: FileHandle | undefined;
          try {
            fh = await open(cur.at(name), C.O_RDONLY | C.O_DIRECTORY | C.O_NOFOLLOW);
          } catch (err) {
            const c = code(err);
            if (c === "ENOENT") {
              if (!o.create) {
                await cur.close();
                return undefined;
              }
              const own = isLast && o.last ? o.last : { mode: 0o755 };
              try {
                await mkdirPath(cur.at(name), own.mode);
              } catch (e) {
                if (code(e) !== "EEXIST") throw e;
              }
              fh = await open(cur.at(name), C.O_RDONLY | C.O_DIRECTORY | C.O_NOFOLLOW);
              await fh.chmod(own.mode);
              if (own.uid !== undefined || own.gid !== undefined) await fh.chown(own.uid ?? 0, own.gid ?? 0);
            } else if (c === "ELOOP" || c === "ENOTDIR") {
              const st = await lstatPath(cur.at(name));
              if (!st.isSymbolicLink()) throw new NotDirectoryError(here);
              const target = await readlink(cur.at(name));
              if (!SYSTEM_LINKS.has(here) || st.uid !== 0 || !cur.trusted) {
                throw new LinkRefusedError(here, target);
              }
              if (++hops > MAX_LINK_HOPS) throw new LinkRefusedError(here, target, "too many levels of links");
              // Resolve inside the root, lexically, as a chroot would: absolute targets start at
              // the root, relative ones at the link's directory; ".." never climbs above the root.
              const resolved = path.posix.normalize(path.posix.join(target.startsWith("/") ? "/" : cur.nodePath, target));
              queue = [...components(resolved === "" ? "/" : resolved), ...queue];
              await cur.close();
              cur = await this.openRoot();
              continue;
            } else {
              throw err;
            }
          }
          const st = await fh.stat();
          await cur.close();
          cur = new Dir(fh, here, st);
          if (o.trustedOnly && !cur.trusted) throw new UntrustedDirectoryError(here, st);
        }
        return cur;
      } catch (err) {
        await cur.close().catch(() => undefined);
        throw err;
      }
    });
  }

  /** Runs fn with the parent directory of nodePath open; undefined when the parent is missing. */
  async withParent<T>(
    nodePath: string,
    o: OpenDirOptions,
    fn: (dir: Dir, name: string) => Promise<T>,
  ): Promise<T | undefined> {
    const parts = components(nodePath);
    const name = parts.pop();
    if (!name) throw new Error(`'${nodePath}' names the root itself`);
    const dir = await this.openDir(`/${parts.join("/")}`, o);
    if (!dir) return undefined;
    try {
      return await fn(dir, name);
    } finally {
      await dir.close();
    }
  }

  /** lstat of the final component (links are reported, not followed). */
  async lstat(nodePath: string): Promise<FileStat | undefined> {
    return this.named("look at", nodePath, async () => {
      if (components(nodePath).length === 0) return toStat(await lstatPath(this.root));
      return this.withParent(nodePath, {}, async (dir, name) => {
        try {
          return toStat(await lstatPath(dir.at(name)));
        } catch (err) {
          if (code(err) === "ENOENT") return undefined;
          throw err;
        }
      });
    });
  }

  /** Where a link at nodePath points (for messages), or undefined when it is not a link. */
  async readLink(nodePath: string): Promise<string | undefined> {
    return this.named("read the link", nodePath, async () => {
      return this.withParent(nodePath, {}, async (dir, name) => {
        try {
          return await readlink(dir.at(name));
        } catch (err) {
          if (code(err) === "ENOENT" || code(err) === "EINVAL") return undefined;
          throw err;
        }
      });
    });
  }

  /**
   * Opens a regular file for reading without following a link at any component. A FIFO,
   * device or socket is refused without blocking on it; so is a file with other hard links in
   * a directory someone else can write (it may be a link to a file the agent must not show).
   */
  async openFile(nodePath: string): Promise<{ fh: FileHandle; stat: Stats } | undefined> {
    return this.named("read", nodePath, async () => {
      return this.withParent(nodePath, {}, async (dir, name) => {
        let fh: FileHandle;
        try {
          fh = await open(dir.at(name), C.O_RDONLY | C.O_NOFOLLOW | C.O_NONBLOCK | C.O_NOCTTY);
        } catch (err) {
          const c = code(err);
          if (c === "ENOENT") return undefined;
          if (c === "ELOOP")
            throw new LinkRefusedError(path.posix.join(dir.nodePath, name), await readlink(dir.at(name)));
          throw err;
        }
        const stat = await fh.stat();
        const here = path.posix.join(dir.nodePath, name);
        if (!stat.isFile()) {
          await fh.close();
          throw new NotRegularFileError(here, kindOf(stat));
        }
        if (stat.nlink > 1 && !dir.trusted) {
          await fh.close();
          throw new NotRegularFileError(
            here,
            `a file with ${stat.nlink} hard links in a directory another user can write`,
          );
        }
        return { fh, stat };
      });
    });
  }

  /** Whole file, at most maxBytes (TooLargeError beyond). undefined when absent. */
  async readFile(nodePath: string, maxBytes = 64 * 1024 * 1024): Promise<Buffer | undefined> {
    return this.named("read", nodePath, async () => {
      const f = await this.openFile(nodePath);
      if (!f) return undefined;
      try {
        if (f.stat.size > maxBytes)
          throw new TooLargeError(`${nodePath} is ${f.stat.size} bytes; at most ${maxBytes} read`);
        const chunks: Buffer[] = [];
        let total = 0;
        const buf = Buffer.alloc(Math.min(Math.max(f.stat.size, 4096), 1 << 20));
        for (;;) {
          const { bytesRead } = await f.fh.read(buf, 0, buf.length, null);
          if (bytesRead === 0) break;
          total += bytesRead;
          if (total > maxBytes) throw new TooLargeError(`${nodePath} is over ${maxBytes} bytes`);
          chunks.push(Buffer.from(buf.subarray(0, bytesRead)));
        }
        return Buffer.concat(chunks);
      } finally {
        await f.fh.close();
      }
    });
  }

  async listDir(nodePath: string): Promise<string[]> {
    return this.named("list", nodePath, async () => {
      const dir = await this.openDir(nodePath);
      if (!dir) return [];
      try {
        return (await readdir(dir.at("."))).sort();
      } finally {
        await dir.close();
      }
    });
  }

  /** mkdir -p; the final directory gets exactly `own` (mode, owner), set through its descriptor. */
  async mkdir(nodePath: string, own: Ownership): Promise<void> {
    return this.named("create the directory", nodePath, async () => {
      const dir = await this.openDir(nodePath, { create: true, last: own });
      if (!dir) throw new Error(`could not create ${nodePath}`);
      try {
        if ((dir.stat.mode & 0o7777) !== own.mode) await dir.fh.chmod(own.mode);
        const uid = own.uid ?? 0;
        const gid = own.gid ?? 0;
        if (dir.stat.uid !== uid || dir.stat.gid !== gid) await dir.fh.chown(uid, gid);
      } finally {
        await dir.close();
      }
    });
  }

  /**
   * Atomic write: a new file (O_EXCL, O_NOFOLLOW) beside the target, mode and owner set on its
   * descriptor, fsync, then renamed over the target and the directory fsynced. The target is
   * never written in place, so a hard link or a symlink at its name is replaced, not followed;
   * a symlink there is refused unless `replaceLink`. `check` sees the finished temp file's real
   * path (for validation by the program that will read it) before the rename.
   */
  async writeAtomic(
    nodePath: string,
    source: Iterable<Uint8Array> | AsyncIterable<Uint8Array>,
    own: Ownership,
    o: { check?: (tempPath: string) => Promise<void>; createParents?: boolean } = {},
  ): Promise<void> {
    return this.named("write", nodePath, async () => {
      const done = await this.withParent(nodePath, { create: o.createParents ?? true }, async (dir, name) => {
        const existing = await lstatPath(dir.at(name)).catch((e) => {
          if (code(e) === "ENOENT") return undefined;
          throw e;
        });
        if (existing?.isSymbolicLink()) {
          throw new LinkRefusedError(path.posix.join(dir.nodePath, name), await readlink(dir.at(name)));
        }
        if (existing?.isDirectory()) throw new NotRegularFileError(path.posix.join(dir.nodePath, name), "a directory");
        const real = path.join(this.root, dir.nodePath);
        await writeAtomic(dir.at(""), name, source, {
          ...own,
          // The program that checks the candidate gets its real path (under the walked directory).
          ...(o.check
            ? { check: (tmp: string) => (o.check as (p: string) => Promise<void>)(path.join(real, path.basename(tmp))) }
            : {}),
        });
        return true;
      });
      if (!done) throw new Error(`${path.posix.dirname(nodePath)} does not exist`);
    });
  }

  /** Appends (logs only: not atomic). The file is never reached through a link. */
  async append(nodePath: string, text: string): Promise<void> {
    return this.named("append to", nodePath, async () => {
      await this.withParent(nodePath, { create: true }, async (dir, name) => {
        const fh = await open(dir.at(name), C.O_WRONLY | C.O_CREAT | C.O_APPEND | C.O_NOFOLLOW, 0o640);
        try {
          await fh.write(text);
        } finally {
          await fh.close();
        }
      });
    });
  }

  /** Sets mode and owner of an existing directory (through its descriptor). */
  async chmodDir(nodePath: string, own: Ownership): Promise<void> {
    return this.named("set mode and owner of", nodePath, async () => {
      const dir = await this.openDir(nodePath);
      if (!dir) throw new Error(`${nodePath} does not exist`);
      try {
        await dir.fh.chmod(own.mode);
        if (own.uid !== undefined || own.gid !== undefined) await dir.fh.chown(own.uid ?? 0, own.gid ?? 0);
      } finally {
        await dir.close();
      }
    });
  }

  /** Creates or replaces a symlink (the link itself; its target is not touched). */
  async symlink(nodePath: string, target: string): Promise<void> {
    return this.named("create the link", nodePath, async () => {
      const { symlink } = await import("node:fs/promises");
      await this.withParent(nodePath, { create: true }, async (dir, name) => {
        const tmp = `.${name}.bashible-${randomBytes(4).toString("hex")}`;
        await symlink(target, dir.at(tmp));
        await renamePath(dir.at(tmp), dir.at(name));
        await dir.fh.sync();
      });
    });
  }

  /**
   * Removes a file, link or (recursive) directory tree. A link is removed, never followed.
   * Recursive removal is only done under directories only root can write, where nobody can
   * swap a component while the tree is walked.
   */
  async remove(nodePath: string, o: { recursive?: boolean } = {}): Promise<void> {
    return this.named("remove", nodePath, async () => {
      await this.withParent(nodePath, {}, async (dir, name) => {
        const st = await lstatPath(dir.at(name)).catch((e) => {
          if (code(e) === "ENOENT") return undefined;
          throw e;
        });
        if (!st) return;
        if (!st.isDirectory()) return unlinkPath(dir.at(name));
        if (!o.recursive) throw new Error(`${nodePath} is a directory; not removed without recursive`);
        const inner = path.posix.join(dir.nodePath, name);
        if (!dir.trusted || st.uid !== 0 || (st.mode & 0o022) !== 0) {
          throw new Error(`${inner}: not removing a tree another user can write into`);
        }
        await rmPath(dir.at(name), { recursive: true, force: true });
      });
    });
  }

  /**
   * The real path of nodePath for programs the agent runs (tar -C, useradd --prefix), after
   * checking no component is a link and no directory on the way can be written by anyone but
   * root: the program resolves the string again later, so only places root alone controls.
   */
  async realPath(nodePath: string): Promise<string> {
    return this.named("resolve", nodePath, async () => {
      const parts = components(nodePath);
      const last = parts.pop();
      if (last === undefined) return this.root;
      const dir = await this.openDir(`/${parts.join("/")}`, { trustedOnly: true });
      // A missing parent: nothing to be redirected through yet; the program creates it.
      if (!dir) return path.join(this.root, ...parts, last);
      try {
        const st = await lstatPath(dir.at(last)).catch(() => undefined);
        if (st?.isSymbolicLink()) throw new LinkRefusedError(nodePath, await readlink(dir.at(last)));
        if (st?.isDirectory() && !isTrusted(st)) throw new UntrustedDirectoryError(nodePath, st);
        // dir.nodePath is where the walk really ended (system links resolved inside the root).
        return path.join(this.root, dir.nodePath, last);
      } finally {
        await dir.close();
      }
    });
  }
}
