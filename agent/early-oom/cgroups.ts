// Pods as the kernel sees them: the kubelet's cgroup tree. Both cgroup versions (v2: one
// hierarchy at the root; v1: one per controller, the same paths in each), both drivers
// (systemd: kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice;
// cgroupfs: kubepods/burstable/pod<uid>), the QoS class from where the pod sits (Guaranteed
// pods sit directly under kubepods), and each pod's memory use as the kubelet counts it (the
// working set: usage minus inactive file cache).
import { existsSync, readdirSync } from "node:fs";
import path from "node:path";
import { parseFlatKeyed, readSmallFile } from "./kernel-files.ts";
import type { QosClass } from "./pods.ts";

export type CgroupDriver = "systemd" | "cgroupfs";

export interface CgroupLayout {
  version: 1 | 2;
  /** Where the memory controller's hierarchy is (v2: the root itself). */
  memoryRoot: string;
  /** v1: the freezer hierarchy, when mounted. */
  freezerRoot?: string;
}

export interface PodCgroup {
  uid: string;
  qos: QosClass;
  driver: CgroupDriver;
  version: 1 | 2;
  /** Path below the hierarchy root (the same in every v1 hierarchy). */
  rel: string;
  memoryDir: string;
  freezerDir?: string;
  /** memory.current / memory.usage_in_bytes. */
  usage: number;
  /** usage − inactive file cache: what the kubelet ranks by. */
  workingSet: number;
  /** memory.max / memory.limit_in_bytes; undefined when unlimited. */
  limit?: number;
}

export function detectLayout(cgroupRoot: string): CgroupLayout | undefined {
  if (existsSync(path.join(cgroupRoot, "cgroup.controllers"))) return { version: 2, memoryRoot: cgroupRoot };
  const memoryRoot = path.join(cgroupRoot, "memory");
  if (!existsSync(memoryRoot)) return undefined;
  const freezerRoot = path.join(cgroupRoot, "freezer");
  return { version: 1, memoryRoot, freezerRoot: existsSync(freezerRoot) ? freezerRoot : undefined };
}

interface Found {
  uid: string;
  qos: QosClass;
  driver: CgroupDriver;
  rel: string;
}

const SYSTEMD_QOS: Record<string, QosClass> = { burstable: "Burstable", besteffort: "BestEffort" };

function dirs(dir: string): string[] {
  try {
    return readdirSync(dir, { withFileTypes: true })
      .filter((e) => e.isDirectory())
      .map((e) => e.name);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return [];
    throw err;
  }
}

/** The pods' cgroups under one hierarchy root, by name only. */
export function findPodCgroups(memoryRoot: string): Found[] {
  const out: Found[] = [];
  // systemd driver: slices, the pod UID with '-' escaped as '_'.
  const slice = "kubepods.slice";
  for (const d of dirs(path.join(memoryRoot, slice))) {
    const g = /^kubepods-pod([0-9a-fA-F_]+)\.slice$/.exec(d);
    if (g?.[1]) {
      out.push({ uid: g[1].replaceAll("_", "-"), qos: "Guaranteed", driver: "systemd", rel: `${slice}/${d}` });
      continue;
    }
    const q = /^kubepods-(burstable|besteffort)\.slice$/.exec(d);
    if (!q?.[1]) continue;
    for (const p of dirs(path.join(memoryRoot, slice, d))) {
      const m = new RegExp(`^kubepods-${q[1]}-pod([0-9a-fA-F_]+)\\.slice$`).exec(p);
      if (m?.[1])
        out.push({
          uid: m[1].replaceAll("_", "-"),
          qos: SYSTEMD_QOS[q[1]] ?? "Burstable",
          driver: "systemd",
          rel: `${slice}/${d}/${p}`,
        });
    }
  }
  // cgroupfs driver.
  const top = "kubepods";
  for (const d of dirs(path.join(memoryRoot, top))) {
    const g = /^pod([0-9a-fA-F-]+)$/.exec(d);
    if (g?.[1]) {
      out.push({ uid: g[1], qos: "Guaranteed", driver: "cgroupfs", rel: `${top}/${d}` });
      continue;
    }
    const qos = d === "burstable" ? "Burstable" : d === "besteffort" ? "BestEffort" : undefined;
    if (!qos) continue;
    for (const p of dirs(path.join(memoryRoot, top, d))) {
      const m = /^pod([0-9a-fA-F-]+)$/.exec(p);
      if (m?.[1]) out.push({ uid: m[1], qos, driver: "cgroupfs", rel: `${top}/${d}/${p}` });
    }
  }
  return out;
}

function readNumber(file: string): number | undefined {
  const t = readSmallFile(file).trim();
  if (t === "max") return undefined;
  const n = Number(t);
  return Number.isFinite(n) ? n : undefined;
}

/** v1 reports "no limit" as a page-rounded LONG_MAX. */
const UNLIMITED_V1 = 2 ** 62;

/** Every pod cgroup with its memory figures. A pod whose cgroup vanished while being read is left out. */
export function discoverPods(layout: CgroupLayout): PodCgroup[] {
  const out: PodCgroup[] = [];
  for (const f of findPodCgroups(layout.memoryRoot)) {
    const memoryDir = path.join(layout.memoryRoot, f.rel);
    try {
      const v2 = layout.version === 2;
      const usage = readNumber(path.join(memoryDir, v2 ? "memory.current" : "memory.usage_in_bytes")) ?? 0;
      const inactiveKey = v2 ? "inactive_file" : "total_inactive_file";
      const stat = parseFlatKeyed(readSmallFile(path.join(memoryDir, "memory.stat")), (k) => k === inactiveKey);
      const inactive = stat.get(inactiveKey) ?? 0;
      let limit: number | undefined;
      try {
        limit = readNumber(path.join(memoryDir, v2 ? "memory.max" : "memory.limit_in_bytes"));
        if (limit !== undefined && limit >= UNLIMITED_V1) limit = undefined;
      } catch {
        limit = undefined; // the limit is shown, never decided on
      }
      const freezerDir = layout.freezerRoot ? path.join(layout.freezerRoot, f.rel) : undefined;
      out.push({
        ...f,
        version: layout.version,
        memoryDir,
        freezerDir: freezerDir && existsSync(freezerDir) ? freezerDir : undefined,
        usage,
        workingSet: Math.max(0, usage - inactive),
        limit,
      });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
    }
  }
  return out;
}
