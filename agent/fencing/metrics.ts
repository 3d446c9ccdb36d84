// Fencing's metrics, in the resident agent's registry (served at /metrics, and written to
// /run/bashible/fencing.prom with the status). Registered when fencing first turns on.
import type { Counter, Gauge, Histogram, Registry } from "../../lib/prometheus.ts";

export interface FencingMetrics {
  armed: Gauge;
  petting: Gauge;
  maintenance: Gauge;
  pets: Counter;
  petErrors: Counter;
  gap: Histogram;
  checks: Counter;
  verdicts: Counter;
  peerAnswers: Counter;
  peerRefused: Counter;
  badRounds: Gauge;
}

export function fencingMetrics(r: Registry): FencingMetrics {
  return {
    armed: r.gauge("bashible_fencing_armed", "1 while the watchdog device is open (armed)"),
    petting: r.gauge("bashible_fencing_petting", "1 while the watchdog is petted"),
    maintenance: r.gauge("bashible_fencing_maintenance", "1 while a maintenance annotation holds fencing down"),
    pets: r.counter("bashible_fencing_pets_total", "Pets written to the watchdog device"),
    petErrors: r.counter("bashible_fencing_pet_errors_total", "Pets that could not be written"),
    gap: r.histogram(
      "bashible_fencing_pet_gap_seconds",
      "Time between consecutive pets",
      [0.5, 1, 2, 3, 5, 6, 7.5, 10, 15, 30, 60],
    ),
    checks: r.counter("bashible_fencing_api_checks_total", "API reachability checks by result"),
    verdicts: r.counter("bashible_fencing_verdicts_total", "Health verdicts by kind"),
    peerAnswers: r.counter("bashible_fencing_peer_answers_total", "Peer answers by outcome"),
    peerRefused: r.counter(
      "bashible_fencing_peer_connections_refused_total",
      "Connections to the peer port closed at once by its limits, by limit",
    ),
    badRounds: r.gauge(
      "bashible_fencing_bad_rounds",
      "Consecutive bad verdicts (petting stops at the configured count)",
    ),
  };
}

/** fencing.prom: fencing's own series (the resident registry also holds converge's and early OOM's). */
export function fencingMetricsText(m: FencingMetrics): string {
  return Object.values(m)
    .map((metric: Counter | Gauge | Histogram) => metric.text())
    .join("");
}
