// What the benchmarks read of a process from /proc: its resident memory and its CPU time.
import { readFile } from "node:fs/promises";

/** A `kB` field of /proc/PID/status (VmRSS, RssAnon, RssFile, VmHWM…); 0 when absent. */
export async function rssKb(pid: number, field = "VmRSS"): Promise<number> {
  const m = new RegExp(`${field}:\\s+(\\d+)`).exec(await readFile(`/proc/${pid}/status`, "utf8"));
  return Number(m?.[1] ?? 0);
}

/** utime + stime of the process (every thread) so far, ms: /proc/PID/stat counts in USER_HZ, 100 on Linux. */
export async function cpuMs(pid: number): Promise<number> {
  const stat = await readFile(`/proc/${pid}/stat`, "utf8");
  // The command name may hold spaces: the fields start after its closing parenthesis.
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(f[11]) + Number(f[12])) * 10;
}

/** The machine's load averages over 1, 5 and 15 minutes, as /proc/loadavg prints them. */
export async function loadAverage(): Promise<string> {
  return (await readFile("/proc/loadavg", "utf8")).split(" ").slice(0, 3).join(" ");
}
