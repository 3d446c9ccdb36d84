// Fencing timings both sides must agree on. The node stops petting at most one detection window
// after it loses the cluster, and the watchdog fires one watchdog timeout later; the cluster
// side may free the node's workloads only after both, plus a margin (the kubelet renews its
// Lease every 10 s, so the Lease is up to 10 s older than the moment the node was lost, and
// clocks and schedulers are late). Deckhouse's fencing v1 used 60 s for both the watchdog and
// the Lease age: no margin at all.
import { NODE_KEYS } from "./names.ts";

/**
 * The maintenance annotation that holds fencing down, if any: the agent disarms and the
 * controller leaves the node alone. `approved` alone is every update, disruptive or not; it
 * counts only with a drain (the node is being emptied on purpose).
 */
export function maintenanceOf(annotations: Record<string, string>): string | undefined {
  if (NODE_KEYS.fencingDisable in annotations) return NODE_KEYS.fencingDisable;
  if (NODE_KEYS.disruptionApproved in annotations) return NODE_KEYS.disruptionApproved;
  if (NODE_KEYS.approved in annotations && (NODE_KEYS.draining in annotations || NODE_KEYS.drained in annotations))
    return `${NODE_KEYS.approved} (draining)`;
  return undefined;
}

export interface AgentTimings {
  /** How often the device is petted while the node is healthy. */
  petIntervalMs: number;
  /** How often the API (and, when it fails, the peers) is checked. */
  checkIntervalMs: number;
  /** Deadline of the API request. */
  apiTimeoutMs: number;
  /** Deadline of one peer's answer (connect + TLS + answer); peers are asked in parallel. */
  peerTimeoutMs: number;
  /** Consecutive bad verdicts before petting stops (one failed request never fences). */
  badRounds: number;
  /**
   * A check counts as bad once the kubelet, having renewed its Lease since this boot, has not
   * renewed it for longer than this (as the API shows it): the cluster side frees a node's
   * pods on the Lease's age alone, whatever the reason (a dead kubelet, an expired certificate),
   * so the node must be down before that. 0 turns the rule off.
   */
  kubeletStaleMs: number;
}

export const DEFAULT_AGENT_TIMINGS: AgentTimings = {
  petIntervalMs: 5_000,
  checkIntervalMs: 5_000,
  apiTimeoutMs: 4_000,
  peerTimeoutMs: 3_000,
  badRounds: 3,
  kubeletStaleMs: 20_000,
};

/** softdog's soft_margin as the agent sets it up. */
export const DEFAULT_WATCHDOG_TIMEOUT_SECONDS = 60;

/** One check round at its slowest: the API deadline, then the peers' deadline. */
export const roundMs = (t: AgentTimings) => Math.max(t.checkIntervalMs, t.apiTimeoutMs + t.peerTimeoutMs);

/**
 * Longest time from the moment a node loses the cluster to its last pet: the check in flight
 * may just have succeeded (one interval), then `badRounds` rounds at their slowest.
 * Defaults: 5 + 3 × max(5, 4 + 3) = 26 s.
 */
export const detectionWindowMs = (t: AgentTimings) => t.checkIntervalMs + t.badRounds * roundMs(t);

/**
 * Oldest the kubelet's Lease can be at the last pet when the kubelet stopped renewing it: the
 * first check that sees it older than `kubeletStaleMs`, then the remaining bad rounds (the API
 * answers on this path, so a round is a check interval, or the API deadline when longer).
 * Defaults: 20 + 3 × 5 = 35 s. Undefined when the rule is off.
 */
export const kubeletWindowMs = (t: AgentTimings) =>
  t.kubeletStaleMs > 0 ? t.kubeletStaleMs + t.badRounds * Math.max(t.checkIntervalMs, t.apiTimeoutMs) : undefined;

/** Pets stop when the last verdict is older than this (a hung check loop lets the device fire). */
export const verdictMaxAgeMs = (t: AgentTimings) => 2 * roundMs(t) + t.checkIntervalMs;

export interface ControllerTimings {
  /** Age of the kubelet Lease after which a node's workloads are freed. */
  thresholdSeconds: number;
  watchdogTimeoutSeconds: number;
  detectionWindowSeconds: number;
  /** A node's kubelet window (`kubeletWindowMs`), when it states one: the same rule applies to it. */
  kubeletWindowSeconds?: number;
  marginSeconds: number;
}

export const DEFAULT_CONTROLLER_TIMINGS: ControllerTimings = {
  thresholdSeconds: 120,
  watchdogTimeoutSeconds: DEFAULT_WATCHDOG_TIMEOUT_SECONDS,
  detectionWindowSeconds: Math.ceil(detectionWindowMs(DEFAULT_AGENT_TIMINGS) / 1000),
  kubeletWindowSeconds: Math.ceil((kubeletWindowMs(DEFAULT_AGENT_TIMINGS) ?? 0) / 1000),
  marginSeconds: 20,
};

/** Why these timings are unsafe, naming the numbers; undefined when they are safe. */
export function unsafeTimings(t: ControllerTimings): string | undefined {
  for (const [k, v] of Object.entries(t))
    if (v !== undefined && (!Number.isFinite(v) || v < 0))
      return `fencing timing ${k} must be a non-negative number, got ${v}`;
  const windows: [string, number][] = [["detection window", t.detectionWindowSeconds]];
  if (t.kubeletWindowSeconds !== undefined) windows.push(["kubelet window", t.kubeletWindowSeconds]);
  for (const [what, seconds] of windows) {
    const floor = t.watchdogTimeoutSeconds + seconds + t.marginSeconds;
    if (t.thresholdSeconds > floor) continue;
    return (
      `fencing threshold ${t.thresholdSeconds} s is not greater than watchdog timeout ${t.watchdogTimeoutSeconds} s` +
      ` + ${what} ${seconds} s + margin ${t.marginSeconds} s = ${floor} s:` +
      " a node could still run its pods when they are deleted; raise the threshold above" +
      ` ${floor} s or shorten the watchdog timeout or ${what}`
    );
  }
  return undefined;
}

/**
 * The Node annotation where an agent states its own timings (`watchdog=60s,detection=26s`, and
 * `,kubelet=35s` when its kubelet rule is on).
 */
export function formatAgentTimingsAnnotation(
  watchdogTimeoutSeconds: number,
  detectionWindowSeconds: number,
  kubeletWindowSeconds?: number,
): string {
  const kubelet = kubeletWindowSeconds === undefined ? "" : `,kubelet=${kubeletWindowSeconds}s`;
  return `watchdog=${watchdogTimeoutSeconds}s,detection=${detectionWindowSeconds}s${kubelet}`;
}

export function parseAgentTimingsAnnotation(
  s: string | undefined,
): { watchdogTimeoutSeconds: number; detectionWindowSeconds: number; kubeletWindowSeconds?: number } | undefined {
  const m = /^watchdog=(\d+)s,detection=(\d+)s(?:,kubelet=(\d+)s)?$/.exec(s ?? "");
  if (!m) return undefined;
  return {
    watchdogTimeoutSeconds: Number(m[1]),
    detectionWindowSeconds: Number(m[2]),
    ...(m[3] === undefined ? {} : { kubeletWindowSeconds: Number(m[3]) }),
  };
}
