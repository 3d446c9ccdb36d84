// What an Instance (deckhouse.io/v1alpha1) says about a static Node, derived from what the
// cluster sees: the Node (its taints and update annotations), the group's checksum in Secret
// configuration-checksums, and the Events the agent posts on the Node (BashibleNodeUpdate
// "converge to X started|failed", BashibleStepFailed with the step's log tail,
// BashibleBundleRejected). The conditions are the ones Deckhouse's bashible helpers patch
// (bashbooster 63_status.sh): BashibleReady, WaitingApproval, WaitingDisruptionApproval, with
// their reasons; bashibleStatus and message summarise them as Deckhouse's Instance controller
// does. Pure; instance-controller.ts writes it.
import { EVENTS, NODE_KEYS } from "../../bundles/names.ts";
import type { CachedNode } from "./node-cache.ts";

export type ConditionStatus = "True" | "False" | "Unknown";

export interface InstanceCondition {
  type: "BashibleReady" | "WaitingApproval" | "WaitingDisruptionApproval";
  status: ConditionStatus;
  reason: string;
  message: string;
  lastTransitionTime: string;
}

export type BashibleStatus = "Ready" | "Error" | "WaitingApproval" | "Unknown";

export interface InstanceStatus {
  nodeRef: { name: string };
  currentStatus: { phase: "Provisioning" | "Running"; lastUpdateTime: string };
  bootstrapStatus?: { description: string };
  conditions: InstanceCondition[];
  bashibleStatus: BashibleStatus;
  message: string;
}

/** An Event the agent posted on its Node, reduced to what the derivation reads. */
export interface AgentEvent {
  reason: string;
  type: string;
  message: string;
  /** When it happened (ms), then the order it was written in: Events of one second sort by it. */
  at: number;
  order: number;
}

/** Where the node's converge stands, as far as the cluster can tell. */
export interface ConvergeState {
  status: ConditionStatus;
  reason: "StepsCompleted" | "StepsFailed" | "Error" | "InitialRunInProgress" | "UpdateInProgress";
  message: string;
  /** The step that failed last (StepsFailed). */
  step?: string;
}

const AGENT_REASONS = new Set<string>([EVENTS.nodeUpdate, EVENTS.stepFailed, EVENTS.bundleRejected]);
export const isAgentEvent = (reason: string) => AGENT_REASONS.has(reason);

const short = (c: string) => c.slice(0, 12);
const STEP = /^step (\S+) failed/;
const later = (a: AgentEvent, b: AgentEvent | undefined) => !b || a.at > b.at || (a.at === b.at && a.order > b.order);

/** The last Event of each kind, in the order they happened. */
function lastOf(events: readonly AgentEvent[], pick: (e: AgentEvent) => boolean): AgentEvent | undefined {
  let last: AgentEvent | undefined;
  for (const e of events) if (pick(e) && later(e, last)) last = e;
  return last;
}

/** Whether the first converge has not finished yet (the kubelet's taint is still there). */
export const provisioning = (n: CachedNode) => n.taints.some((t) => t.key === NODE_KEYS.uninitializedTaint);

/**
 * BashibleReady from the Node and the agent's Events. A failure counts only when it is a
 * converge to the group's current checksum (a failure of an older bundle is history), and it
 * stays until the node applies that checksum, so the condition does not flap while the agent
 * retries.
 */
export function convergeState(
  node: CachedNode,
  desired: string | undefined,
  events: readonly AgentEvent[],
): ConvergeState {
  const applied = node.annotations[NODE_KEYS.checksum];
  if (desired && applied === desired)
    return {
      status: "True",
      reason: "StepsCompleted",
      message: `configuration ${short(desired)} of node group ${node.group} applied`,
    };
  const mine = (verb: string) => (e: AgentEvent) =>
    e.reason === EVENTS.nodeUpdate && !!desired && e.message.startsWith(`converge to ${short(desired)} ${verb}`);
  const failed = lastOf(events, mine("failed"));
  const started = lastOf(events, mine("started"));
  if (failed) {
    // The step's own Event carries the log tail; the run's failure names the step.
    const stepEvent = lastOf(events, (e) => e.reason === EVENTS.stepFailed && !later(e, failed));
    const text = stepEvent?.message ?? failed.message.replace(/^converge to \S+ failed: /, "");
    const step = STEP.exec(text)?.[1];
    return { status: "False", reason: "StepsFailed", message: text, ...(step ? { step } : {}) };
  }
  const rejected = lastOf(events, (e) => e.reason === EVENTS.bundleRejected);
  if (rejected && (!started || later(rejected, started)))
    return {
      status: "False",
      reason: "Error",
      message: `bundle rejected, the node keeps its last good one: ${rejected.message}`,
    };
  if (provisioning(node))
    return { status: "Unknown", reason: "InitialRunInProgress", message: "the first converge has not finished" };
  return {
    status: "Unknown",
    reason: "UpdateInProgress",
    message: desired
      ? `configuration ${short(desired)} of node group ${node.group} not applied yet${applied ? ` (the node has ${short(applied)})` : ""}`
      : `node group ${node.group} has no checksum in Secret configuration-checksums yet`,
  };
}

