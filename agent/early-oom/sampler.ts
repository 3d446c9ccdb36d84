// Samples of the node's memory pressure, and the figures early OOM decides on: the share of a
// trailing window spent in memory stall, computed from the kernel's cumulative `total`
// counters (microseconds), not from avg10, which is a 10 s moving average that lags a sudden
// stall by seconds; plus MemAvailable and the reclaim rate.
import path from "node:path";
import { isProcfs, type Psi, type Reclaim, parseMeminfo, parsePsi, parseVmstat, SampledFile } from "./kernel-files.ts";

export interface Sample {
  /** Clock time of the reading, ms. */
  t: number;
  psi: Psi;
  memAvailable: number | undefined;
  memTotal: number | undefined;
  reclaim: Reclaim | undefined;
}

export interface WindowFigures {
  /** Span the shares cover, ms (at least the window once the history is long enough). */
  spanMs: number;
  /** Share of the span in which some task, and in which every non-idle task, waited on memory (0..1). */
  some: number;
  full: number;
  /** The kernel's own full avg10, for comparison (0..1). */
  fullAvg10: number;
  memAvailable: number | undefined;
  memTotal: number | undefined;
  /** Pages scanned + refaulted per second over the span. */
  reclaimPerSecond: number | undefined;
  refaultPerSecond: number | undefined;
}

/** PSI is not there: no /proc/pressure (kernel without CONFIG_PSI, or booted with psi=0). */
export class PsiUnavailableError extends Error {
  override name = "PsiUnavailableError";
}

const UNAVAILABLE = new Set(["ENOENT", "EOPNOTSUPP", "ENOTSUP"]);

/**
 * While calm (the full stall counter standing still), how often /proc/meminfo is read: enough
 * to see memory approach its threshold (the pace's warning), which alone cannot make the
 * trigger fire...
 */
export const CALM_MEMINFO_EVERY_MS = 3000;
/** ...and /proc/vmstat (for the figures shown; the trigger needs it only once a stall begins). */
export const CALM_VMSTAT_EVERY_MS = 10_000;

export class Sampler {
  readonly psiFile: string;
  private readonly psi: SampledFile;
  private readonly meminfo: SampledFile;
  private readonly vmstat: SampledFile;
  private history: Sample[] = [];
  private readonly keepMs: number;
  private readonly detailEveryMs: number;
  private lastMeminfo = Number.NEGATIVE_INFINITY;
  private lastVmstat = Number.NEGATIVE_INFINITY;

  /**
   * keepMs: how much history to keep. detailEveryMs: while the full stall counter stands still
   * the trigger cannot fire, so /proc/meminfo and /proc/vmstat (most of a sample's cost) are read
   * only this often, enough for a reclaim baseline when a stall begins.
   */
  constructor(procRoot: string, keepMs: number, detailEveryMs = 1000) {
    const keepOpen = isProcfs(procRoot);
    this.psiFile = path.join(procRoot, "pressure/memory");
    this.psi = new SampledFile(this.psiFile, keepOpen);
    this.meminfo = new SampledFile(path.join(procRoot, "meminfo"), keepOpen);
    this.vmstat = new SampledFile(path.join(procRoot, "vmstat"), keepOpen);
    this.keepMs = keepMs;
    this.detailEveryMs = detailEveryMs;
  }

  /**
   * Reads the files. MemAvailable and vmstat are optional: their absence only weakens the second
   * signal. While the full stall counter moves, all three files are read on every sample.
   * While it stands still the trigger cannot fire: `calm` (the slow pace, pace.ts) reads
   * MemAvailable on every sample, to tell how far memory is from its threshold, and vmstat
   * only every CALM_VMSTAT_EVERY_MS (the stall's first sample reads it, the reclaim baseline);
   * the fast pace reads both every detailEveryMs.
   */
  read(t: number, calm = false): Sample {
    let text: string;
    try {
      text = this.psi.read();
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code ?? "";
      if (UNAVAILABLE.has(code)) throw new PsiUnavailableError(`${this.psiFile}: ${code}`);
      throw err;
    }
    const psi = parsePsi(text);
    if (!psi) throw new Error(`${this.psiFile}: not in the kernel's PSI format: ${JSON.stringify(text.slice(0, 120))}`);
    const prev = this.history.at(-1);
    const moved = !prev || prev.psi.full.total !== psi.full.total;
    const sample: Sample = { t, psi, memAvailable: undefined, memTotal: undefined, reclaim: undefined };
    if (moved || t - this.lastMeminfo >= (calm ? CALM_MEMINFO_EVERY_MS : this.detailEveryMs)) {
      this.lastMeminfo = t;
      try {
        const m = parseMeminfo(this.meminfo.read(), ["MemTotal", "MemAvailable"]);
        sample.memAvailable = m.MemAvailable;
        sample.memTotal = m.MemTotal;
      } catch {
        // optional second signal; status() shows it as unknown
      }
    }
    if (moved || t - this.lastVmstat >= (calm ? CALM_VMSTAT_EVERY_MS : this.detailEveryMs)) {
      this.lastVmstat = t;
      try {
        sample.reclaim = parseVmstat(this.vmstat.read());
      } catch {
        // as above
      }
    }
    return sample;
  }

