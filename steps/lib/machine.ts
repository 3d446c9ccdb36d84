// What the machine has, as the steps size things from it: the kernel's view (memory, cgroup
// version, filesystems), so the same under a sandbox tree as on the host it lives on.
import os from "node:os";
import { existsSync } from "node:fs";
import { statfs } from "node:fs/promises";
import path from "node:path";
import type { FsSize } from "./kubelet-sizing.ts";

export const cgroupV1 = () => !existsSync("/sys/fs/cgroup/cgroup.controllers");

export const memoryBytes = () => os.totalmem();

/**
 * The filesystem a directory is (or will be) on, as `df --output=size,itotal` reports it: the
 * directory itself, or its nearest existing parent (the kubelet's root dir does not exist before
 * the first run). `real` is a path on this machine (host.path of a node path).
 */
export async function fsSizeOf(real: string): Promise<FsSize | undefined> {
  for (let p = path.resolve(real); ; p = path.dirname(p)) {
    try {
      const s = await statfs(p);
      return { sizeKiB: Math.floor((s.blocks * s.bsize) / 1024), inodes: s.files };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "ENOENT" || p === "/") return undefined;
    }
  }
}
