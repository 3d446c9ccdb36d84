// One converge at a time: an exclusive lock file holding the owner's pid and start time.
// A lock left by a killed process is recognised (owner gone) and taken over, so SIGKILL never
// wedges the node.
import { link, open, readFile, rename, unlink } from "node:fs/promises";
import { randomBytes } from "node:crypto";
import path from "node:path";
import { mkdir } from "node:fs/promises";

export class LockedError extends Error {
  override name = "LockedError";
}

async function startTime(pid: number): Promise<string | undefined> {
  const stat = await readFile(`/proc/${pid}/stat`, "utf8").catch(() => undefined);
  // Field 22 (starttime) after the ")" that closes the command name.
  return stat?.slice(stat.lastIndexOf(")") + 2).split(" ")[19];
}

async function ownerAlive(content: string): Promise<boolean> {
  const [pidText, started] = content.trim().split(" ");
  const pid = Number(pidText);
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
  return !started || (await startTime(pid)) === started;
}

/** Takes the lock at `file` (a real path) or throws LockedError naming the holder. */
export async function acquireLock(file: string): Promise<() => Promise<void>> {
  await mkdir(path.dirname(file), { recursive: true });
  const me = `${process.pid} ${(await startTime(process.pid)) ?? ""}\n`;
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      const fh = await open(file, "wx", 0o644);
      await fh.writeFile(me);
      await fh.close();
      return async () => {
        const current = await readFile(file, "utf8").catch(() => "");
        if (current === me) await unlink(file).catch(() => undefined);
      };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
    }
    const holder = await readFile(file, "utf8").catch(() => "");
    if (await ownerAlive(holder)) {
      throw new LockedError(`another converge holds ${file} (pid ${holder.split(" ")[0]}); not starting a second one`);
    }
    // Stale: move it aside atomically; if what we moved turns out to be a fresh lock someone
    // else just took, put it back and give up.
    const aside = `${file}.stale-${randomBytes(4).toString("hex")}`;
    try {
      await rename(file, aside);
    } catch {
      continue;
    }
    const moved = await readFile(aside, "utf8").catch(() => "");
    if (moved !== holder && (await ownerAlive(moved))) {
      await link(aside, file).catch(() => undefined);
      await unlink(aside).catch(() => undefined);
      throw new LockedError(`another converge took ${file} meanwhile; not starting a second one`);
    }
    await unlink(aside).catch(() => undefined);
  }
  throw new LockedError(`could not take ${file}`);
}
