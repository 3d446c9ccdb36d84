// The kernel's memory accounting files, read the cheap way: a sync pread into one reused
// buffer (procfs answers from memory in microseconds; no promise, no thread-pool hop, no
// per-read allocation beyond the text), and parsers that pick out only the fields early OOM
// uses.
import { closeSync, openSync, readSync } from "node:fs";

const BUF = Buffer.allocUnsafe(16 * 1024);

/** The whole (small) file as text. Throws the errno error (ENOENT, EOPNOTSUPP...) as is. */
export function readSmallFile(file: string): string {
  const fd = openSync(file, "r");
  try {
    let len = 0;
    for (;;) {
      const n = readSync(fd, BUF, len, BUF.length - len, len);
      if (n === 0) break;
      len += n;
      if (len === BUF.length) break; // more than any file read here; the tail is not needed
    }
    return BUF.toString("latin1", 0, len);
  } finally {
    closeSync(fd);
  }
}

export interface PsiLine {
  avg10: number;
  avg60: number;
  avg300: number;
  /** Cumulative stall time in microseconds. */
  total: number;
}

export interface Psi {
  some: PsiLine;
  full: PsiLine;
}

function psiLine(text: string, kind: "some" | "full"): PsiLine | undefined {
  const at = text.indexOf(`${kind} `);
  if (at < 0) return undefined;
  const end = text.indexOf("\n", at);
  const line = text.slice(at + kind.length + 1, end < 0 ? undefined : end);
  const out: Record<string, number> = {};
  for (const part of line.split(" ")) {
    const eq = part.indexOf("=");
    if (eq > 0) out[part.slice(0, eq)] = Number(part.slice(eq + 1));
  }
  const { avg10, avg60, avg300, total } = out;
  if ([avg10, avg60, avg300, total].some((v) => v === undefined || !Number.isFinite(v))) return undefined;
  return { avg10: avg10!, avg60: avg60!, avg300: avg300!, total: total! };
}

/** `/proc/pressure/memory` (or a cgroup's memory.pressure). Undefined when the text is not PSI. */
export function parsePsi(text: string): Psi | undefined {
  const some = psiLine(text, "some");
  const full = psiLine(text, "full");
  return some && full ? { some, full } : undefined;
}

/** Values of `Key: N kB` lines (/proc/meminfo), in bytes, for the keys asked. */
export function parseMeminfo(text: string, keys: readonly string[]): Record<string, number | undefined> {
  const out: Record<string, number | undefined> = {};
  for (const k of keys) {
    const at = text.startsWith(`${k}:`) ? 0 : text.indexOf(`\n${k}:`) + 1;
    if (at === 0 && !text.startsWith(`${k}:`)) continue;
    const m = /^:\s*(\d+)\s*(kB)?/.exec(text.slice(at + k.length, at + k.length + 40));
    if (m) out[k] = Number(m[1]) * (m[2] ? 1024 : 1);
  }
  return out;
}

/** Numbers of `key value` lines (/proc/vmstat, memory.stat), for every key, or only those asked. */
export function parseFlatKeyed(text: string, only?: (key: string) => boolean): Map<string, number> {
  const out = new Map<string, number>();
  let start = 0;
  while (start < text.length) {
    let end = text.indexOf("\n", start);
    if (end < 0) end = text.length;
    const sp = text.indexOf(" ", start);
    if (sp > start && sp < end) {
      const key = text.slice(start, sp);
      if (!only || only(key)) {
        const v = Number(text.slice(sp + 1, end));
        if (Number.isFinite(v)) out.set(key, v);
      }
    }
    start = end + 1;
  }
  return out;
}

export interface Reclaim {
  /** Pages scanned by reclaim (kswapd, direct and memory-cgroup limit reclaim where the kernel counts it). */
  pgscan: number;
  pgsteal: number;
  /** Working-set refaults: evicted pages needed again, the mark of thrashing. */
  refault: number;
}

/** The number on the `key value` line, without splitting the whole text. */
function keyed(text: string, key: string): number | undefined {
  const nl = text.indexOf(`\n${key} `);
  const at = text.startsWith(`${key} `) ? 0 : nl < 0 ? -1 : nl + 1;
  if (at < 0) return undefined;
  const start = at + key.length + 1;
  const end = text.indexOf("\n", start);
  const n = Number(text.slice(start, end < 0 ? undefined : end));
  return Number.isFinite(n) ? n : undefined;
}

const wantedVmstat = (k: string) =>
  k.startsWith("pgscan") || k.startsWith("pgsteal") || k.startsWith("workingset_refault");

/**
 * Reclaim counters from /proc/vmstat. Kernels since 5.8 count every reclaim, cgroup limit
 * reclaim included, in pgscan_anon/pgscan_file; pgscan_kswapd/pgscan_direct leave cgroup limit
 * reclaim out, so they are used only on older kernels (which also split them per zone).
 */
export function parseVmstat(text: string): Reclaim {
  // The common case (5.9+: typed counters), found directly: a sample should cost little.
  const anon = keyed(text, "pgscan_anon");
  const file = keyed(text, "pgscan_file");
  const rfa = keyed(text, "workingset_refault_anon");
  const rff = keyed(text, "workingset_refault_file");
  if (anon !== undefined && file !== undefined && rfa !== undefined && rff !== undefined)
    return {
      pgscan: anon + file,
      pgsteal: (keyed(text, "pgsteal_anon") ?? 0) + (keyed(text, "pgsteal_file") ?? 0),
      refault: rfa + rff,
    };
  const v = parseFlatKeyed(text, wantedVmstat);
  const sum = (pred: (k: string) => boolean) => {
    let s = 0;
    for (const [k, n] of v) if (pred(k)) s += n;
    return s;
  };
  const typed = v.has("pgscan_anon") || v.has("pgscan_file");
  const pgscan = typed
    ? (v.get("pgscan_anon") ?? 0) + (v.get("pgscan_file") ?? 0)
    : sum((k) => k.startsWith("pgscan_kswapd") || (k.startsWith("pgscan_direct") && k !== "pgscan_direct_throttle"));
  const pgsteal = typed
    ? (v.get("pgsteal_anon") ?? 0) + (v.get("pgsteal_file") ?? 0)
    : sum((k) => k.startsWith("pgsteal_kswapd") || k.startsWith("pgsteal_direct"));
  // workingset_refault (before 5.9) or workingset_refault_anon + workingset_refault_file.
  const refault = v.has("workingset_refault")
    ? (v.get("workingset_refault") ?? 0)
    : (v.get("workingset_refault_anon") ?? 0) + (v.get("workingset_refault_file") ?? 0);
  return { pgscan, pgsteal, refault };
}
