// The kernel's memory accounting files, read the cheap way: a sync pread into one reused
// buffer (procfs answers from memory in microseconds; no promise, no thread-pool hop, no
// per-read allocation beyond the text), and parsers that pick out only the fields early OOM
// uses.
import { closeSync, openSync, readFileSync, readSync, realpathSync } from "node:fs";

const BUF = Buffer.allocUnsafe(16 * 1024);

function readFd(fd: number): string {
  let len = 0;
  for (;;) {
    const want = BUF.length - len;
    const n = readSync(fd, BUF, len, want, len);
    len += n;
    // A short read is the end: procfs (seq_file) fills the buffer until its last record, and so
    // does a regular file; one read per sample instead of a second one that returns 0.
    if (n < want || len === BUF.length) break; // (a full buffer: more than any file read here)
  }
  return BUF.toString("latin1", 0, len);
}

/** The whole (small) file as text. Throws the errno error (ENOENT, EOPNOTSUPP...) as is. */
export function readSmallFile(file: string): string {
  const fd = openSync(file, "r");
  try {
    return readFd(fd);
  } finally {
    closeSync(fd);
  }
}

/**
 * A file read on every sample. On procfs it stays open and each read is one pread at offset 0,
 * which makes the kernel generate it afresh: the open and close cost more than the read
 * (measured here: about 115 µs for open + read + close, 45 µs for the pread). Anywhere else
 * (a test's tree standing in for /proc, whose files are replaced by rename) it is opened each
 * time, so a replaced file is seen.
 */
export class SampledFile {
  readonly path: string;
  private readonly keepOpen: boolean;
  private fd: number | undefined;

  constructor(file: string, keepOpen: boolean) {
    this.path = file;
    this.keepOpen = keepOpen;
  }

  read(): string {
    if (!this.keepOpen) return readSmallFile(this.path);
    this.fd ??= openSync(this.path, "r");
    try {
      return readFd(this.fd);
    } catch (err) {
      this.close(); // opened afresh next time
      throw err;
    }
  }

  close(): void {
    if (this.fd === undefined) return;
    try {
      closeSync(this.fd);
    } catch {
      // already closed: nothing held
    }
    this.fd = undefined;
  }
}

/** Whether dir is on a procfs mount (this process's mount table; false when it cannot tell). */
export function isProcfs(dir: string): boolean {
  let real: string;
  let table: string;
  try {
    real = realpathSync(dir);
    table = readFileSync("/proc/self/mountinfo", "latin1");
  } catch {
    return false;
  }
  let best = "";
  let type = "";
  for (const line of table.split("\n")) {
    // "36 35 98:0 /root /mount/point opts... - fstype source opts"
    const f = line.split(" ");
    const sep = f.indexOf("-", 6);
    const mount = f[4]?.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(Number.parseInt(o, 8)));
    if (!mount || sep < 0) continue;
    const inside = mount === "/" || real === mount || real.startsWith(`${mount}/`);
    if (inside && mount.length >= best.length) {
      best = mount;
      type = f[sep + 1] ?? "";
    }
  }
  return type === "proc";
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

/** The number after `key=` in text[from, to), or NaN. */
function field(text: string, key: string, from: number, to: number): number {
  const at = text.indexOf(key, from);
  if (at < 0 || at >= to) return Number.NaN;
  const start = at + key.length;
  let end = text.indexOf(" ", start);
  if (end < 0 || end > to) end = to;
  return Number(text.slice(start, end));
}

// Picked out with indexOf, not split into parts: this runs on every sample.
function psiLine(text: string, kind: "some" | "full"): PsiLine | undefined {
  const at = text.startsWith(`${kind} `) ? 0 : text.indexOf(`\n${kind} `) + 1;
  if (at === 0 && !text.startsWith(`${kind} `)) return undefined;
  let end = text.indexOf("\n", at);
  if (end < 0) end = text.length;
  const avg10 = field(text, " avg10=", at, end);
  const avg60 = field(text, " avg60=", at, end);
  const avg300 = field(text, " avg300=", at, end);
  const total = field(text, " total=", at, end);
  if (!Number.isFinite(avg10) || !Number.isFinite(avg60) || !Number.isFinite(avg300) || !Number.isFinite(total))
    return undefined;
  return { avg10, avg60, avg300, total };
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
