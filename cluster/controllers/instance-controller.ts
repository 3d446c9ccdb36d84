// An Instance (deckhouse.io/v1alpha1, named after the Node) for every Node of a group that is not
// CloudEphemeral: Static, CloudStatic and CloudPermanent machines have no Machine object here,
// so the Node is the source, as in Deckhouse's Instance controller for static nodes. Its status
// (instance.ts) says which Node it is, whether the first converge finished, and the conditions
// Deckhouse's bashible helpers patch, derived from the Node and the agent's Events.
//
// Deleting an Instance does what Deckhouse does for an Instance without a machine: the
// finalizer is removed at once (there is no machine to delete), the Node is left alone, and as
// long as the Node is in the group the Instance comes back with a fresh status. Taking a static
// node out of the cluster is cleanup_static_node.sh on it and `kubectl delete node`; its Instance
// then goes too. Instances that name a machine (status.machineRef) belong to a machine
// controller and are never touched.
import type { KubeClient } from "../../lib/kube/client.ts";
import type { KubeObject } from "../../lib/kube/api.ts";
import { isConflict, isNotFound } from "../../lib/kube/errors.ts";
import { Informer, type InformerEvent } from "../../lib/informer.ts";
import type { Logger } from "../../lib/log/log.ts";
import { INSTANCES, NODE_KEYS } from "../../bundles/names.ts";
import type { CachedNode, NodeCache } from "./node-cache.ts";
import {
  type AgentEvent,
  convergeState,
  type ConvergeState,
  instanceStatus,
  isAgentEvent,
  sameStatus,
  type InstanceStatus,
} from "./instance.ts";
import { WorkQueue } from "./work-queue.ts";

export interface InstanceControllerOptions {
  client: KubeClient;
  log: Logger;
  nodes: NodeCache;
  groups: Informer;
  /** The groups' checksums (Secret configuration-checksums), read when a Node is looked at. */
  checksums: () => Map<string, string>;
  now?: () => number;
  /** Every Node is looked at again this often (an Event that expired, a missed change); default 60 s. */
  resyncMs?: number;
  /**
   * At most one status write per Instance per this long (default 1 s): a node that asks and is
   * approved within it gets one write of where it ended up, not one per step.
   */
  writeIntervalMs?: number;
}

interface InstanceObject extends KubeObject {
  metadata: KubeObject["metadata"] & { deletionTimestamp?: string; finalizers?: string[] };
  status?: Partial<InstanceStatus> & { machineRef?: { name?: string } };
}

interface EventObject extends KubeObject {
  involvedObject?: { name?: string };
  reason?: string;
  type?: string;
  message?: string;
  lastTimestamp?: string;
  firstTimestamp?: string;
  eventTime?: string;
}

const enc = encodeURIComponent;
const STATIC_LIKE = (nodeType: string) => nodeType !== "CloudEphemeral" && nodeType !== "";

function trimEvent(e: KubeObject): KubeObject {
  const ev = e as EventObject;
  return {
    metadata: {
      name: ev.metadata.name,
      namespace: ev.metadata.namespace,
      resourceVersion: ev.metadata.resourceVersion,
    },
    involvedObject: { name: ev.involvedObject?.name },
    reason: ev.reason,
    type: ev.type,
    // Only agent Events are kept whole: the log tail is what the Instance shows.
    message: isAgentEvent(ev.reason ?? "") ? (ev.message ?? "").slice(0, 2000) : "",
    lastTimestamp: ev.lastTimestamp ?? ev.eventTime ?? ev.firstTimestamp,
  };
}

export class InstanceController {
  private readonly o: InstanceControllerOptions;
  private readonly log: Logger;
  private readonly now: () => number;
  readonly instances: Informer<InstanceObject>;
  private readonly events: Informer;
  private readonly queue: WorkQueue;
  /** The agent's Events by Node, then by Event (namespace/name), kept as the watch changes them. */
  private readonly byNode = new Map<string, Map<string, AgentEvent>>();
  /** What this controller last wrote to each Instance's status, and when: the watch may lag it. */
  private readonly written = new Map<string, { status: InstanceStatus | undefined; at: number }>();
  private readonly delayed = new Map<string, NodeJS.Timeout>();
  private unsubscribe: (() => void) | undefined;
  private timer: NodeJS.Timeout | undefined;
  readonly stats = { created: 0, deleted: 0, statusWrites: 0, finalizersRemoved: 0 };

