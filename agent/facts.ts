// The node facts the agent decides with. Files under /etc come from the root the agent acts
// on (so a sandbox tree has its own OS); kernel interfaces (/proc, /sys) are the running
// kernel's, because a directory tree has no kernel of its own.
import { readFile, access } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { familyOf, parseOsRelease, UnknownOsError, type BundleFamily } from "../bundles/os-families.ts";

export interface NodeFacts {
  hostname: string;
  os: {
    id: string;
    versionId: string;
    prettyName: string;
    /** null when the OS is not supported; `error` then says why. */
    family: BundleFamily | null;
    packageManager: string | null;
    error?: string;
  };
  kernel: { release: string; arch: string };
  cgroup: { version: 1 | 2; hybrid: boolean };
  psi: { available: boolean; memory: string };
  bootId: string;
  addresses: { interface: string; family: "IPv4" | "IPv6"; address: string }[];
}

export const KERNEL_PATHS = {
  bootId: "/proc/sys/kernel/random/boot_id",
  psiMemory: "/proc/pressure/memory",
  cgroupRoot: "/sys/fs/cgroup",
};

async function exists(p: string): Promise<boolean> {
  return access(p).then(
    () => true,
    () => false,
  );
}

async function readTrimmed(p: string): Promise<string | undefined> {
  return readFile(p, "utf8").then(
    (s) => s.trim(),
    () => undefined,
  );
}

/** The running kernel's boot id ("" when unreadable): changes on every reboot. */
export async function readBootId(): Promise<string> {
  return (await readTrimmed(KERNEL_PATHS.bootId)) ?? "";
}

/** cgroup v2 has cgroup.controllers at the root; hybrid mounts a v2 "unified" tree beside v1. */
export async function cgroupVersion(cgroupRoot = KERNEL_PATHS.cgroupRoot): Promise<NodeFacts["cgroup"]> {
  if (await exists(path.join(cgroupRoot, "cgroup.controllers"))) return { version: 2, hybrid: false };
  return { version: 1, hybrid: await exists(path.join(cgroupRoot, "unified", "cgroup.controllers")) };
}

export async function readOsFacts(root: string): Promise<NodeFacts["os"]> {
  const text =
    (await readFile(path.join(root, "etc/os-release"), "utf8").catch(() => undefined)) ??
    (await readFile(path.join(root, "usr/lib/os-release"), "utf8").catch(() => ""));
  const rel = parseOsRelease(text);
  const base = { id: rel.ID ?? "", versionId: rel.VERSION_ID ?? "", prettyName: rel.PRETTY_NAME ?? "" };
  try {
    const fam = familyOf(base.id);
    return { ...base, family: fam.family, packageManager: fam.packageManager };
  } catch (err) {
    if (!(err instanceof UnknownOsError)) throw err;
    return { ...base, family: null, packageManager: null, error: err.message };
  }
}

function listAddresses(): NodeFacts["addresses"] {
  const out: NodeFacts["addresses"] = [];
  for (const [name, addrs] of Object.entries(os.networkInterfaces())) {
    for (const a of addrs ?? []) {
      if (a.internal) continue;
      out.push({ interface: name, family: a.family, address: a.address });
    }
  }
  return out.sort((a, b) => a.interface.localeCompare(b.interface) || a.address.localeCompare(b.address));
}

export async function gatherFacts(root = "/"): Promise<NodeFacts> {
  const [osFacts, hostnameFile, cgroup, psiAvailable, bootId] = await Promise.all([
    readOsFacts(root),
    root === "/" ? undefined : readTrimmed(path.join(root, "etc/hostname")),
    cgroupVersion(),
    readFile(KERNEL_PATHS.psiMemory, "utf8").then(
      () => true,
      () => false,
    ),
    readBootId(),
  ]);
  return {
    hostname: hostnameFile || os.hostname(),
    os: osFacts,
    kernel: { release: os.release(), arch: os.arch() },
    cgroup,
    psi: { available: psiAvailable, memory: KERNEL_PATHS.psiMemory },
    bootId,
    addresses: listAddresses(),
  };
}
