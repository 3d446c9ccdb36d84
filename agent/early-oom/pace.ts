// How often to sample: fast (sampleIntervalMs, 250 ms) while anything is near a threshold,
// slow (calmSampleIntervalMs, 750 ms) while the node is calm, as userspace OOM killers do (earlyoom
// sleeps longer the further memory is from its threshold; systemd-oomd polls once a second).
// A pure decision over the last figures, with the reason.
//
// Why this keeps the trigger's guarantee: the trigger acts only on a full stall at or above
// fullStallPercent held at every sample for durationMs, plus a second signal. Every figure it
// decides on comes from the kernel's cumulative counters, so a slower sample misses nothing; it
// only sees it later. The fast pace starts before the trigger can be met: at a quarter of the
// full-stall threshold, at some-stall at the threshold, or at twice the MemAvailable threshold,
// and the whole stall is then measured at the fast pace, as before. Reclaim alone does not make
// it fast: kswapd reclaims all day on a node whose page cache fills its memory, and the trigger
// needs the full stall first whatever reclaim does. The one cost is on a node that goes from
// calm to a full stall within one calm interval: the stall is seen up to one calm interval
// later (calmSampleIntervalMs − sampleIntervalMs more than before).
import type { EarlyOomConfig } from "./config.ts";
import type { WindowFigures } from "./sampler.ts";
import type { TriggerState } from "./trigger.ts";
import { pct } from "./format.ts";

/** Fraction of the full-stall threshold from which sampling is fast. */
export const NEAR_STALL = 0.25;
/** Multiple of the MemAvailable threshold below which sampling is fast. */
export const NEAR_MEM_AVAILABLE = 2;

export interface Pace {
  ms: number;
  calm: boolean;
  /** Why fast, or what made it calm. */
  reason: string;
}

type Cfg = Pick<
  EarlyOomConfig,
  "sampleIntervalMs" | "calmSampleIntervalMs" | "fullStallPercent" | "memAvailablePercent"
>;

export function pace(cfg: Cfg, state: TriggerState, w: WindowFigures | undefined): Pace {
  const fast = (reason: string): Pace => ({ ms: cfg.sampleIntervalMs, calm: false, reason });
  if (cfg.calmSampleIntervalMs <= cfg.sampleIntervalMs) return fast("one interval configured");
  if (state.phase === "building" || state.phase === "met") return fast(`trigger ${state.phase}`);
  if (!w) return fast("no figures yet");
  if (w.full * 100 >= cfg.fullStallPercent * NEAR_STALL)
    return fast(`full stall ${pct(w.full)} ≥ ${NEAR_STALL * 100}% of the ${cfg.fullStallPercent}% threshold`);
  if (w.some * 100 >= cfg.fullStallPercent) return fast(`some stall ${pct(w.some)} ≥ ${cfg.fullStallPercent}%`);
  if (cfg.memAvailablePercent > 0 && w.memAvailable !== undefined && w.memTotal) {
    const near = cfg.memAvailablePercent * NEAR_MEM_AVAILABLE;
    if ((w.memAvailable / w.memTotal) * 100 <= near)
      return fast(`MemAvailable ${pct(w.memAvailable / w.memTotal)} ≤ ${near}%`);
  }
  return { ms: cfg.calmSampleIntervalMs, calm: true, reason: "PSI and MemAvailable far from the thresholds" };
}
