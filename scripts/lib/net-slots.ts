// The /30 networks of the test machines (nspawn nodes, QEMU VMs): each machine takes a slot of
// its pool, a file <stateDir>/net/<slot> made exclusively (the file names its owner's pid), so
// concurrent test processes never hand out one address twice; a slot whose owner died is freed
// by the next reap.
import { randomBytes } from "node:crypto";
import { closeSync, openSync, writeSync } from "node:fs";
import { mkdir, readdir, readFile, unlink } from "node:fs/promises";
import path from "node:path";

export interface SlotPool {
  /** The machines' state directory: slots are under its net/. */
  stateDir: string;
  /** The first two octets of the pool's /16. */
  prefix: string;
  /** Who takes slots, for the error when none is left. */
  owner: string;
}

/** 16384 /30s in a /16. */
const SLOTS = 16384;

/** The file that holds the slot. */
export const slotFile = (pool: SlotPool, slot: number) => path.join(pool.stateDir, "net", String(slot));

export async function takeSlot(pool: SlotPool, name: string): Promise<number> {
  await mkdir(path.join(pool.stateDir, "net"), { recursive: true });
  const start = randomBytes(2).readUInt16BE() % SLOTS;
  for (let i = 0; i < SLOTS; i++) {
    const slot = (start + i) % SLOTS;
    try {
      const fd = openSync(slotFile(pool, slot), "wx");
      writeSync(fd, `${process.pid} ${name}\n`);
      closeSync(fd);
      return slot;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
    }
  }
  throw new Error(`${pool.owner}: no free network slot`);
}

/** The slot's two addresses: the host's end (.1 of the /30) and the machine's (.2). */
export function slotAddresses(pool: SlotPool, slot: number): { host: string; machine: string } {
  const base = slot * 4;
  const third = Math.floor(base / 256);
  const fourth = base % 256;
  return { host: `${pool.prefix}.${third}.${fourth + 1}`, machine: `${pool.prefix}.${third}.${fourth + 2}` };
}

/** Frees the slots whose owner is not `alive` (a crash between taking the slot and using it). */
export async function reapSlots(pool: SlotPool, alive: (pid: number) => boolean): Promise<void> {
  const dir = path.join(pool.stateDir, "net");
  for (const slot of await readdir(dir).catch(() => [] as string[])) {
    const p = path.join(dir, slot);
    const owner = Number((await readFile(p, "utf8").catch(() => "")).split(" ")[0]);
    if (!owner || !alive(owner)) await unlink(p).catch(() => undefined);
  }
}