  /** Whether the latest sample only repeats the one before: the same PSI totals, nothing else read. */
  unchanged(): boolean {
    const b = this.history.at(-1);
    const a = this.history.at(-2);
    return (
      a !== undefined &&
      b !== undefined &&
      b.memTotal === undefined &&
      b.reclaim === undefined &&
      a.psi.full.total === b.psi.full.total &&
      a.psi.some.total === b.psi.some.total
    );
  }

  /** Releases the files kept open. */
  close(): void {
    for (const f of [this.psi, this.meminfo, this.vmstat]) f.close();
  }

  push(s: Sample): void {
    this.history.push(s);
    const keepFrom = s.t - this.keepMs;
    // Keep one sample at or before keepFrom, so a full window can still be measured.
    let drop = 0;
    while (drop + 1 < this.history.length && (this.history[drop + 1]?.t ?? Infinity) <= keepFrom) drop++;
    if (drop) this.history.splice(0, drop);
  }

  get latest(): Sample | undefined {
    return this.history.at(-1);
  }

  /** Forget the past (after a kill: the stall before it must not count toward the next decision). */
  reset(): void {
    const last = this.history.at(-1);
    this.history = last ? [last] : [];
  }

  /** The newest sample taken at or before t, else the oldest one. */
  private at(t: number): Sample | undefined {
    let found: Sample | undefined;
    for (const s of this.history) {
      if (s.t <= t) found = s;
      else break;
    }
    return found ?? this.history[0];
  }

  /** Figures over the trailing window ending at the latest sample; undefined until two samples exist. */
  window(windowMs: number): WindowFigures | undefined {
    const end = this.history.at(-1);
    if (!end) return undefined;
    return this.between(this.at(end.t - windowMs), end);
  }

  /** Reclaim and refault rates from time `from` to the latest sample. */
  rates(from: number): Pick<WindowFigures, "reclaimPerSecond" | "refaultPerSecond"> {
    const end = this.history.at(-1);
    const start = this.at(from);
    const f = end && start ? this.between(start, end) : undefined;
    return { reclaimPerSecond: f?.reclaimPerSecond, refaultPerSecond: f?.refaultPerSecond };
  }

  private between(a: Sample | undefined, b: Sample): WindowFigures | undefined {
    if (!a || b.t <= a.t) return undefined;
    const spanMs = b.t - a.t;
    const share = (x: number, y: number) => Math.min(1, Math.max(0, (y - x) / (spanMs * 1000)));
    // Reclaim counters are not in every sample: the nearest ones inside [a, b] with them.
    const inside = this.history.filter((s) => s.t >= a.t && s.t <= b.t && s.reclaim);
    const ra = inside[0];
    const rb = inside.at(-1);
    let r: { reclaim: number; refault: number } | undefined;
    if (ra?.reclaim && rb?.reclaim && rb.t > ra.t) {
      const perSecond = (x: number, y: number) => (Math.max(0, y - x) * 1000) / (rb.t - ra.t);
      r = {
        reclaim: perSecond(ra.reclaim.pgscan + ra.reclaim.refault, rb.reclaim.pgscan + rb.reclaim.refault),
        refault: perSecond(ra.reclaim.refault, rb.reclaim.refault),
      };
    }
    const mem = this.history.findLast((s) => s.t <= b.t && s.memTotal !== undefined);
    return {
      spanMs,
      some: share(a.psi.some.total, b.psi.some.total),
      full: share(a.psi.full.total, b.psi.full.total),
      fullAvg10: b.psi.full.avg10 / 100,
      memAvailable: mem?.memAvailable,
      memTotal: mem?.memTotal,
      reclaimPerSecond: r?.reclaim,
      refaultPerSecond: r?.refault,
    };
  }
}
