// The update controller's decision for one node group, as a pure function of what the API
// shows: which Nodes to approve, which to mark for draining or replacement, which are done,
// and why each other one waits. Level-triggered: the same state always gives the same answer,
// so a new leader (or a missed event) only ever repeats a decision, never invents one.
//
// The handshake, per node (the node side writes the odd steps):
//   1. node: waiting-for-approval                 → controller: approved (≤ maxConcurrent)
//   2. node: disruption-required                  → controller, by approvalMode:
//        Manual:         nothing; the operator sets disruption-approved
//        Automatic:      draining=bashible → (drain) → drained=bashible → disruption-approved
//                        (inside automatic.windows; drainBeforeApproval: false skips the drain)
//        RollingUpdate:  rolling-update (the node is to be replaced, not disrupted)
//   3. node: configuration-checksum = the group's → controller, once the node is Ready:
//        clears the update annotations and uncordons the node if it cordoned it.
import { EVENTS, NODE_KEYS } from "../../bundles/names.ts";
import { concurrency, DRAIN_SOURCE, type GroupPolicy, type NodeView } from "./model.ts";
import { formatUtc, windowState } from "./windows.ts";

export interface NodePatch {
  node: string;
  /** null removes the key (JSON merge patch). */
  annotations: Record<string, string | null>;
  unschedulable?: boolean;
}

export interface NodeEvent {
  node: string;
  reason: string;
  message: string;
  type: "Normal" | "Warning";
}

export interface GroupStatus {
  nodes: number;
  ready: number;
  upToDate: number;
  approved: number;
  waitingForApproval: number;
  waitingForDisruptionApproval: number;
  draining: number;
  waitingForReplacement: number;
  message: string;
}

export interface GroupDecision {
  /** Writes to make, each with the Event that explains it. */
  actions: { patch: NodePatch; event: NodeEvent }[];
  /** Nodes left waiting, with the reason (an Event when the reason changes). */
  waits: NodeEvent[];
  status: GroupStatus;
  /** When the answer may change with no input changing (a maintenance window opens). */
  wakeAt: number | undefined;
}

const has = (n: NodeView, key: string) => n.annotations[key] !== undefined;
const short = (checksum: string) => checksum.slice(0, 12);

/** Keys cleared once a node is up to date. */
const DONE_CLEARS = [
  NODE_KEYS.approved,
  NODE_KEYS.waitingForApproval,
  NODE_KEYS.disruptionRequired,
  NODE_KEYS.disruptionApproved,
  NODE_KEYS.rollingUpdate,
  NODE_KEYS.drained,
  NODE_KEYS.drainStartedAt,
  NODE_KEYS.cordoned,
];

function names(nodes: NodeView[], max = 3): string {
  const shown = nodes.slice(0, max).map((n) => n.name);
  return nodes.length > max ? `${shown.join(", ")} and ${nodes.length - max} more` : shown.join(", ");
}

/**
 * Why a node that needs a disruption is approved without the drain drainBeforeApproval asks
 * for: Deckhouse's exceptions (update_approval.go). The only node of group master is not
 * drained (its control plane would stop, and it reboots fine undrained); a node someone else
 * cordoned (not this controller, whose cordon is marked) is taken as prepared by them.
 */
function noDrainReason(policy: GroupPolicy, nodes: readonly NodeView[], n: NodeView): string | undefined {
  if (policy.name === "master" && nodes.length === 1)
    return "it is the only node of node group master (draining it would stop the control plane)";
  if (n.unschedulable && !has(n, NODE_KEYS.cordoned) && !has(n, NODE_KEYS.draining))
    return "it was cordoned before by someone else, who is taken to have prepared it; it stays cordoned";
  return undefined;
}