  constructor(o: InstanceControllerOptions) {
    this.o = o;
    this.log = o.log.child({ component: "instance" });
    this.now = o.now ?? Date.now;
    this.queue = new WorkQueue({ work: (n) => this.reconcile(n), log: this.log, retryMs: 5000 });
    const byName = (ev: InformerEvent<KubeObject>, name: (o: KubeObject) => string | undefined) => {
      if (ev.type === "SYNC") return this.all();
      const n = name(ev.object);
      if (n) this.queue.add(n);
    };
    this.instances = new Informer<InstanceObject>({
      client: o.client,
      path: INSTANCES.path,
      log: this.log,
      onEvent: (ev) => {
        if (ev.type === "DELETED") this.written.delete(ev.object.metadata.name);
        byName(ev, (x) => x.metadata.name);
      },
    });
    this.events = new Informer({
      client: o.client,
      path: "/api/v1/namespaces/default/events",
      // What the agent posts on its Node (source.component "bashible").
      fieldSelector: "involvedObject.kind=Node,source=bashible",
      log: this.log,
      trim: trimEvent,
      onEvent: (ev) => {
        if (ev.type === "SYNC") {
          this.byNode.clear();
          for (const [key, e] of this.events.objects) this.index(key, e as EventObject, false);
          this.all();
          return;
        }
        const e = ev.object as EventObject;
        const node = this.index(`${e.metadata.namespace}/${e.metadata.name}`, e, ev.type === "DELETED");
        if (node) this.queue.add(node);
      },
    });
  }

  start(): void {
    this.unsubscribe = this.o.nodes.subscribe((ev) => {
      if (ev.type === "SYNC") this.all();
      else this.queue.add(ev.object.metadata.name);
    });
    this.instances.run();
    this.events.run();
    this.timer = setInterval(() => this.all(), this.o.resyncMs ?? 60_000);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
    for (const t of this.delayed.values()) clearTimeout(t);
    this.delayed.clear();
    this.unsubscribe?.();
    this.instances.stop();
    this.events.stop();
    this.queue.stop();
  }

  settled(): Promise<void> {
    return this.queue.settled();
  }

  /** A NodeGroup or the checksums changed: every Node is looked at. */
  all(): void {
    for (const n of this.o.nodes.all()) if (n.group) this.queue.add(n.name);
    for (const i of this.instances.objects.values()) this.queue.add(i.metadata.name);
  }

  /** Files (or drops) one Event under its Node; returns the Node when it is an agent's Event. */
  private index(key: string, e: EventObject, gone: boolean): string | undefined {
    const node = e.involvedObject?.name;
    if (!node || !isAgentEvent(e.reason ?? "")) return undefined;
    let mine = this.byNode.get(node);
    if (gone) {
      mine?.delete(key);
      if (mine && !mine.size) this.byNode.delete(node);
      return node;
    }
    if (!mine) {
      mine = new Map();
      this.byNode.set(node, mine);
    }
    const at = Date.parse(e.lastTimestamp ?? "");
    mine.set(key, {
      reason: e.reason ?? "",
      type: e.type ?? "",
      message: e.message ?? "",
      at: Number.isNaN(at) ? 0 : at,
      order: Number(e.metadata.resourceVersion) || 0,
    });
    return node;
  }

  /** The agent's Events on `node`. */
  agentEvents(node: string): AgentEvent[] {
    return [...(this.byNode.get(node)?.values() ?? [])];
  }

  /**
   * Where each managed Node's converge stands (for the metrics), whatever its group's type.
   * `nodes`: the NodeCache's all() the caller already has (undefined until it has listed).
   */
  convergeStates(nodes: readonly CachedNode[] | undefined): { node: CachedNode; state: ConvergeState }[] {
    if (!nodes || !this.events.synced) return [];
    const sums = this.o.checksums();
    return nodes
      .filter((n) => n.group && this.o.groups.objects.has(n.group))
      .map((node) => ({ node, state: convergeState(node, sums.get(node.group), this.agentEvents(node.name)) }));
  }

  private wanted(node: CachedNode | undefined): KubeObject | undefined {
    if (!node?.group) return undefined;
    const ng = this.o.groups.objects.get(node.group);
    const nodeType = String((ng?.spec as { nodeType?: string } | undefined)?.nodeType ?? "");
    return ng && STATIC_LIKE(nodeType) ? ng : undefined;
  }

