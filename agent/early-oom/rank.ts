// Which pod goes first, the way the kubelet ranks pods for eviction under memory pressure
// (pkg/kubelet/eviction: orderedBy(exceedMemoryRequests, priority, memory)): pods using more
// than they requested first, then lower priority, then the most memory above the request.
// Before that ordering, three tiers: pods matched to their Pod object; pods found in the cgroup
// tree without one (request and priority unknown); and protected pods (Guaranteed, or priority
// at or above protectedPriority), which go only when nothing else is left. Excluded pods never
// go: those the kubelet itself never evicts (static pods, matched through their mirror pod or
// known by the manifest UID their cgroup carries; priority at or above system-cluster-critical),
// and those the settings exclude (namespace or label).
import type { EarlyOomConfig } from "./config.ts";
import type { PodCgroup } from "./cgroups.ts";
import { isManifestUid, type PodFacts, type QosClass } from "./pods.ts";
import { bytes } from "./format.ts";

export type Tier = "pod" | "unmatched" | "protected";
const TIER_ORDER: Record<Tier, number> = { pod: 0, unmatched: 1, protected: 2 };

export interface Candidate {
  cgroup: PodCgroup;
  pod: PodFacts | undefined;
  qos: QosClass;
  /** Working set, bytes. */
  usage: number;
  /** Memory request (0 when unknown: an unmatched pod counts as exceeding, as BestEffort does). */
  request: number;
  priority: number;
  exceeds: boolean;
  tier: Tier;
}

export interface RankedCandidate extends Candidate {
  rank: number;
  /** The pod's figures, its tier, and what put it ahead of the next one (for logs and Events). */
  reason: string;
  /** What put it ahead of the next one ("" for the last). */
  why: string;
  /** Why its tier: protected, or no Pod object. */
  note: string | undefined;
}

export interface Excluded {
  cgroup: PodCgroup;
  pod: PodFacts | undefined;
  reason: string;
}

export interface Ranking {
  ranked: RankedCandidate[];
  excluded: Excluded[];
}

type Cfg = Pick<EarlyOomConfig, "excludeNamespaces" | "excludeLabels" | "protectedPriority">;

export const podLabel = (c: { cgroup: PodCgroup; pod: PodFacts | undefined }) =>
  c.pod ? `${c.pod.namespace}/${c.pod.name}` : `pod ${c.cgroup.uid} (no Pod object)`;

function exclusion(cfg: Cfg, cg: PodCgroup, pod: PodFacts | undefined): string | undefined {
  if (!pod)
    return isManifestUid(cg.uid)
      ? "static pod (its cgroup carries a manifest UID; no mirror pod known): the kubelet never evicts it"
      : undefined;
  if (pod.neverEvicted) return pod.neverEvicted;
  if (cfg.excludeNamespaces.includes(pod.namespace)) return `namespace ${pod.namespace} is excluded`;
  for (const sel of cfg.excludeLabels) {
    const eq = sel.indexOf("=");
    const key = eq < 0 ? sel : sel.slice(0, eq);
    const v = pod.labels[key];
    if (v !== undefined && (eq < 0 || v === sel.slice(eq + 1))) return `label ${sel} is excluded`;
  }
  return undefined;
}

/** The kubelet's comparator; negative when a goes first. */
function kubeletOrder(a: Candidate, b: Candidate): number {
  if (a.exceeds !== b.exceeds) return a.exceeds ? -1 : 1;
  if (a.priority !== b.priority) return a.priority - b.priority;
  return b.usage - b.request - (a.usage - a.request);
}

function compare(a: Candidate, b: Candidate): number {
  return (
    TIER_ORDER[a.tier] - TIER_ORDER[b.tier] ||
    kubeletOrder(a, b) ||
    b.usage - a.usage ||
    podLabel(a).localeCompare(podLabel(b))
  );
}

function note(c: Candidate, protectedPriority: number): string | undefined {
  if (c.tier === "protected")
    return c.qos === "Guaranteed"
      ? "protected (Guaranteed): only when nothing else is left"
      : `protected (priority ≥ ${protectedPriority}): only when nothing else is left`;
  if (c.tier === "unmatched") return "no Pod object: after every matched pod";
  return undefined;
}

function facts(c: Candidate): string {
  const req = c.pod ? bytes(c.request) : "unknown";
  const rel = c.exceeds ? ">" : "≤";
  const prio = c.pod ? String(c.priority) : "unknown";
  const above = c.usage - c.request;
  const parts = [
    `working set ${bytes(c.usage)} ${rel} request ${req}`,
    `priority ${prio}`,
    `${c.qos}`,
    above > 0 ? `${bytes(above)} above request` : `${bytes(-above)} under request`,
  ];
  return parts.join(", ");
}

function ahead(a: Candidate, b: Candidate | undefined): string {
  if (!b) return "";
  if (a.tier !== b.tier) {
    if (b.tier === "protected") return "the next is protected";
    return "the next has no Pod object";
  }
  if (a.exceeds !== b.exceeds) return "exceeds its request, the next does not";
  if (a.priority !== b.priority) return `lower priority than the next (${a.priority} < ${b.priority})`;
  if (a.usage - a.request !== b.usage - b.request) return "more memory above its request than the next";
  return "tie on the kubelet's keys; larger working set";
}

export function rankCandidates(cgroups: PodCgroup[], pods: Map<string, PodFacts>, cfg: Cfg): Ranking {
  const excluded: Excluded[] = [];
  const candidates: Candidate[] = [];
  for (const cg of cgroups) {
    const pod = pods.get(cg.uid);
    const why = exclusion(cfg, cg, pod);
    if (why) {
      excluded.push({ cgroup: cg, pod, reason: why });
      continue;
    }
    const qos = pod?.qos ?? cg.qos;
    const request = pod?.request ?? 0;
    const priority = pod?.priority ?? 0;
    const isProtected = qos === "Guaranteed" || (pod !== undefined && priority >= cfg.protectedPriority);
    candidates.push({
      cgroup: cg,
      pod,
      qos,
      usage: cg.workingSet,
      request,
      priority,
      exceeds: cg.workingSet > request,
      tier: isProtected ? "protected" : pod ? "pod" : "unmatched",
    });
  }
  candidates.sort(compare);
  excluded.sort((a, b) => podLabel(a).localeCompare(podLabel(b)));
  const ranked = candidates.map((c, i) => {
    const why = ahead(c, candidates[i + 1]);
    const n = note(c, cfg.protectedPriority);
    return {
      ...c,
      rank: i + 1,
      why,
      note: n,
      reason: [facts(c), n].filter(Boolean).join(", ") + (why ? `; ${why}` : ""),
    };
  });
  return { ranked, excluded };
}
