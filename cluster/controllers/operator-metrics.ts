// The gauges an operator alerts on, computed from the controllers' caches (pure; metrics.ts
// serves them). Deckhouse's names and labels where Deckhouse has the metric, this project's
// (bashible_*) for what only it can tell.
import { NODE_KEYS } from "../../bundles/names.ts";
import { maintenanceOf } from "../../bundles/fencing.ts";
import type { UpdateView } from "./controller.ts";
import type { ConvergeState } from "./instance.ts";
import { DRAIN_SOURCE, type NodeView } from "./model.ts";
import type { CachedNode } from "./node-cache.ts";
import type { Sample, Samples } from "./metrics.ts";

export const NODE_STATUSES = [
  "WaitingForApproval",
  "Approved",
  "DrainingForDisruption",
  "Draining",
  "Drained",
  "WaitingForDisruptionApproval",
  "WaitingForManualDisruptionApproval",
  "DisruptionApproved",
  "ToBeUpdated",
  "UpToDate",
  "UpdateFailedNoConfigChecksum",
] as const;
export type NodeStatus = (typeof NODE_STATUSES)[number];

/**
 * A node's update state, as Deckhouse's update_approval hook names it, first match wins.
 * `draining`/`drained` count when this controller or the agent asked for them (value bashible,
 * or empty as older agents write it), as in Deckhouse.
 */
export function nodeStatus(n: NodeView, approvalMode: string, desired: string | undefined): NodeStatus {
  const a = n.annotations;
  const has = (k: string) => a[k] !== undefined;
  const ours = (k: string) => has(k) && (a[k] === "" || a[k] === DRAIN_SOURCE);
  const approved = has(NODE_KEYS.approved);
  const disruption = has(NODE_KEYS.disruptionRequired);
  if (has(NODE_KEYS.waitingForApproval)) return "WaitingForApproval";
  if (approved && disruption && ours(NODE_KEYS.draining)) return "DrainingForDisruption";
  if (ours(NODE_KEYS.draining)) return "Draining";
  if (ours(NODE_KEYS.drained)) return "Drained";
  if (approved && disruption && approvalMode === "Automatic") return "WaitingForDisruptionApproval";
  if (approved && disruption && approvalMode === "Manual") return "WaitingForManualDisruptionApproval";
  if (approved && has(NODE_KEYS.disruptionApproved)) return "DisruptionApproved";
  if (approved) return "Approved";
  const checksum = a[NODE_KEYS.checksum];
  if (!checksum) return "UpdateFailedNoConfigChecksum";
  return checksum === desired ? "UpToDate" : "ToBeUpdated";
}

export interface OperatorInputs {
  /** Undefined until the update controller's watches have listed. */
  update: UpdateView | undefined;
  /** Every Node (undefined until listed). */
  nodes: CachedNode[] | undefined;
  configurations: { spec?: unknown; metadata: { name: string } }[] | undefined;
  converge: { node: CachedNode; state: ConvergeState }[];
}

export function operatorSamples(i: OperatorInputs): Samples {
  const out: Samples = {};
  const push = (name: string, labels: Sample["labels"], value = 1) => {
    const list = out[name] ?? [];
    list.push({ labels, value });
    out[name] = list;
  };
  const u = i.update;
  if (u) {
    const byGroup = new Map<string, NodeView[]>();
    for (const n of u.nodes) {
      const list = byGroup.get(n.group);
      if (list) list.push(n);
      else byGroup.set(n.group, [n]);
    }
    for (const { policy, spec } of u.groups) {
      const group = policy.name;
      const cri = (spec.cri as { type?: string } | undefined)?.type ?? "Containerd";
      push("node_group_info", { name: group, cri_type: cri });
      const members = byGroup.get(group) ?? [];
      const desired = u.checksums.get(group);
      push("bashible_node_group_nodes", { node_group: group }, members.length);
      push("bashible_node_group_nodes_ready", { node_group: group }, members.filter((n) => n.ready).length);
      push(
        "bashible_node_group_nodes_up_to_date",
        { node_group: group },
        desired ? members.filter((n) => n.annotations[NODE_KEYS.checksum] === desired).length : 0,
      );
      const fencing = (spec.fencing as { mode?: string } | undefined)?.mode;
      if (fencing) push("bashible_node_group_fencing_mode", { node_group: group, mode: fencing });
      for (const n of members) {
        const st = nodeStatus(n, policy.approvalMode, desired);
        for (const s of NODE_STATUSES)
          push("node_group_node_status", { node: n.name, node_group: group, status: s }, s === st ? 1 : 0);
        const forced = n.annotations[NODE_KEYS.drainForced];
        const at = forced ? Date.parse(forced.slice(0, forced.indexOf(": "))) : Number.NaN;
        if (!Number.isNaN(at))
          push("bashible_node_drain_forced_timestamp_seconds", { node: n.name, node_group: group }, at / 1000);
      }
    }
    for (const [node, message] of u.drainTrouble) push("d8_node_draining", { node, message });
  }
  if (i.nodes) {
    const groups = new Map((u?.groups ?? []).map((g) => [g.policy.name, g.spec]));
    for (const n of i.nodes) {
      if (!n.group) push("d8_unmanaged_nodes_on_cluster", { node: n.name });
      const spec = groups.get(n.group);
      const mode = (spec?.fencing as { mode?: string } | undefined)?.mode;
      if (
        mode === "Watchdog" &&
        n.ready &&
        !n.taints.some((t) => t.key === NODE_KEYS.uninitializedTaint) &&
        !maintenanceOf(n.annotations) &&
        n.labels[NODE_KEYS.fencingEnabled] === undefined
      )
        push("bashible_node_fencing_disarmed", { node: n.name, node_group: n.group });
    }
    const master = u?.groups.find((g) => g.policy.name === "master");
    // A cluster of one master node runs workloads on it on purpose (Deckhouse's exception).
    if (master && !(u?.groups.length === 1 && i.nodes.length === 1)) {
      const taints = ((master.spec.nodeTemplate as { taints?: { key: string }[] } | undefined)?.taints ?? []).map(
        (t) => t.key,
      );
      if (!taints.includes("node-role.kubernetes.io/control-plane"))
        push("d8_nodegroup_taint_missing", { name: "master" });
    }
  }
  if (i.configurations) {
    const count = new Map<string, number>();
    for (const c of i.configurations) {
      const groups = (c.spec as { nodeGroups?: string[] } | undefined)?.nodeGroups ?? ["*"];
      for (const g of groups) count.set(g, (count.get(g) ?? 0) + 1);
    }
    for (const [g, n] of count) push("d8_node_group_configurations_total", { node_group: g }, n);
  }
  for (const { node, state } of i.converge) {
    if (state.reason === "StepsFailed")
      push("bashible_node_converge_failing", { node: node.name, node_group: node.group, step: state.step ?? "" });
    if (state.reason === "Error") push("bashible_node_bundle_rejected", { node: node.name, node_group: node.group });
  }
  return out;
}
