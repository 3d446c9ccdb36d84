// Draining one Node (annotation `update.node.deckhouse.io/draining`): cordon, evict every pod
// through the Eviction API so PodDisruptionBudgets hold, retry a refused eviction every 20 s,
// and once the drain has run for its timeout (5 min, or the group's nodeDrainTimeoutSecond)
// delete what is left. DaemonSet pods and mirror (static) pods stay, as with kubectl drain.
// Done: `drained` (same value as `draining`) replaces `draining`. A drain that had to delete
// pods is not a plain success: the Node carries bashible.deckhouse.io/drain-forced (when, and
// which pods) until a later drain of it finishes without force, and while pods refuse to go the
// drain reports its trouble (d8_node_draining).
//
// What survives a change of leader is on the Node: the cordon, and when the drain began
// (so the deadline does not restart). Evicted pods carry a deletionTimestamp, so a new leader
// never evicts them again; evictions sent by this process are remembered until the pod's
// deletion shows in the watch.
import { EVENTS, NODE_KEYS } from "../../bundles/names.ts";
import type { KubeClient } from "../../lib/kube/client.ts";
import { deletePod, evictPod, type KubeObject } from "../../lib/kube/api.ts";
import { isNotFound, KubeStatusError } from "../../lib/kube/errors.ts";
import { Informer } from "../../lib/informer.ts";
import type { Logger } from "../../lib/log/log.ts";
import type { NodeEvent, NodePatch } from "./decide.ts";
import type { EventRecorder } from "./events.ts";
import { DRAIN_SOURCE, type NodeView } from "./model.ts";

interface PodObject extends KubeObject {
  metadata: KubeObject["metadata"] & {
    deletionTimestamp?: string;
    ownerReferences?: { kind: string; controller?: boolean; name?: string }[];
  };
  status?: { phase?: string };
}

const MIRROR = "kubernetes.io/config.mirror";

/** The fields a drain decides on. */
function trimPod(p: PodObject): PodObject {
  return {
    metadata: {
      name: p.metadata.name,
      namespace: p.metadata.namespace,
      uid: p.metadata.uid,
      resourceVersion: p.metadata.resourceVersion,
      ...(p.metadata.deletionTimestamp ? { deletionTimestamp: p.metadata.deletionTimestamp } : {}),
      ownerReferences: (p.metadata.ownerReferences ?? []).map((o) => ({ kind: o.kind, controller: o.controller })),
      annotations: p.metadata.annotations?.[MIRROR] !== undefined ? { [MIRROR]: "" } : {},
    },
    status: { phase: p.status?.phase },
  };
}

/** Pods a drain leaves alone: DaemonSet and mirror pods (they would come straight back), finished ones. */
export function staysOnNode(p: PodObject): boolean {
  if (p.metadata.annotations?.[MIRROR] !== undefined) return true;
  if (p.metadata.ownerReferences?.some((o) => o.kind === "DaemonSet" && o.controller)) return true;
  return p.status?.phase === "Succeeded" || p.status?.phase === "Failed";
}

export interface DrainStep {
  patch?: NodePatch;
  event?: NodeEvent;
  wakeAt?: number;
}

export interface DrainDeps {
  client: KubeClient;
  log: Logger;
  events: EventRecorder;
  now: () => number;
  retryMs: number;
  /** Something changed (a pod event): run the controller's loop again. */
  poke: () => void;
  /** A drain finished: without force, or deleting pods it could not evict. */
  onDone?: (result: "clean" | "forced") => void;
}

const podName = (p: PodObject) => `${p.metadata.namespace}/${p.metadata.name}`;
const seconds = (ms: number) => (ms % 1000 ? `${ms} ms` : `${ms / 1000} s`);

export class NodeDrain {
  readonly node: string;
  private readonly d: DrainDeps;
  private readonly pods: Informer<PodObject>;
  /** Evictions this process saw accepted (uid), until the deletion shows up. */
  private readonly evicted = new Set<string>();
  private readonly deleted = new Set<string>();
  private readonly nextTry = new Map<string, number>();
  private busy = false;
  evictions = 0;
  refusals = 0;
  deletions = 0;
  /** Set while some pod refuses to be evicted: what the operator is told (d8_node_draining). */
  trouble: string | undefined;

  constructor(node: string, d: DrainDeps) {
    this.node = node;
    this.d = d;
    this.pods = new Informer<PodObject>({
      client: d.client,
      path: "/api/v1/pods",
      fieldSelector: `spec.nodeName=${node}`,
      log: d.log,
      trim: trimPod,
      onEvent: () => d.poke(),
    });
    this.pods.run();
  }

  stop(): void {
    this.pods.stop();
  }

  /** One look at the drain; evictions and deletions happen here, Node writes are returned. */
  async step(n: NodeView, timeoutMs: number): Promise<DrainStep> {
    if (this.busy) return {};
    this.busy = true;
    try {
      return await this.stepOnce(n, timeoutMs);
    } finally {
      this.busy = false;
    }
  }

