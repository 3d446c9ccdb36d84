// The decision rule, pure: from this node's API check and its peers' answers, is the node part
// of the cluster? Modelled on medik8s self-node-remediation's peer rule (a majority of peers
// failing too means the control plane is down, not this node), with Deckhouse fencing-agent
// v1's mistake in view: there, every node stopped petting during a control-plane outage.
import type { ApiCheck } from "./health.ts";
import type { PeerAnswer } from "./peers.ts";

export type VerdictKind =
  /** The API answered (2xx, or 401/403/404: an answer all the same). */
  | "api"
  /** The API did not answer here, and most answering peers cannot reach it either. */
  | "outage"
  /** The group has no other fencing node to ask. */
  | "no-peers"
  /** Peers answered but none had a fresh view of the API: they are reachable, the API question stays open. */
  | "inconclusive"
  /** Peers reach the API; this node does not. */
  | "cut-off"
  /** The API answers, but the kubelet stopped renewing its Lease: the cluster will free the pods. */
  | "kubelet-stale"
  /** Neither the API nor any peer answered. */
  | "isolated";

export interface Verdict {
  healthy: boolean;
  /** Neither good nor bad: pets go on, but the count of bad rounds is not reset either. */
  neutral?: boolean;
  kind: VerdictKind;
  reason: string;
}

export interface DecideOptions {
  /** With no peer to ask, stop petting on API loss alone (default: keep petting). */
  fenceWithoutPeers: boolean;
  /** Kubelet Lease age (seconds) past which a reachable API is a bad verdict; undefined: off. */
  kubeletStaleSeconds?: number;
  /**
   * The kubelet renewed its Lease since this boot. Until then an old Lease is the one from before
   * the reboot: no container of this boot can be running without a kubelet that renewed it.
   */
  kubeletSeenAlive?: boolean;
  /**
   * How long this node has reached the API without a break. A kubelet cannot renew while the
   * API is away, so after an outage its Lease is old on every node at once: its age counts from
   * when the API came back (as the cluster side restarts its count after a gap in its watch).
   */
  apiReachableForSeconds?: number;
}

/**
 * The kubelet Lease's age as the kubelet rule counts it: since the last renewal, but never from
 * before the API last came back (a kubelet cannot renew while the API is away). The one place
 * the rule's age is computed: a check's verdict (here) and the pet timer's bound (decision.ts)
 * both use it. Any unit, the same for both arguments.
 */
export function kubeletRuleAge(leaseAge: number, apiReachableFor: number | undefined): number {
  return Math.min(leaseAge, apiReachableFor ?? Number.POSITIVE_INFINITY);
}

export function decide(api: ApiCheck, peers: PeerAnswer[] | undefined, knownPeers: number, o: DecideOptions): Verdict {
  if (api.reached) {
    const age =
      api.kubeletLeaseAgeSeconds === undefined
        ? undefined
        : kubeletRuleAge(api.kubeletLeaseAgeSeconds, o.apiReachableForSeconds);
    if (
      api.result === "ok" &&
      o.kubeletSeenAlive &&
      o.kubeletStaleSeconds !== undefined &&
      age !== undefined &&
      age > o.kubeletStaleSeconds
    ) {
      return {
        healthy: false,
        kind: "kubelet-stale",
        reason:
          `API answered, but the kubelet has not renewed its Lease for ${api.kubeletLeaseAgeSeconds} s` +
          ` (${Math.round(age)} s while the API answered; limit ${o.kubeletStaleSeconds} s):` +
          " the cluster frees this node's pods on that age alone, so the node must be down first",
      };
    }
    const reason =
      api.result === "auth"
        ? `API answered ${api.detail ?? "401/403"}: connected (credentials need a reload, which is not isolation)`
        : api.result === "no-lease"
          ? "API answered; the kubelet has no Lease yet"
          : `API answered in ${api.durationMs} ms`;
    return { healthy: true, kind: "api", reason };
  }
  const apiWhy = `API ${api.result}${api.detail ? ` (${api.detail})` : ""}`;
  if (knownPeers === 0) {
    return o.fenceWithoutPeers
      ? { healthy: false, kind: "no-peers", reason: `${apiWhy}; no peer to ask and fencing without peers is on` }
      : {
          healthy: true,
          kind: "no-peers",
          reason: `${apiWhy}; no peer in the group to tell an outage from isolation, so the node is kept`,
        };
  }
  const all = peers ?? [];
  const reaches = all.filter((p) => p.outcome === "reaches-api").length;
  const noApi = all.filter((p) => p.outcome === "no-api").length;
  const stale = all.filter((p) => p.outcome === "stale").length;
  const answered = reaches + noApi;
  const tally = `${reaches} reach the API, ${noApi} do not, ${stale} stale, ${all.length - answered - stale} no answer (of ${all.length} asked)`;
  if (answered === 0 && stale > 0)
    return {
      healthy: true,
      neutral: true,
      kind: "inconclusive",
      reason: `${apiWhy}; peers: ${tally}; peers are reachable, their view of the API is old`,
    };
  if (answered === 0) return { healthy: false, kind: "isolated", reason: `${apiWhy}; peers: ${tally}` };
  if (noApi * 2 > answered)
    return { healthy: true, kind: "outage", reason: `${apiWhy}; peers: ${tally}: a control-plane outage` };
  return { healthy: false, kind: "cut-off", reason: `${apiWhy}; peers: ${tally}: this node is cut off` };
}
