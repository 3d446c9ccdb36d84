// Kernel parameters as a step wants them: a sysctl.d file that systemd-sysctl applies at every
// boot, and the live values, set now only where they differ. A key the machine cannot set (a
// container's read-only /proc/sys, a key its kernel does not have yet) is a problem of the step,
// reported, never a change: such a node still plans nothing once the file is in place.
import type { Host } from "../../host/host.ts";
import { planFile } from "../../host/file-plan.ts";
import type { CommandChange, FileChange, Problem } from "../types.ts";
import { readSysctl, sysctlAccess, normalizeSysctl } from "./kernel.ts";

export interface SysctlPlan {
  file?: FileChange;
  /** `sysctl -w` of every writable key whose live value differs (none under a sandbox root). */
  apply?: CommandChange;
  problems: Problem[];
}

/** sysctl.d syntax, keys in the order given. */
export function renderSysctlFile(header: string, settings: Readonly<Record<string, string>>): string {
  return `${header}\n${Object.entries(settings)
    .map(([k, v]) => `${k} = ${v}\n`)
    .join("")}`;
}

/**
 * The file, and the live values of `live` (default: every key of `settings`; a glob line like
 * net.ipv4.conf.*.rp_filter is in the file only, its expansion passed as `live`). Live values are
 * the running kernel's, so under a sandbox root only the file is planned.
 */
export async function planSysctls(
  host: Host,
  o: {
    path: string;
    header: string;
    settings: Readonly<Record<string, string>>;
    live?: Readonly<Record<string, string>>;
    subject: string;
    /** Why a key may be absent (a module not loaded yet, say), by key. */
    absentBecause?: (key: string) => string | undefined;
  },
): Promise<SysctlPlan> {
  const problems: Problem[] = [];
  const file = await planFile(host, { path: o.path, content: renderSysctlFile(o.header, o.settings), mode: 0o644 });
  if (host.sandbox) return { ...(file ? { file } : {}), problems };
  const differ: string[] = [];
  const readOnly: string[] = [];
  const absent: string[] = [];
  for (const [key, value] of Object.entries(o.live ?? o.settings)) {
    const current = await readSysctl(key);
    if (current === undefined) {
      absent.push(key);
      continue;
    }
    if (current === normalizeSysctl(value)) continue;
    if ((await sysctlAccess(key)) !== "writable") readOnly.push(`${key} (is ${current}, wanted ${value})`);
    else differ.push(`${key}=${value}`);
  }
  if (readOnly.length) {
    problems.push({
      subject: o.subject,
      message: `${readOnly.length} kernel parameter(s) cannot be set on this machine (read-only in /proc/sys: a container shares its host's kernel; set them on the host): ${readOnly.join(", ")}`,
    });
  }
  for (const key of absent) {
    problems.push({
      subject: o.subject,
      message: `${key} is not in this kernel${o.absentBecause?.(key) ? ` (${o.absentBecause(key)})` : ""}; it is set from ${o.path} once it is`,
    });
  }
  const apply: CommandChange | undefined = differ.length
    ? {
        kind: "command",
        argv: ["sysctl", "-q", "-w", ...differ],
        summary: `set ${differ.length} kernel parameter(s) now: ${differ.join(" ")}`,
      }
    : undefined;
  return { ...(file ? { file } : {}), ...(apply ? { apply } : {}), problems };
}