  private async stepOnce(n: NodeView, timeoutMs: number): Promise<DrainStep> {
    const now = this.d.now();
    const source = n.annotations[NODE_KEYS.draining] || DRAIN_SOURCE;
    const startedRaw = n.annotations[NODE_KEYS.drainStartedAt];
    const started = startedRaw ? Date.parse(startedRaw) : Number.NaN;
    if (Number.isNaN(started) || !n.unschedulable) {
      const annotations: Record<string, string | null> = {};
      if (Number.isNaN(started)) annotations[NODE_KEYS.drainStartedAt] = new Date(now).toISOString();
      if (!n.unschedulable) annotations[NODE_KEYS.cordoned] = "true";
      return {
        patch: { node: n.name, annotations, ...(n.unschedulable ? {} : { unschedulable: true }) },
        event: {
          node: n.name,
          reason: EVENTS.draining,
          message: `${n.unschedulable ? "already cordoned" : "cordoned"}; evicting its pods (PodDisruptionBudgets hold; a refused eviction is retried every ${seconds(this.d.retryMs)}, and pods still there after ${seconds(timeoutMs)} are deleted; DaemonSet and static pods stay)`,
          type: "Normal",
        },
      };
    }
    if (!this.pods.synced) return {};
    const all = [...this.pods.objects.values()];
    for (const uid of this.evicted) if (!all.some((p) => p.metadata.uid === uid)) this.evicted.delete(uid);
    const blocking = all.filter((p) => !staysOnNode(p));
    const deadline = started + timeoutMs;
    const done = (how: string, forced: string | undefined): DrainStep => {
      this.trouble = undefined;
      this.d.onDone?.(forced ? "forced" : "clean");
      const annotations: Record<string, string | null> = {
        [NODE_KEYS.drained]: source,
        [NODE_KEYS.draining]: null,
        [NODE_KEYS.drainStartedAt]: null,
      };
      // The record of a forced drain stays until a drain of this node goes through without force.
      if (forced) annotations[NODE_KEYS.drainForced] = `${new Date(now).toISOString()}: ${forced}`.slice(0, 1000);
      else if (n.annotations[NODE_KEYS.drainForced] !== undefined) annotations[NODE_KEYS.drainForced] = null;
      return {
        patch: { node: n.name, annotations },
        event: { node: n.name, reason: EVENTS.drained, message: how, type: forced ? "Warning" : "Normal" },
      };
    };
    if (!blocking.length) {
      return done(
        `drained in ${seconds(Math.max(0, now - started))}: ${this.evictions} pod(s) evicted by this controller${this.deletions ? `, ${this.deletions} deleted` : ""}`,
        this.deletions ? `${this.deletions} pod(s) deleted without eviction after ${seconds(timeoutMs)}` : undefined,
      );
    }
    const live = blocking.filter((p) => !p.metadata.deletionTimestamp && !this.evicted.has(p.metadata.uid ?? ""));
    if (now >= deadline) {
      const left = live.filter((p) => !this.deleted.has(p.metadata.uid ?? ""));
      await Promise.all(left.map((p) => this.remove(p)));
      const forced = left.length
        ? `deleted ${left.map(podName).join(", ")} without eviction: not evictable within ${seconds(timeoutMs)}`
        : undefined;
      return done(
        `drain timed out after ${seconds(timeoutMs)}: deleted ${left.length ? left.map(podName).join(", ") : "nothing"} without eviction${blocking.length > left.length ? `; ${blocking.length - left.length} pod(s) still terminating` : ""}`,
        forced,
      );
    }
    let wakeAt = deadline;
    const due = live.filter((p) => (this.nextTry.get(p.metadata.uid ?? "") ?? 0) <= now);
    for (let i = 0; i < due.length; i += 8) {
      await Promise.all(due.slice(i, i + 8).map((p) => this.evict(p, n, deadline)));
    }
    for (const p of live) {
      const t = this.nextTry.get(p.metadata.uid ?? "");
      if (t !== undefined && t > now) wakeAt = Math.min(wakeAt, t);
    }
    return { wakeAt };
  }

  private async evict(p: PodObject, n: NodeView, deadline: number): Promise<void> {
    const uid = p.metadata.uid ?? "";
    const name = p.metadata.name;
    const ns = p.metadata.namespace ?? "default";
    try {
      await evictPod(this.d.client, ns, name, undefined, { timeoutMs: 10_000 });
      this.evicted.add(uid);
      this.nextTry.delete(uid);
      this.evictions++;
      this.d.log.info({ node: this.node, pod: podName(p) }, "pod evicted");
    } catch (err) {
      if (isNotFound(err)) return;
      this.nextTry.set(uid, this.d.now() + this.d.retryMs);
      this.refusals++;
      // One text per drain (not per pod or attempt), so the series it labels stays the same.
      this.trouble = `pods could not be evicted; those still there at ${new Date(deadline).toISOString()} are deleted`;
      const why =
        err instanceof KubeStatusError && err.status === 429
          ? `refused (${err.statusMessage})`
          : `failed (${(err as Error).message})`;
      this.d.events.emit(
        {
          node: this.node,
          reason: EVENTS.evictionRefused,
          message: `eviction of pod ${podName(p)} ${why}; retrying every ${seconds(this.d.retryMs)}, deleting it at ${new Date(deadline).toISOString()} if still there`,
          type: "Warning",
        },
        n.uid,
        `${this.node}/${uid}`,
      );
    }
  }

  private async remove(p: PodObject): Promise<void> {
    const uid = p.metadata.uid ?? "";
    try {
      await deletePod(this.d.client, p.metadata.namespace ?? "default", p.metadata.name, undefined, {
        timeoutMs: 10_000,
      });
      this.deleted.add(uid);
      this.deletions++;
      this.d.log.warn({ node: this.node, pod: podName(p) }, "drain timed out: pod deleted");
    } catch (err) {
      if (!isNotFound(err)) throw err;
    }
  }
}
