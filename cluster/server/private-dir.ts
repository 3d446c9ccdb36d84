// Where `bashible server --standalone` keeps its CA key: a directory only this user can reach,
// reached only through directories nobody else can change. A CA key anyone can read mints
// system:masters certificates; a directory or link someone else planted where the server
// writes would hand them the key, or have root write its files wherever the link points.
import { lstat, mkdir, realpath } from "node:fs/promises";
import os from "node:os";
import path from "node:path";

/** systemd's StateDirectory= for the unit, else a root-only place (root) or the user's state dir. */
export function defaultStateDir(
  env: NodeJS.ProcessEnv = process.env,
  uid = process.geteuid?.() ?? 0,
  home = os.homedir(),
): string {
  const systemd = env.STATE_DIRECTORY?.split(":")[0];
  if (systemd) return path.join(systemd, "certs");
  if (uid === 0) return "/var/lib/bashible-server";
  return path.join(env.XDG_STATE_HOME || path.join(home, ".local/state"), "bashible-server");
}

/** The directory is not safe to keep secrets in; nothing was written. */
export class UnsafeDirectoryError extends Error {
  override name = "UnsafeDirectoryError";
}

const octal = (mode: number) => (mode & 0o7777).toString(8).padStart(4, "0");

/**
 * Checks one existing path component: a directory or link owned by root or this user, inside a
 * directory others cannot change (or sticky: they cannot rename what is not theirs).
 */
async function checkComponent(p: string, parentMode: number, uid: number): Promise<"dir" | "link"> {
  const st = await lstat(p);
  if (st.uid !== 0 && st.uid !== uid) {
    throw new UnsafeDirectoryError(`${p} is owned by uid ${st.uid}, not by root or this user (uid ${uid})`);
  }
  if ((parentMode & 0o022) !== 0 && (parentMode & 0o1000) === 0) {
    throw new UnsafeDirectoryError(
      `${path.dirname(p)} (mode ${octal(parentMode)}) lets others replace ${path.basename(p)}`,
    );
  }
  if (st.isSymbolicLink()) return "link";
  if (!st.isDirectory()) throw new UnsafeDirectoryError(`${p} is not a directory`);
  return "dir";
}

/**
 * Walks `dir`'s parents from `/`, creating the missing ones (0700), following only links that
 * root or this user owns (and checking their targets the same way). Returns the real parent.
 */
async function trustedParent(dir: string, uid: number, depth = 0): Promise<string> {
  if (depth > 8) throw new UnsafeDirectoryError(`too many links on the way to ${dir}`);
  let cur = "/";
  let curMode = (await lstat("/")).mode;
  for (const part of path.dirname(dir).split(path.sep).filter(Boolean)) {
    const next = path.join(cur, part);
    const kind = await checkComponent(next, curMode, uid).catch(async (err: NodeJS.ErrnoException) => {
      if (err.code !== "ENOENT") throw err;
      await mkdir(next, { mode: 0o700 });
      return checkComponent(next, curMode, uid);
    });
    if (kind === "link") {
      // A system link (/var/run → /run): its target's own way down is checked the same way.
      const target = await realpath(next);
      await trustedParent(path.join(target, "child"), uid, depth + 1);
      cur = target;
    } else cur = next;
    curMode = (await lstat(cur)).mode;
  }
  return cur;
}

/**
 * Makes sure `dir` is a directory this user owns that nobody else can read, write or swap, and
 * returns its absolute path; creates it (0700) when missing. Throws UnsafeDirectoryError naming
 * what is wrong and the fix.
 */
export async function privateDirectory(dir: string): Promise<string> {
  const uid = process.geteuid?.() ?? 0;
  const abs = path.resolve(dir);
  const parent = await trustedParent(abs, uid);
  const real = path.join(parent, path.basename(abs));
  const parentMode = (await lstat(parent)).mode;
  await mkdir(real, { mode: 0o700 }).catch((err: NodeJS.ErrnoException) => {
    if (err.code !== "EEXIST") throw err;
  });
  const st = await lstat(real);
  if (st.isSymbolicLink()) throw new UnsafeDirectoryError(`${abs} is a link; give a real directory`);
  await checkComponent(real, parentMode, uid);
  if (st.uid !== uid) {
    throw new UnsafeDirectoryError(`${abs} is owned by uid ${st.uid}; it must be this user's (uid ${uid})`);
  }
  if ((st.mode & 0o077) !== 0) {
    throw new UnsafeDirectoryError(
      `${abs} has mode ${octal(st.mode)}: others could read or change the CA key kept there; chmod 700 it (or give another --cert-dir)`,
    );
  }
  return real;
}
