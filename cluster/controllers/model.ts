// What the controllers read from the API, reduced to the fields they decide on: a NodeGroup's
// update and disruption policy, and a Node's readiness, cordon and update annotations. Reading
// is forgiving where Deckhouse's defaults apply and strict where a wrong guess would disrupt
// nodes (a malformed window or maxConcurrent is an error the group reports, not a default).
import { NODE_KEYS } from "../../bundles/names.ts";
import type { KubeObject } from "../../lib/kube/api.ts";
import { parseWindows, type MaintenanceWindow } from "./windows.ts";

export type ApprovalMode = "Manual" | "Automatic" | "RollingUpdate";

export interface GroupPolicy {
  name: string;
  uid: string | undefined;
  /** spec.update.maxConcurrent as written: a count or "N%"; default 1. */
  maxConcurrent: number | string;
  approvalMode: ApprovalMode;
  drainBeforeApproval: boolean;
  windows: MaintenanceWindow[];
  /** spec.nodeDrainTimeoutSecond in ms, when set. */
  drainTimeoutMs: number | undefined;
  /** Set when the spec cannot be acted on safely; the group then approves nothing. */
  error: string | undefined;
}

/** The value of `draining`/`drained` when the controller (or the agent) asked for the drain. */
export const DRAIN_SOURCE = "bashible";

const UPDATE_KEYS = [
  NODE_KEYS.waitingForApproval,
  NODE_KEYS.approved,
  NODE_KEYS.disruptionRequired,
  NODE_KEYS.disruptionApproved,
  NODE_KEYS.rollingUpdate,
  NODE_KEYS.draining,
  NODE_KEYS.drained,
  NODE_KEYS.reboot,
  NODE_KEYS.checksum,
  NODE_KEYS.drainStartedAt,
  NODE_KEYS.cordoned,
  NODE_KEYS.drainForced,
];

export interface NodeView {
  name: string;
  uid: string | undefined;
  resourceVersion: string | undefined;
  group: string;
  ready: boolean;
  unschedulable: boolean;
  annotations: Record<string, string>;
  /** creationTimestamp (ms): a young Node counts as ready for NodeGroup status, as in Deckhouse. */
  created?: number | undefined;
  kubeletVersion?: string | undefined;
}

interface NodeObject extends KubeObject {
  spec?: { unschedulable?: boolean };
  status?: {
    conditions?: { type: string; status: string }[];
    addresses?: { type: string; address: string }[];
    nodeInfo?: { kubeletVersion?: string };
  };
}

/** The part of a Node the controllers keep (a Node's status is large; 10,000 of them add up). */
export function trimNode(n: KubeObject): KubeObject {
  const node = n as NodeObject;
  const annotations: Record<string, string> = {};
  for (const k of UPDATE_KEYS) {
    const v = node.metadata.annotations?.[k];
    if (v !== undefined) annotations[k] = v;
  }
  const ready = node.status?.conditions?.find((c) => c.type === "Ready");
  return {
    metadata: {
      name: node.metadata.name,
      uid: node.metadata.uid,
      resourceVersion: node.metadata.resourceVersion,
      creationTimestamp: node.metadata.creationTimestamp,
      labels: { [NODE_KEYS.group]: node.metadata.labels?.[NODE_KEYS.group] ?? "" },
      annotations,
    },
    spec: { unschedulable: node.spec?.unschedulable === true },
    // The addresses are for the kubelet serving approver, which shares this watch.
    status: {
      conditions: ready ? [{ type: "Ready", status: ready.status }] : [],
      addresses: node.status?.addresses ?? [],
      nodeInfo: { kubeletVersion: node.status?.nodeInfo?.kubeletVersion },
    },
  };
}

export function nodeView(n: KubeObject): NodeView {
  const node = n as NodeObject;
  const created = Date.parse(String(node.metadata.creationTimestamp ?? ""));
  return {
    name: node.metadata.name,
    uid: node.metadata.uid,
    resourceVersion: node.metadata.resourceVersion,
    group: node.metadata.labels?.[NODE_KEYS.group] ?? "",
    ready: node.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True") ?? false,
    unschedulable: node.spec?.unschedulable === true,
    annotations: { ...(node.metadata.annotations ?? {}) },
    created: Number.isNaN(created) ? undefined : created,
    kubeletVersion: node.status?.nodeInfo?.kubeletVersion,
  };
}

const MAX_CONCURRENT = /^([1-9]\d*)(%?)$/;

/** How many nodes of `total` may update at once; a percentage rounds down but is at least 1. */
export function concurrency(maxConcurrent: number | string, total: number): number {
  const m = MAX_CONCURRENT.exec(String(maxConcurrent));
  if (!m) throw new Error(`spec.update.maxConcurrent '${maxConcurrent}' is neither a count nor a percentage`);
  const n = Number(m[1]);
  if (!m[2]) return n;
  if (n > 100) throw new Error(`spec.update.maxConcurrent '${maxConcurrent}' is over 100%`);
  return Math.max(1, Math.floor((total * n) / 100));
}

interface NodeGroupSpec {
  update?: { maxConcurrent?: number | string };
  disruptions?: {
    approvalMode?: string;
    automatic?: { drainBeforeApproval?: boolean; windows?: MaintenanceWindow[] };
  };
  nodeDrainTimeoutSecond?: number;
}

export function groupPolicy(ng: KubeObject): GroupPolicy {
  const spec = (ng.spec ?? {}) as NodeGroupSpec;
  const mode = spec.disruptions?.approvalMode ?? "Automatic";
  const policy: GroupPolicy = {
    name: ng.metadata.name,
    uid: ng.metadata.uid,
    maxConcurrent: spec.update?.maxConcurrent ?? 1,
    approvalMode: mode as ApprovalMode,
    drainBeforeApproval: spec.disruptions?.automatic?.drainBeforeApproval ?? true,
    windows: spec.disruptions?.automatic?.windows ?? [],
    drainTimeoutMs:
      typeof spec.nodeDrainTimeoutSecond === "number" && spec.nodeDrainTimeoutSecond > 0
        ? spec.nodeDrainTimeoutSecond * 1000
        : undefined,
    error: undefined,
  };
  try {
    if (!["Manual", "Automatic", "RollingUpdate"].includes(mode))
      throw new Error(`spec.disruptions.approvalMode '${mode}' is not Manual, Automatic or RollingUpdate`);
    concurrency(policy.maxConcurrent, 1);
    parseWindows(policy.windows);
  } catch (err) {
    policy.error = `NodeGroup ${ng.metadata.name}: ${(err as Error).message}`;
  }
  return policy;
}