  private async reconcile(name: string): Promise<void> {
    if (!this.o.nodes.synced || !this.o.groups.synced || !this.instances.synced || !this.events.synced) return;
    const node = this.o.nodes.get(name);
    const inst = this.instances.objects.get(name);
    if (inst?.status?.machineRef?.name) return;
    if (inst?.metadata.deletionTimestamp) {
      await this.release(inst);
      return;
    }
    const ng = this.wanted(node);
    if (!ng || !node) {
      if (inst) await this.remove(inst, node ? `node ${name} is not in a static node group` : `node ${name} is gone`);
      return;
    }
    const approvalMode =
      (ng.spec as { disruptions?: { approvalMode?: string } } | undefined)?.disruptions?.approvalMode ?? "Automatic";
    const status = instanceStatus({
      node,
      approvalMode,
      desired: this.o.checksums().get(node.group),
      events: this.agentEvents(name),
      // Our last write, while the watch has not shown it yet: its transition times are the ones to keep.
      current: (inst && this.written.get(name)?.status) ?? inst?.status,
      now: this.now(),
    });
    if (!inst) {
      await this.create(node, status);
      return;
    }
    if (inst.metadata.labels?.[NODE_KEYS.group] !== node.group) {
      await this.o.client.request("PATCH", `${INSTANCES.path}/${enc(name)}`, {
        body: { metadata: { labels: { [NODE_KEYS.group]: node.group } } },
        timeoutMs: 10_000,
      });
    }
    if (sameStatus(inst.status, status)) {
      // The watch shows it: from here the Instance itself says what is there.
      const w = this.written.get(name);
      if (w) w.status = undefined;
      return;
    }
    await this.writeStatus(name, status);
  }

  private async create(node: CachedNode, status: InstanceStatus): Promise<void> {
    try {
      await this.o.client.request<InstanceObject>("POST", INSTANCES.path, {
        body: {
          apiVersion: "deckhouse.io/v1alpha1",
          kind: "Instance",
          metadata: {
            name: node.name,
            labels: { [NODE_KEYS.group]: node.group },
            finalizers: [INSTANCES.finalizer],
            // Gone with its Node, even while this controller is not running.
            ownerReferences: node.uid
              ? [{ apiVersion: "v1", kind: "Node", name: node.name, uid: node.uid, blockOwnerDeletion: false }]
              : [],
          },
        },
        timeoutMs: 10_000,
      });
    } catch (err) {
      // Still there (a deletion not yet finished): its watch events bring it back here.
      if (isConflict(err)) return;
      throw err;
    }
    this.stats.created++;
    this.log.info({ instance: node.name, group: node.group }, "Instance created");
    // A new object: whatever was written to an earlier one of this name is not on it.
    this.written.delete(node.name);
    await this.writeStatus(node.name, status);
  }

  /**
   * Merge-patches the whole status this controller owns. No resourceVersion precondition: only
   * the leader writes it, the patch names every field it sets, and a write computed from a
   * watch that lags our last one would only say the same again (it is skipped: `written`).
   */
  private async writeStatus(name: string, status: InstanceStatus): Promise<void> {
    const last = this.written.get(name);
    if (last?.status && sameStatus(last.status, status)) return;
    const wait = (last?.at ?? 0) + (this.o.writeIntervalMs ?? 1000) - Date.now();
    if (wait > 0) {
      if (!this.delayed.has(name)) {
        const t = setTimeout(() => {
          this.delayed.delete(name);
          this.queue.add(name);
        }, wait);
        t.unref();
        this.delayed.set(name, t);
      }
      return;
    }
    try {
      this.stats.statusWrites++;
      this.written.set(name, { status, at: Date.now() });
      await this.o.client.request("PATCH", `${INSTANCES.path}/${enc(name)}/status`, {
        body: { status: { ...status, bootstrapStatus: status.bootstrapStatus ?? null } },
        timeoutMs: 10_000,
      });
    } catch (err) {
      const w = this.written.get(name);
      if (w) w.status = undefined;
      if (isNotFound(err)) return; // the watch brings the current object
      throw err;
    }
  }

  /** Deletion asked for: nothing to tear down for a machine-less Instance, so let it go. */
  private async release(inst: InstanceObject): Promise<void> {
    const finalizers = inst.metadata.finalizers ?? [];
    if (!finalizers.includes(INSTANCES.finalizer)) return;
    try {
      await this.o.client.request("PATCH", `${INSTANCES.path}/${enc(inst.metadata.name)}`, {
        body: {
          metadata: {
            resourceVersion: inst.metadata.resourceVersion,
            finalizers: finalizers.filter((f) => f !== INSTANCES.finalizer),
          },
        },
        timeoutMs: 10_000,
      });
      this.stats.finalizersRemoved++;
      this.log.info({ instance: inst.metadata.name }, "Instance deleted: no machine to delete, the Node is left alone");
    } catch (err) {
      if (!isConflict(err) && !isNotFound(err)) throw err;
    }
  }

  private async remove(inst: InstanceObject, why: string): Promise<void> {
    try {
      await this.o.client.request("DELETE", `${INSTANCES.path}/${enc(inst.metadata.name)}`, { timeoutMs: 10_000 });
      this.stats.deleted++;
      this.log.info({ instance: inst.metadata.name }, `Instance deleted: ${why}`);
    } catch (err) {
      if (!isNotFound(err)) throw err;
    }
    // The finalizer comes off when the deletion shows in the watch (release).
  }
}
