// Killing a whole pod: every task in its cgroup and every cgroup below (the containers, the
// sandbox). cgroup v2 has cgroup.kill (5.14+), which the kernel applies to the subtree
// atomically, forks included. Elsewhere the tasks are frozen first (v1 freezer, v2
// cgroup.freeze), so none can fork away between listing and signalling, then each gets
// SIGKILL, then the cgroup is thawed so the signals are delivered.
import { existsSync, readdirSync, writeFileSync } from "node:fs";
import path from "node:path";
import { readSmallFile } from "./kernel-files.ts";
import { sleep } from "../../lib/sleep.ts";

export interface KillTarget {
  version: 1 | 2;
  /** The pod's cgroup (v2), or its memory cgroup (v1). */
  memoryDir: string;
  /** v1: the pod's freezer cgroup, when the freezer is mounted. */
  freezerDir?: string;
}

export interface KillResult {
  method: "cgroup.kill" | "freeze+SIGKILL" | "SIGKILL";
  /** Processes found in the pod's cgroups before the kill. */
  pids: number[];
  /** Processes still listed when the timeout ran out (0 = the pod's tasks are gone). */
  remaining: number;
  durationMs: number;
}

function cgroupDirs(dir: string): string[] {
  const out = [dir];
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    if (e.isDirectory()) out.push(...cgroupDirs(path.join(dir, e.name)));
  }
  return out;
}

/** Every process in dir's subtree (cgroup.procs of each cgroup). */
export function subtreePids(dir: string): number[] {
  const pids = new Set<number>();
  let dirsFound: string[];
  try {
    dirsFound = cgroupDirs(dir);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return [];
    throw err;
  }
  for (const d of dirsFound) {
    let text: string;
    try {
      text = readSmallFile(path.join(d, "cgroup.procs"));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") continue; // removed meanwhile
      throw err;
    }
    for (const line of text.split("\n")) {
      const pid = Number(line);
      if (Number.isInteger(pid) && pid > 0) pids.add(pid);
    }
  }
  return [...pids];
}

function sigkill(pids: number[]): void {
  for (const pid of pids) {
    if (pid <= 1 || pid === process.pid) continue;
    try {
      process.kill(pid, "SIGKILL");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "ESRCH") throw err;
    }
  }
}

async function waitFor(check: () => boolean, timeoutMs: number, stepMs = 5): Promise<boolean> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    if (check()) return true;
    if (performance.now() >= deadline) return false;
    await sleep(stepMs);
  }
}

const FREEZE_WAIT_MS = 250;

async function freezeKillThaw(t: KillTarget): Promise<KillResult["method"]> {
  if (t.version === 2) {
    const freeze = path.join(t.memoryDir, "cgroup.freeze");
    if (existsSync(freeze)) {
      writeFileSync(freeze, "1");
      try {
        await waitFor(() => /^frozen 1$/m.test(readSmallFile(path.join(t.memoryDir, "cgroup.events"))), FREEZE_WAIT_MS);
        sigkill(subtreePids(t.memoryDir));
      } finally {
        writeFileSync(freeze, "0");
      }
      return "freeze+SIGKILL";
    }
  } else if (t.freezerDir && existsSync(path.join(t.freezerDir, "freezer.state"))) {
    const state = path.join(t.freezerDir, "freezer.state");
    writeFileSync(state, "FROZEN");
    try {
      // A task in uninterruptible sleep delays FROZEN; signal what is there after a short wait anyway.
      await waitFor(() => readSmallFile(state).trim() === "FROZEN", FREEZE_WAIT_MS);
      sigkill([...new Set([...subtreePids(t.freezerDir), ...subtreePids(t.memoryDir)])]);
    } finally {
      writeFileSync(state, "THAWED");
    }
    return "freeze+SIGKILL";
  }
  // No freezer: signal until nothing is listed, so a task forked meanwhile is caught next round.
  for (let round = 0; round < 20; round++) {
    const pids = subtreePids(t.memoryDir);
    if (!pids.length) break;
    sigkill(pids);
    await sleep(2);
  }
  return "SIGKILL";
}

/** Kills every task of the pod and waits (up to timeoutMs) until none is left in its cgroups. */
export async function killPod(t: KillTarget, timeoutMs: number): Promise<KillResult> {
  const t0 = performance.now();
  const pids = subtreePids(t.memoryDir);
  let method: KillResult["method"];
  const killFile = path.join(t.memoryDir, "cgroup.kill");
  if (t.version === 2 && existsSync(killFile)) {
    writeFileSync(killFile, "1");
    method = "cgroup.kill";
  } else {
    method = await freezeKillThaw(t);
  }
  let remaining = 0;
  await waitFor(
    () => {
      remaining = subtreePids(t.memoryDir).length;
      return remaining === 0;
    },
    timeoutMs,
    2,
  );
  return { method, pids, remaining, durationMs: performance.now() - t0 };
}