const has = (n: CachedNode, k: string) => n.annotations[k] !== undefined;

export interface InstanceInput {
  node: CachedNode;
  approvalMode: string;
  desired: string | undefined;
  events: readonly AgentEvent[];
  current: Partial<InstanceStatus> | undefined;
  now: number;
}

export function instanceStatus(i: InstanceInput): InstanceStatus {
  const { node } = i;
  const iso = new Date(i.now).toISOString().replace(/\.\d+Z$/, "Z");
  const keep = (c: Omit<InstanceCondition, "lastTransitionTime">): InstanceCondition => {
    const was = i.current?.conditions?.find((x) => x.type === c.type);
    const same = was && was.status === c.status && was.reason === c.reason && was.message === c.message;
    return { ...c, lastTransitionTime: same && was.lastTransitionTime ? was.lastTransitionTime : iso };
  };
  const converge = convergeState(node, i.desired, i.events);
  const ready = keep({
    type: "BashibleReady",
    status: converge.status,
    reason: converge.reason,
    message: converge.message,
  });
  const waiting = has(node, NODE_KEYS.waitingForApproval) && !has(node, NODE_KEYS.approved);
  const approval = keep(
    waiting
      ? {
          type: "WaitingApproval",
          status: "True",
          reason: "UpdateApprovalRequired",
          message: `waits for update approval (node group ${node.group}, spec.update.maxConcurrent); the controller sets ${NODE_KEYS.approved}`,
        }
      : { type: "WaitingApproval", status: "False", reason: "UpdateApprovalNotRequired", message: "" },
  );
  const disruption = has(node, NODE_KEYS.disruptionRequired) && !has(node, NODE_KEYS.disruptionApproved);
  const howDisruption =
    i.approvalMode === "Manual"
      ? `approvalMode Manual: drain the node if needed, then kubectl annotate node ${node.name} ${NODE_KEYS.disruptionApproved}=`
      : has(node, NODE_KEYS.draining)
        ? "approvalMode Automatic: the node is being drained first"
        : `approvalMode ${i.approvalMode}: approved automatically (inside disruptions.automatic.windows, after a drain)`;
  const disruptionCond = keep(
    disruption
      ? {
          type: "WaitingDisruptionApproval",
          status: "True",
          reason: "DisruptionApprovalRequired",
          message: `a step needs a disruptive change; ${howDisruption}`,
        }
      : { type: "WaitingDisruptionApproval", status: "False", reason: "DisruptionApprovalNotRequired", message: "" },
  );
  const bashibleStatus: BashibleStatus =
    disruption || waiting
      ? "WaitingApproval"
      : converge.status === "True"
        ? "Ready"
        : converge.status === "False"
          ? "Error"
          : "Unknown";
  // Deckhouse's order: a problem first, then what it waits for, then what it last did.
  const message =
    converge.status === "False"
      ? converge.message
      : disruption
        ? disruptionCond.message
        : waiting
          ? approval.message
          : converge.message;
  const phase = provisioning(node) ? "Provisioning" : "Running";
  const phaseSince =
    i.current?.currentStatus?.phase === phase && i.current.currentStatus.lastUpdateTime
      ? i.current.currentStatus.lastUpdateTime
      : iso;
  return {
    nodeRef: { name: node.name },
    currentStatus: { phase, lastUpdateTime: phaseSince },
    ...(phase === "Provisioning"
      ? {
          bootstrapStatus: {
            description: `the first converge runs on the node: its log is /var/log/d8/bashible/bootstrap.log and \`journalctl -u bashible\`; \`bashible status\` there shows each step`,
          },
        }
      : {}),
    conditions: [ready, approval, disruptionCond],
    bashibleStatus,
    message: message.slice(0, 2000),
  };
}

/** Whether `current` already says what `next` says (the write would change nothing). */
export function sameStatus(current: Partial<InstanceStatus> | undefined, next: InstanceStatus): boolean {
  if (!current) return false;
  const pick = (s: Partial<InstanceStatus>) =>
    JSON.stringify([s.nodeRef, s.currentStatus, s.bootstrapStatus ?? null, s.conditions, s.bashibleStatus, s.message]);
  return pick(current) === pick(next);
}
