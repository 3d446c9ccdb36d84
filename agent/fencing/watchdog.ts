// The watchdog device: open arms it, each written byte pets it, 'V' then close disarms it
// (the "magic close"). Node has no ioctl, so the timeout and the time left are read from sysfs
// (/sys/class/watchdog/watchdogN/{identity,timeout,timeleft}) where the kernel exposes them; a
// FIFO or a regular file stands in for the device in tests and gets the same bytes.
//
// Writes are synchronous on an O_NONBLOCK descriptor: a pet is one byte to a character device
// and must never wait behind the libuv thread pool. Node opens every descriptor O_CLOEXEC, so
// the converge child never inherits the device (a child holding it open would keep it armed
// after the agent closed it).
import { closeSync, constants, open as fsOpen, writeSync } from "node:fs";
import { readFile, stat } from "node:fs/promises";
import path from "node:path";

export interface WatchdogInfo {
  /** The driver's name (sysfs `identity`), e.g. "Software Watchdog". */
  identity?: string;
  /** Seconds from the last pet to the reset or panic (sysfs `timeout`). */
  timeoutSeconds?: number;
  /** Seconds left right now (sysfs `timeleft`; softdog does not expose it). */
  timeLeftSeconds?: number;
  /** Where the figures came from, or why there are none. */
  source: string;
}

/** The sysfs directory of a watchdog device node: /dev/watchdog is watchdog0, /dev/watchdogN is watchdogN. */
export function sysfsDirFor(device: string): string {
  const m = /^watchdog(\d*)$/.exec(path.basename(device));
  return `/sys/class/watchdog/watchdog${m?.[1] || "0"}`;
}

const readTrim = (file: string) => readFile(file, "utf8").then((s) => s.trim());

/** Reads what the kernel tells about the device; missing files are reported, not guessed. */
export async function readWatchdogInfo(sysRoot: string, device: string): Promise<WatchdogInfo> {
  const dir = path.join(sysRoot, sysfsDirFor(device));
  const [identity, timeout, timeleft] = await Promise.all(
    ["identity", "timeout", "timeleft"].map((f) => readTrim(path.join(dir, f)).catch(() => undefined)),
  );
  const num = (s: string | undefined) => (s !== undefined && /^\d+$/.test(s) ? Number(s) : undefined);
  if (identity === undefined && timeout === undefined)
    return { source: `${dir} not readable (no sysfs watchdog class here; the timeout is the driver's setting)` };
  return { identity, timeoutSeconds: num(timeout), timeLeftSeconds: num(timeleft), source: dir };
}

export class WatchdogError extends Error {
  override name = "WatchdogError";
}

export class Watchdog {
  readonly device: string;
  private fd: number | undefined;
  private pets = 0;

  constructor(device: string) {
    this.device = device;
  }

  get isOpen(): boolean {
    return this.fd !== undefined;
  }

  get petCount(): number {
    return this.pets;
  }

  /**
   * Opens the device, which arms it (and, for an already running watchdog, counts as a pet).
   * Refuses anything but a character device, a FIFO or a regular file, and never creates one:
   * a missing /dev/watchdog must stay an error, not become a file that protects nothing.
   */
  async arm(): Promise<void> {
    if (this.fd !== undefined) return;
    const st = await stat(this.device).catch((err: NodeJS.ErrnoException) => {
      throw new WatchdogError(`watchdog device ${this.device}: ${err.code ?? err.message}`);
    });
    if (!st.isCharacterDevice() && !st.isFIFO() && !st.isFile())
      throw new WatchdogError(`watchdog device ${this.device} is not a character device`);
    // The callback open runs on the thread pool (a FIFO without a reader fails with ENXIO
    // instead of blocking) and yields a plain descriptor that pets can write synchronously.
    this.fd = await new Promise<number>((resolve, reject) =>
      fsOpen(this.device, constants.O_WRONLY | constants.O_NONBLOCK, (err, fd) => {
        if (!err) return resolve(fd);
        const why = err.code === "EBUSY" ? "another process holds it (EBUSY)" : (err.code ?? err.message);
        reject(new WatchdogError(`cannot open watchdog device ${this.device}: ${why}`));
      }),
    );
  }

  /** One pet: a byte written. Throws when the write fails (the caller reports and disarms). */
  pet(): void {
    if (this.fd === undefined) throw new WatchdogError("watchdog is not armed");
    try {
      writeSync(this.fd, "1");
      this.pets++;
    } catch (err) {
      throw new WatchdogError(`petting ${this.device} failed: ${(err as NodeJS.ErrnoException).code ?? err}`);
    }
  }

  /** The magic close: 'V' then close, so the driver stops the timer. Safe to call twice. */
  disarm(): void {
    const fd = this.fd;
    if (fd === undefined) return;
    this.fd = undefined;
    try {
      writeSync(fd, "V");
    } finally {
      this.closeFd(fd);
    }
  }

  /**
   * Closes without 'V': the timer keeps running and fires unless someone opens the device
   * again. Only for a process that is going down while the node is being fenced.
   */
  release(): void {
    const fd = this.fd;
    if (fd === undefined) return;
    this.fd = undefined;
    this.closeFd(fd);
  }

  private closeFd(fd: number): void {
    try {
      closeSync(fd);
    } catch {
      // already closed: nothing left to release
    }
  }
}
