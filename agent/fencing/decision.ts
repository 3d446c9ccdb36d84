// The fencing decision as a pure state machine (the shape of agent/early-oom/trigger.ts): what
// one check round does to the node's standing, and whether a pet may go out now. No I/O and no
// clock of its own: every time comes in as `now`, so each rule reads here once and is tested
// without a device, an API server or a timer (test/unit/fencing-decision.test.ts). The
// runnables around it carry out what it says: the pet timer asks petAllowed() before every pet,
// the check loop feeds each round to next() and acts on the change it reports.
//
// One round's evidence is judged by decide() (decide.ts); this module keeps what spans rounds:
// the count of bad verdicts, whether the pets are stopped, and what the kubelet rule has learnt
// about the kubelet's Lease (seen alive since this boot, the newest renewal, since when the API
// has answered).
import { type AgentTimings, kubeletWindowMs, verdictMaxAgeMs } from "../../bundles/fencing.ts";
import { decide, kubeletRuleAge, type Verdict } from "./decide.ts";
import type { ApiCheck } from "./health.ts";
import type { PeerAnswer } from "./peers.ts";

/** What the node was configured with; fixed for the life of the agent. */
export interface Rules {
  /** Bad verdicts in a row that stop the pets (one failed round is a blip). */
  badRounds: number;
  /** Pets stop when the last verdict is older than this: a hung check loop lets the device fire. */
  verdictMaxAgeMs: number;
  /** A kubelet Lease older than this (seconds) while the API answers is a bad check; undefined: off. */
  kubeletStaleSeconds: number | undefined;
  /** No pet once the Lease, counted as the rule counts it, is older than this; undefined: off. */
  kubeletWindowMs: number | undefined;
  /** With no peer to ask, API loss alone is a bad round. */
  fenceWithoutPeers: boolean;
  /** When this boot started (epoch ms): a Lease renewed before it is the previous boot's. */
  bootedAt: number;
}

export function rulesOf(t: AgentTimings, o: { fenceWithoutPeers: boolean; bootedAt: number }): Rules {
  return {
    badRounds: t.badRounds,
    verdictMaxAgeMs: verdictMaxAgeMs(t),
    kubeletStaleSeconds: t.kubeletStaleMs > 0 ? t.kubeletStaleMs / 1000 : undefined,
    kubeletWindowMs: kubeletWindowMs(t),
    fenceWithoutPeers: o.fenceWithoutPeers,
    bootedAt: o.bootedAt,
  };
}

/** What the kubelet rule knows; kept across an agent restart within the same boot (status-file.ts). */
export interface KubeletFacts {
  /** The kubelet renewed its Lease since this boot: the rule applies from then on. */
  readonly seenAlive: boolean;
  /**
   * Since when the API has answered (epoch ms); undefined after a round showing the API away
   * for everyone (an outage: the kubelet could not renew either, and the cluster side restarts
   * its count). A check failing only here (cut off) does not reset it: the cluster keeps counting.
   */
  readonly apiReachableSince?: number | undefined;
  /** The newest renewal of the kubelet's Lease seen (epoch ms, this machine's clock). */
  readonly renewSeenAt?: number | undefined;
}

export interface FencingState {
  readonly rules: Rules;
  /** The last verdict and when it was made; the pet timer trusts only a fresh one. */
  readonly verdict?: (Verdict & { at: number }) | undefined;
  /** Bad verdicts in a row. */
  readonly badRounds: number;
  /** The pets were stopped by bad verdicts: the node is being fenced. */
  readonly fencing: boolean;
  /** The last API check, recorded as soon as it returns (checked()), before the peers answer. */
  readonly lastCheck?: ApiCheck | undefined;
  readonly kubelet: KubeletFacts;
}

export function initialState(rules: Rules): FencingState {
  return { rules, badRounds: 0, fencing: false, kubelet: { seenAlive: false } };
}

/** One check round's evidence: this node's API check and, when it failed, what the peers said. */
export interface Round {
  api: ApiCheck;
  /** Undefined when no peer was asked (the API answered, or there is no peer). */
  answers: PeerAnswer[] | undefined;
  /** Fencing peers the node knows of (0: a lone node). */
  knownPeers: number;
}

export interface Transition {
  state: FencingState;
  verdict: Verdict;
  /** "fenced": this round stopped the pets; "recovered": a healthy verdict resumed them. */
  change: "fenced" | "recovered" | undefined;
  /** The kubelet renewed its Lease since this boot, seen for the first time: the rule applies from now on. */
  kubeletWatched: boolean;
}

/**
 * The state after an agent restart, from what the previous agent left in its status file: a
 * fence in progress stays in progress (the device is not re-opened: an open is a pet) and the
 * count of bad rounds carries over, so a crash loop cannot postpone a fence; the kubelet facts
 * carry over so a crash cannot restart the kubelet count either.
 */
export function resumed(
  s: FencingState,
  previous: { fencing: boolean; badRounds: number } | undefined,
  kubelet: KubeletFacts | undefined,
): FencingState {
  const k = kubelet
    ? {
        seenAlive: s.kubelet.seenAlive || kubelet.seenAlive,
        apiReachableSince: s.kubelet.apiReachableSince ?? kubelet.apiReachableSince,
        renewSeenAt: s.kubelet.renewSeenAt ?? kubelet.renewSeenAt,
      }
    : s.kubelet;
  if (previous?.fencing) return { ...s, kubelet: k, fencing: true, badRounds: previous.badRounds };
  if (previous && previous.badRounds > 0) return { ...s, kubelet: k, badRounds: previous.badRounds };
  return { ...s, kubelet: k };
}