export function decideGroup(
  policy: GroupPolicy,
  nodes: readonly NodeView[],
  desired: string | undefined,
  now: number,
): GroupDecision {
  const sorted = [...nodes].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  const actions: GroupDecision["actions"] = [];
  const waits: NodeEvent[] = [];
  const touched = new Set<string>();
  const group = policy.name;
  let wakeAt: number | undefined;
  const act = (patch: NodePatch, reason: string, message: string) => {
    touched.add(patch.node);
    actions.push({ patch, event: { node: patch.node, reason, message, type: "Normal" } });
  };
  const wait = (n: NodeView, reason: string, message: string, type: "Normal" | "Warning" = "Normal") =>
    waits.push({ node: n.name, reason, message, type });

  /** Nodes cleared in this pass: their update slot is free again. */
  const finished = new Set<string>();
  // 1. Nodes that finished: their checksum is the group's and they are Ready.
  for (const n of sorted) {
    const inFlight = DONE_CLEARS.some((k) => k !== NODE_KEYS.waitingForApproval && has(n, k));
    // Still asking for something; a disruption-required an operator approved (Manual) is not.
    const busy =
      [NODE_KEYS.waitingForApproval, NODE_KEYS.draining, NODE_KEYS.reboot].some((k) => has(n, k)) ||
      (has(n, NODE_KEYS.disruptionRequired) && !has(n, NODE_KEYS.disruptionApproved));
    if (!inFlight || busy || !desired || n.annotations[NODE_KEYS.checksum] !== desired || !n.ready) continue;
    const annotations: Record<string, string | null> = {};
    for (const k of DONE_CLEARS) if (has(n, k)) annotations[k] = null;
    const uncordon = has(n, NODE_KEYS.cordoned);
    finished.add(n.name);
    act(
      { node: n.name, annotations, ...(uncordon ? { unschedulable: false } : {}) },
      EVENTS.updateFinished,
      `configuration ${short(desired)} of node group ${group} applied and the node is Ready: update annotations cleared${uncordon ? ", node uncordoned" : ""}`,
    );
  }

  if (policy.error) {
    for (const n of sorted) {
      if (touched.has(n.name)) continue;
      if (has(n, NODE_KEYS.waitingForApproval) || has(n, NODE_KEYS.disruptionRequired))
        wait(n, EVENTS.groupMisconfigured, `${policy.error}; nothing is approved until it is fixed`, "Warning");
    }
    return { actions, waits, status: status(policy, sorted, desired, policy.error), wakeAt };
  }

  // 2. Disruptions asked for by nodes (they only ask once approved, so no extra limit here).
  const window = windowState(policy.approvalMode === "Automatic" ? policy.windows : undefined, now);
  for (const n of sorted) {
    if (touched.has(n.name)) continue;
    if (has(n, NODE_KEYS.rollingUpdate)) {
      wait(
        n,
        EVENTS.rollingUpdate,
        `waits to be replaced (node group ${group}, approvalMode ${policy.approvalMode}): delete the node and join a new one; it is not disrupted in place`,
      );
      continue;
    }
    if (!has(n, NODE_KEYS.disruptionRequired) || has(n, NODE_KEYS.disruptionApproved)) continue;
    if (policy.approvalMode === "Manual") {
      wait(
        n,
        EVENTS.disruptionWaiting,
        `waits for disruption approval (node group ${group}, approvalMode Manual): drain the node if needed, then kubectl annotate node ${n.name} ${NODE_KEYS.disruptionApproved}=`,
      );
      continue;
    }
    if (policy.approvalMode === "RollingUpdate") {
      act(
        { node: n.name, annotations: { [NODE_KEYS.rollingUpdate]: "" } },
        EVENTS.rollingUpdate,
        `needs a disruptive update; node group ${group} has approvalMode RollingUpdate, so the node is marked for replacement instead`,
      );
      continue;
    }
    const draining = has(n, NODE_KEYS.draining);
    const drained = has(n, NODE_KEYS.drained);
    if (!window.open) {
      wakeAt = window.nextChange;
      wait(
        n,
        EVENTS.disruptionWaiting,
        `waits for a maintenance window of node group ${group} (disruptions.automatic.windows)${window.nextChange ? `; the next opens ${formatUtc(window.nextChange)}` : ""}${draining ? "; draining meanwhile" : drained ? "; drained" : ""}`,
      );
      continue;
    }
    const skip = drained ? undefined : noDrainReason(policy, sorted, n);
    if (!policy.drainBeforeApproval || drained || skip) {
      act(
        { node: n.name, annotations: { [NODE_KEYS.disruptionApproved]: "", [NODE_KEYS.disruptionRequired]: null } },
        EVENTS.disruptionApproved,
        `disruption approved (node group ${group}, approvalMode Automatic${!policy.drainBeforeApproval ? ", drainBeforeApproval false" : drained ? ", node drained" : `; not drained: ${skip}`})`,
      );
      continue;
    }
    if (draining) continue; // the drain reports its own progress
    act(
      { node: n.name, annotations: { [NODE_KEYS.draining]: DRAIN_SOURCE } },
      EVENTS.draining,
      `needs a disruptive update: cordoning and draining before approval (node group ${group}, approvalMode Automatic)`,
    );
  }
  if (window.open && window.nextChange !== undefined && policy.windows.length) {
    // A drained node approved now would not be once the window closes: look again then.
    wakeAt = Math.min(wakeAt ?? Number.POSITIVE_INFINITY, window.nextChange);
  }

  // 3. Update approval: at most maxConcurrent at a time; while any node is not Ready, only
  // nodes that are not Ready (they cannot get worse).
  const max = concurrency(policy.maxConcurrent, sorted.length);
  // A node drained or approved to disrupt in this pass (step 2) still updates: it keeps its slot.
  const approved = sorted.filter((n) => has(n, NODE_KEYS.approved) && !finished.has(n.name));
  const waiting = sorted.filter(
    (n) => has(n, NODE_KEYS.waitingForApproval) && !has(n, NODE_KEYS.approved) && !touched.has(n.name),
  );
  const notReady = sorted.filter((n) => !n.ready);
  const candidates = notReady.length ? waiting.filter((n) => !n.ready) : waiting;
  let free = max - approved.length;
  for (const n of candidates) {
    if (free <= 0) break;
    free--;
    act(
      { node: n.name, annotations: { [NODE_KEYS.approved]: "", [NODE_KEYS.waitingForApproval]: null } },
      EVENTS.updateApproved,
      `update approved: ${max - free} of at most ${max} nodes of group ${group} updating (spec.update.maxConcurrent ${policy.maxConcurrent})${n.ready ? "" : "; the node is not Ready, so it goes first"}`,
    );
  }
  for (const n of waiting) {
    if (touched.has(n.name)) continue;
    if (notReady.length && n.ready) {
      wait(
        n,
        EVENTS.updateWaiting,
        `waits for approval: node${notReady.length > 1 ? "s" : ""} ${names(notReady)} of group ${group} ${notReady.length > 1 ? "are" : "is"} not Ready, and Ready nodes are approved only while every node of the group is Ready`,
      );
    } else {
      wait(
        n,
        EVENTS.updateWaiting,
        `waits for a free update slot: at most ${max} nodes of group ${group} update at a time (spec.update.maxConcurrent ${policy.maxConcurrent})`,
      );
    }
  }
  return { actions, waits, status: status(policy, sorted, desired, undefined, actions), wakeAt };
}

