// The one atomic file write: a new file (O_EXCL, O_NOFOLLOW) beside the target, written,
// mode and owner set on its descriptor, fsynced, optionally checked, renamed over the target,
// and the directory fsynced. A crash leaves the old file or the new one, never a torn one; a
// source that throws (a failed digest check) leaves the target untouched and no temp file.
// `dir` may be a /proc/self/fd/N path (the agent's confined walk) or a plain directory.
import { constants as C } from "node:fs";
import { open, readdir, rename, unlink } from "node:fs/promises";
import { randomBytes } from "node:crypto";
import path from "node:path";

export interface AtomicOptions {
  mode: number;
  uid?: number;
  gid?: number;
  /** Sees the finished temp file before the rename; throwing keeps the old file. */
  check?: (tempPath: string) => Promise<void>;
}

/** Temp files of writes a crash interrupted carry this prefix; the next write sweeps them. */
export const tempPrefix = (name: string) => `.${name}.bashible-`;

export async function writeAtomic(
  dir: string,
  name: string,
  source: Iterable<Uint8Array> | AsyncIterable<Uint8Array>,
  o: AtomicOptions,
): Promise<void> {
  const prefix = tempPrefix(name);
  for (const entry of await readdir(dir)) {
    if (entry.startsWith(prefix)) await unlink(path.join(dir, entry)).catch(() => undefined);
  }
  const tmp = path.join(dir, `${prefix}${randomBytes(4).toString("hex")}`);
  const fh = await open(tmp, C.O_WRONLY | C.O_CREAT | C.O_EXCL | C.O_NOFOLLOW, 0o600);
  try {
    for await (const chunk of source) await fh.write(chunk);
    await fh.chmod(o.mode);
    if (o.uid !== undefined || o.gid !== undefined) await fh.chown(o.uid ?? 0, o.gid ?? 0);
    await fh.sync();
    await fh.close();
    if (o.check) await o.check(tmp);
  } catch (err) {
    await fh.close().catch(() => undefined);
    await unlink(tmp).catch(() => undefined);
    throw err;
  }
  await rename(tmp, path.join(dir, name));
  await fsyncDir(dir);
}

/** fsync a directory, so a rename in it survives a crash. */
export async function fsyncDir(dir: string): Promise<void> {
  const fh = await open(dir, C.O_RDONLY | C.O_DIRECTORY);
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}