/**
 * Armed at start-up before any API answer (after a crash the pets must resume well inside the
 * watchdog timeout): the start-up verdict counts as healthy only until the first check decides.
 * Nothing changes while a fence is in progress.
 */
export function starting(s: FencingState, now: number): FencingState {
  if (s.fencing) return s;
  return { ...s, verdict: { healthy: true, kind: "api", reason: "starting: first check in flight", at: now } };
}

/** Records an API check the moment it returns: the peer endpoint and the pet rule read it at once. */
export function checked(s: FencingState, api: ApiCheck): FencingState {
  return { ...s, lastCheck: api };
}

/** The next state after one round, and what changed. */
export function next(s: FencingState, round: Round, now: number): Transition {
  const { api, answers, knownPeers } = round;
  const r = s.rules;
  let { seenAlive, apiReachableSince, renewSeenAt } = s.kubelet;
  if (api.kubeletLeaseRenewedAt !== undefined) renewSeenAt = Math.max(renewSeenAt ?? 0, api.kubeletLeaseRenewedAt);
  const age = api.result === "ok" ? api.kubeletLeaseAgeSeconds : undefined;
  // Renewed since this boot (a fast reboot leaves a Lease young enough to pass for alive).
  const sinceBoot = (api.kubeletLeaseRenewedAt ?? 0) > r.bootedAt;
  const kubeletWatched =
    !seenAlive && r.kubeletStaleSeconds !== undefined && age !== undefined && age <= r.kubeletStaleSeconds && sinceBoot;
  if (kubeletWatched) seenAlive = true;
  if (api.reached) apiReachableSince ??= api.at;
  const verdict = decide(api, answers, knownPeers, {
    apiReachableForSeconds: api.reached ? (now - (apiReachableSince ?? now)) / 1000 : 0,
    fenceWithoutPeers: r.fenceWithoutPeers,
    kubeletStaleSeconds: r.kubeletStaleSeconds,
    kubeletSeenAlive: seenAlive,
  });
  // Away for everyone (or no one to tell): the kubelets could not renew either.
  if (verdict.kind === "outage" || verdict.kind === "no-peers" || verdict.kind === "inconclusive")
    apiReachableSince = undefined;
  const badRounds = verdict.neutral ? s.badRounds : verdict.healthy ? 0 : s.badRounds + 1;
  const change =
    verdict.healthy && s.fencing
      ? "recovered"
      : !verdict.healthy && !s.fencing && badRounds >= r.badRounds
        ? "fenced"
        : undefined;
  return {
    state: {
      ...s,
      lastCheck: api,
      verdict: { ...verdict, at: now },
      badRounds,
      fencing: change === "fenced" ? true : change === "recovered" ? false : s.fencing,
      kubelet: { seenAlive, apiReachableSince, renewSeenAt },
    },
    verdict,
    change,
    kubeletWatched,
  };
}

/**
 * The kubelet Lease's age now, as the rule counts it (kubeletRuleAge), when the rule has
 * something to count: it is on, the kubelet was seen alive, and the last check read the Lease
 * (none: the cluster side has nothing to count either). Undefined before this process's first
 * check, so a restarted agent's first pet goes out at once.
 */
export function kubeletAgeMs(s: FencingState, now: number): number | undefined {
  const k = s.kubelet;
  if (s.rules.kubeletWindowMs === undefined || !k.seenAlive) return undefined;
  if (s.lastCheck?.result !== "ok" || s.lastCheck.kubeletLeaseRenewedAt === undefined) return undefined;
  if (k.renewSeenAt === undefined || k.apiReachableSince === undefined) return undefined;
  return kubeletRuleAge(now - k.renewSeenAt, now - k.apiReachableSince);
}

export type PetDecision =
  | { ok: true }
  | { ok: false; why: "no-verdict" | "fencing" | "stale-verdict"; reason: string }
  | { ok: false; why: "kubelet-window"; reason: string; kubeletAgeMs: number; kubeletWindowMs: number };

/**
 * Whether a pet may go out now. Pets stop after `badRounds` bad verdicts in a row (not the
 * first), when the check loop stopped deciding (a stale verdict), and, as the kubelet rule's
 * hard bound, once the kubelet's Lease is older than the kubelet window the node stated: rounds
 * can take longer than the window assumes (a slow API, a label patch), the pet timer cannot.
 */
export function petAllowed(s: FencingState, now: number): PetDecision {
  const v = s.verdict;
  if (!v) return { ok: false, why: "no-verdict", reason: "no verdict yet" };
  if (s.fencing) return { ok: false, why: "fencing", reason: `fencing: ${s.badRounds} bad verdicts in a row` };
  const verdictAge = now - v.at;
  if (verdictAge > s.rules.verdictMaxAgeMs)
    return {
      ok: false,
      why: "stale-verdict",
      reason: `the last verdict is ${verdictAge} ms old (limit ${s.rules.verdictMaxAgeMs} ms): the check loop stopped deciding`,
    };
  const age = kubeletAgeMs(s, now);
  const windowMs = s.rules.kubeletWindowMs;
  if (age !== undefined && windowMs !== undefined && age > windowMs)
    return {
      ok: false,
      why: "kubelet-window",
      reason: `the kubelet's Lease is ${age} ms old, counted as the rule counts it (window ${windowMs} ms)`,
      kubeletAgeMs: age,
      kubeletWindowMs: windowMs,
    };
  return { ok: true };
}

/**
 * After fencing stops: a fence in progress (pets stopped, device left armed) stays one, so a
 * restarted agent keeps it; otherwise the count starts afresh. What the kubelet rule learnt stays.
 */
export function stopped(s: FencingState, fenceInProgress: boolean): FencingState {
  return fenceInProgress ? s : { ...s, fencing: false, badRounds: 0 };
}