/** Counts as they will be once `actions` land (so status does not lag one pass behind). */
function status(
  policy: GroupPolicy,
  nodes: NodeView[],
  desired: string | undefined,
  error: string | undefined,
  actions: GroupDecision["actions"] = [],
): GroupStatus {
  const after = new Map(nodes.map((n) => [n.name, { ...n.annotations }]));
  for (const { patch } of actions) {
    const a = after.get(patch.node);
    if (!a) continue;
    for (const [k, v] of Object.entries(patch.annotations)) {
      if (v === null) delete a[k];
      else a[k] = v;
    }
  }
  const count = (pred: (a: Record<string, string>, n: NodeView) => boolean) =>
    nodes.filter((n) => pred(after.get(n.name) ?? {}, n)).length;
  const s: GroupStatus = {
    nodes: nodes.length,
    ready: count((_, n) => n.ready),
    upToDate: desired ? count((a) => a[NODE_KEYS.checksum] === desired) : 0,
    approved: count((a) => a[NODE_KEYS.approved] !== undefined),
    waitingForApproval: count(
      (a) => a[NODE_KEYS.waitingForApproval] !== undefined && a[NODE_KEYS.approved] === undefined,
    ),
    waitingForDisruptionApproval: count(
      (a) =>
        a[NODE_KEYS.disruptionRequired] !== undefined &&
        a[NODE_KEYS.disruptionApproved] === undefined &&
        a[NODE_KEYS.draining] === undefined &&
        a[NODE_KEYS.rollingUpdate] === undefined,
    ),
    draining: count((a) => a[NODE_KEYS.draining] !== undefined),
    waitingForReplacement: count((a) => a[NODE_KEYS.rollingUpdate] !== undefined),
    message: "",
  };
  const parts = [`${s.upToDate}/${s.nodes} up to date`];
  if (s.ready < s.nodes) parts.push(`${s.nodes - s.ready} not Ready`);
  if (s.approved) parts.push(`${s.approved} updating`);
  if (s.waitingForApproval) parts.push(`${s.waitingForApproval} waiting for approval`);
  if (s.draining) parts.push(`${s.draining} draining`);
  if (s.waitingForDisruptionApproval)
    parts.push(`${s.waitingForDisruptionApproval} waiting for disruption approval (${policy.approvalMode})`);
  if (s.waitingForReplacement) parts.push(`${s.waitingForReplacement} waiting for replacement`);
  s.message = error ? `${error}; ${parts.join(", ")}` : parts.join(", ");
  return s;
}
