// An exclusive lock on a file, shared by every process on the machine (flock(1) from util-linux),
// held for as long as the caller needs it. The lock belongs to a small child process whose stdin
// is a pipe from this one: releasing closes the pipe, and so does this process dying in any way
// (SIGKILL included), so a killed test never leaves a lock behind for the next run to wait on.
import { spawn } from "node:child_process";

export interface HeldLock {
  /** Releases the lock (idempotent). */
  release(): Promise<void>;
}

/**
 * Waits until `file` (created if missing) is locked for this process, at most `timeoutMs`.
 * `what` names the lock in the error ("the VM boot lock").
 */
export async function acquireLock(file: string, what: string, timeoutMs = 600_000): Promise<HeldLock> {
  // `cat` keeps the command (and with it flock's descriptor) alive until stdin closes.
  const child = spawn("flock", ["-x", file, "sh", "-c", "echo locked && exec cat >/dev/null"], {
    stdio: ["pipe", "pipe", "pipe"],
  });
  let stderr = "";
  child.stderr.on("data", (d: Buffer) => (stderr += d));
  const exited = new Promise<number | null>((resolve) => child.once("close", (code) => resolve(code)));
  const locked = await new Promise<boolean>((resolve, reject) => {
    const timer = setTimeout(() => resolve(false), timeoutMs);
    child.once("error", (err) => {
      clearTimeout(timer);
      reject(new Error(`cannot take ${what} (${file}): ${err.message}; flock comes with util-linux`));
    });
    child.stdout.on("data", (d: Buffer) => {
      if (d.toString().includes("locked")) {
        clearTimeout(timer);
        resolve(true);
      }
    });
    void exited.then(() => {
      clearTimeout(timer);
      resolve(false);
    });
  });
  if (!locked) {
    child.kill("SIGKILL");
    await exited;
    throw new Error(
      `${what} (${file}) not acquired within ${Math.round(timeoutMs / 1000)} s${stderr ? `: ${stderr.trim()}` : ""}; another process holds it (fuser ${file})`,
    );
  }
  let released: Promise<void> | undefined;
  return {
    release() {
      released ??= (async () => {
        child.stdin.end();
        await exited;
      })();
      return released;
    },
  };
}

/** Runs `fn` while holding the lock on `file`. */
export async function withLock<T>(file: string, what: string, fn: () => Promise<T>, timeoutMs?: number): Promise<T> {
  const lock = await acquireLock(file, what, timeoutMs);
  try {
    return await fn();
  } finally {
    await lock.release();
  }
}
