// When to act: a pure decision over the window figures, every outcome with a readable reason.
// Full memory stall at or above the threshold at every sample for the whole duration, AND a
// second signal (MemAvailable low, or reclaim/refault activity over that stretch). PSI alone
// also rises on compaction or a burst of page-cache misses with memory to spare; the second
// signal says memory is really short.
import type { EarlyOomConfig } from "./config.ts";
import type { WindowFigures } from "./sampler.ts";
import { bytes, pct } from "./format.ts";

export type TriggerPhase = "calm" | "building" | "met" | "cooldown";

export interface TriggerState {
  phase: TriggerPhase;
  /** Clock time of the first sample of the current run of samples above the threshold. */
  aboveSince?: number;
  cooldownUntil?: number;
  /** Why the phase is what it is, with the figures. */
  reason: string;
  /** The second signal that agreed, when one did. */
  secondSignal?: string;
}

export const CALM: TriggerState = { phase: "calm", reason: "no figures yet" };

type Cfg = Pick<
  EarlyOomConfig,
  "fullStallPercent" | "durationMs" | "memAvailablePercent" | "reclaimPagesPerSecond" | "windowMs"
>;

/** The second signal: which one agreed, or why none did. */
export function secondSignal(
  cfg: Cfg,
  w: WindowFigures,
  reclaimPerSecond: number | undefined,
): { ok: boolean; why: string } {
  const no: string[] = [];
  if (cfg.memAvailablePercent <= 0 && cfg.reclaimPagesPerSecond <= 0) return { ok: true, why: "none required" };
  if (cfg.memAvailablePercent > 0) {
    if (w.memAvailable !== undefined && w.memTotal) {
      const share = w.memAvailable / w.memTotal;
      const line = `MemAvailable ${bytes(w.memAvailable)} (${pct(share)} of ${bytes(w.memTotal)})`;
      if (share * 100 <= cfg.memAvailablePercent) return { ok: true, why: `${line} ≤ ${cfg.memAvailablePercent}%` };
      no.push(`${line} > ${cfg.memAvailablePercent}%`);
    } else no.push("MemAvailable unknown");
  }
  if (cfg.reclaimPagesPerSecond > 0) {
    if (reclaimPerSecond !== undefined) {
      const line = `reclaim ${Math.round(reclaimPerSecond)} pages/s (scanned + refaulted)`;
      if (reclaimPerSecond >= cfg.reclaimPagesPerSecond)
        return { ok: true, why: `${line} ≥ ${cfg.reclaimPagesPerSecond}` };
      no.push(`${line} < ${cfg.reclaimPagesPerSecond}`);
    } else no.push("reclaim counters unknown");
  }
  return { ok: false, why: no.join(", ") };
}

/**
 * The next state after one sample. `reclaimSince(t)` gives the reclaim rate from clock time t
 * to now (over the whole stall, not only the last window).
 */
export function evaluate(
  prev: TriggerState,
  cfg: Cfg,
  now: number,
  w: WindowFigures | undefined,
  reclaimSince: (t: number) => number | undefined,
): TriggerState {
  if (prev.phase === "cooldown" && prev.cooldownUntil !== undefined && now < prev.cooldownUntil) {
    return {
      ...prev,
      reason: `cooling down ${((prev.cooldownUntil - now) / 1000).toFixed(1)} s more after the last action`,
    };
  }
  if (!w) return { phase: "calm", reason: "waiting for a second sample" };
  const full = `full stall ${pct(w.full)} over ${(w.spanMs / 1000).toFixed(1)} s`;
  if (w.full * 100 < cfg.fullStallPercent) return { phase: "calm", reason: `${full}, below ${cfg.fullStallPercent}%` };
  const since = prev.phase === "building" && prev.aboveSince !== undefined ? prev.aboveSince : now;
  const held = now - since;
  if (held < cfg.durationMs) {
    return {
      phase: "building",
      aboveSince: since,
      reason: `${full} ≥ ${cfg.fullStallPercent}% for ${(held / 1000).toFixed(2)} s of ${(cfg.durationMs / 1000).toFixed(1)} s`,
    };
  }
  const second = secondSignal(cfg, w, reclaimSince(since - cfg.windowMs));
  const heldLine = `${full} ≥ ${cfg.fullStallPercent}% held ${(held / 1000).toFixed(2)} s (≥ ${(cfg.durationMs / 1000).toFixed(1)} s)`;
  if (!second.ok) {
    return { phase: "building", aboveSince: since, reason: `${heldLine}, but no second signal: ${second.why}` };
  }
  return { phase: "met", aboveSince: since, reason: `${heldLine}; ${second.why}`, secondSignal: second.why };
}

export function cooldown(now: number, cooldownMs: number, reason: string): TriggerState {
  return { phase: "cooldown", cooldownUntil: now + cooldownMs, reason };
}
