// NodeGroup status.conditions, status.kubernetesVersion and status.error as Deckhouse writes
// them (update_node_group_status.go, internal/conditions/calculate.go): Ready when more than 90%
// of the schedulable nodes are Ready (a node is given five minutes after it was created),
// Updating while any node carries an update.node.deckhouse.io annotation,
// WaitingForDisruptiveApproval while a node waits for one, Error with the group's errors joined
// by "|". A condition keeps its lastTransitionTime while its status and message stay. Pure.
import { NODE_KEYS } from "../../bundles/names.ts";
import type { NodeView } from "./model.ts";

export interface GroupCondition {
  type: "Ready" | "Updating" | "WaitingForDisruptiveApproval" | "Error";
  status: "True" | "False";
  message?: string;
  lastTransitionTime: string;
}

const GRACE_MS = 5 * 60_000;
const UPDATE_PREFIX = "update.node.deckhouse.io";

export function groupConditions(
  nodes: readonly NodeView[],
  errors: readonly string[],
  current: readonly Partial<GroupCondition>[] | undefined,
  now: number,
): GroupCondition[] {
  let schedulable = 0;
  let readySchedulable = 0;
  let updating = false;
  let waitingDisruption = false;
  for (const n of nodes) {
    if (!n.unschedulable) {
      schedulable++;
      if (n.ready || (n.created !== undefined && n.created + GRACE_MS > now)) readySchedulable++;
    }
    const a = n.annotations;
    const disruption = a[NODE_KEYS.disruptionRequired] !== undefined && a[NODE_KEYS.disruptionApproved] === undefined;
    if (disruption) waitingDisruption = true;
    if (disruption || Object.keys(a).some((k) => k.startsWith(UPDATE_PREFIX))) updating = true;
  }
  const ready = schedulable > 0 ? readySchedulable / schedulable > 0.9 : nodes.length === 0;
  const tf = (b: boolean): "True" | "False" => (b ? "True" : "False");
  const errorText = errors.join("|").trim();
  const next: Omit<GroupCondition, "lastTransitionTime">[] = [
    { type: "Ready", status: tf(ready) },
    { type: "Updating", status: tf(updating) },
    { type: "WaitingForDisruptiveApproval", status: tf(waitingDisruption) },
    { type: "Error", status: tf(errors.length > 0), message: errorText },
  ];
  const iso = new Date(now).toISOString().replace(/\.\d+Z$/, "Z");
  return next.map((c) => {
    const was = current?.find((x) => x.type === c.type);
    const same = was && was.status === c.status && (was.message ?? "") === (c.message ?? "") && was.lastTransitionTime;
    const out: GroupCondition = { ...c, lastTransitionTime: same ? String(was.lastTransitionTime) : iso };
    if (out.message === undefined || out.message === "") delete out.message;
    return out;
  });
}

/** The lowest kubelet minor version among the group's nodes ("1.34"), as `kubectl get ng` shows; "" without nodes. */
export function groupKubernetesVersion(nodes: readonly NodeView[]): string {
  let best: [number, number] | undefined;
  for (const n of nodes) {
    const m = /^v?(\d+)\.(\d+)/.exec(n.kubeletVersion ?? "");
    if (!m) continue;
    const v: [number, number] = [Number(m[1]), Number(m[2])];
    if (!best || v[0] < best[0] || (v[0] === best[0] && v[1] < best[1])) best = v;
  }
  return best ? `${best[0]}.${best[1]}` : "";
}

/**
 * The group's errors: its spec when it cannot be acted on, and every NodeGroupConfiguration
 * that fails to render for it (the bundle server writes status.error and status.failedNodeGroups
 * on the NodeGroupConfiguration; the group keeps serving its last good bundle meanwhile).
 */
export function groupErrors(
  group: string,
  specError: string | undefined,
  configurations: Iterable<{ metadata: { name: string }; status?: unknown }>,
): string[] {
  const errors = specError ? [specError] : [];
  for (const c of configurations) {
    const st = (c.status ?? {}) as { error?: string | null; failedNodeGroups?: string[] | null };
    if (st.error && st.failedNodeGroups?.includes(group))
      errors.push(`NodeGroupConfiguration ${c.metadata.name}: ${st.error}`);
  }
  return errors;
}
