// What the running kernel says: sysctls, loaded modules, active swap, the default route. These
// are facts of the kernel, not files of the node, so they are read from /proc and /sys as the
// running machine has them (under a sandbox root too: the README's "kernel facts come from the
// running kernel"), never through the confined node tree.
import { constants as C } from "node:fs";
import { access, readdir, readFile, readlink } from "node:fs/promises";
import os from "node:os";

/** /proc/sys path of a sysctl key: dots separate the levels, or slashes (for names with dots, like eth0.100). */
export function sysctlPath(key: string): string {
  return `/proc/sys/${key.includes("/") ? key : key.replaceAll(".", "/")}`;
}

/** A sysctl's value as sysctl(8) prints it (tabs and repeated blanks as one space), or undefined when this kernel has no such key. */
export async function readSysctl(key: string): Promise<string | undefined> {
  try {
    return normalizeSysctl(await readFile(sysctlPath(key), "utf8"));
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw err;
  }
}

export const normalizeSysctl = (v: string) => v.trim().split(/\s+/).join(" ");

export type SysctlAccess = "writable" | "read-only" | "absent";

/**
 * Whether this process may set the key: a read-only /proc/sys (a container's, EROFS) and a key
 * the kernel exports read-only (a network namespace's nf_conntrack_max, EACCES) both say no.
 */
export async function sysctlAccess(key: string): Promise<SysctlAccess> {
  try {
    await access(sysctlPath(key), C.W_OK);
    return "writable";
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "ENOENT") return "absent";
    if (code === "EROFS" || code === "EACCES" || code === "EPERM") return "read-only";
    throw err;
  }
}

/** Whether a module is loaded (or built into the kernel): /sys/module/<name> exists. */
export async function moduleLoaded(name: string): Promise<boolean> {
  return access(`/sys/module/${name.replaceAll("-", "_")}`).then(
    () => true,
    () => false,
  );
}

/** Whether modprobe can load modules here: the running kernel's modules.dep exists (a container has none). */
export async function modulesAvailable(): Promise<boolean> {
  return access(`/lib/modules/${os.release()}/modules.dep`).then(
    () => true,
    () => false,
  );
}

/** Active swap areas (/proc/swaps), by the name the kernel shows. */
export async function activeSwaps(): Promise<string[]> {
  const text = await readFile("/proc/swaps", "utf8").catch(() => "");
  return text
    .split("\n")
    .slice(1)
    .map((l) => l.trim().split(/\s+/)[0] ?? "")
    .filter(Boolean)
    .map((name) => name.replace(/\\040\(deleted\)$/, ""));
}

export interface InterfaceAddress {
  interface: string;
  address: string;
  /** Prefix length. */
  prefix: number;
}

/** IPv4 addresses of this machine's interfaces (loopback left out), in the kernel's interface order. */
export function ipv4Addresses(): InterfaceAddress[] {
  const out: InterfaceAddress[] = [];
  for (const [name, addrs] of Object.entries(os.networkInterfaces())) {
    for (const a of addrs ?? []) {
      if (a.family !== "IPv4" || a.internal) continue;
      out.push({ interface: name, address: a.address, prefix: Number(a.cidr?.split("/")[1] ?? 32) });
    }
  }
  return out;
}

/** The interface of the IPv4 default route (/proc/net/route), if any. */
export async function defaultRouteInterface(): Promise<string | undefined> {
  const text = await readFile("/proc/net/route", "utf8").catch(() => "");
  for (const line of text.split("\n").slice(1)) {
    const [iface, destination, , , , , , mask] = line.trim().split(/\s+/);
    if (iface && destination === "00000000" && mask === "00000000") return iface;
  }
  return undefined;
}

/**
 * Interfaces backed by a device (a NIC: /sys/class/net/<if> links into /sys/devices/, not
 * /sys/devices/virtual/): what Deckhouse counts as "physical" (veth, bridges, dummies are not).
 */
export async function physicalInterfaces(): Promise<string[]> {
  const names = await readdir("/sys/class/net").catch(() => [] as string[]);
  const out: string[] = [];
  for (const n of names.sort()) {
    const target = await readlink(`/sys/class/net/${n}`).catch(() => "");
    if (target.includes("/devices/") && !target.includes("/devices/virtual/")) out.push(n);
  }
  return out;
}
