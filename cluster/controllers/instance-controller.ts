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
      onEvent: (ev) => byName(ev, (x) => x.metadata.name),
    });
    this.events = new Informer({
      client: o.client,
      path: "/api/v1/namespaces/default/events",
      // What the agent posts on its Node (source.component "bashible").
      fieldSelector: "involvedObject.kind=Node,source=bashible",
      log: this.log,
      trim: trimEvent,
      onEvent: (ev) =>
        byName(ev, (x) => (isAgentEvent(String(x.reason ?? "")) ? (x as EventObject).involvedObject?.name : undefined)),
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

  /** The agent's Events on `node`, in the order they happened. */
  agentEvents(node: string): AgentEvent[] {
    const out: AgentEvent[] = [];
    for (const e of this.events.objects.values() as Iterable<EventObject>) {
      if (e.involvedObject?.name !== node || !isAgentEvent(e.reason ?? "")) continue;
      const at = Date.parse(e.lastTimestamp ?? "");
      out.push({
        reason: e.reason ?? "",
        type: e.type ?? "",
        message: e.message ?? "",
        at: Number.isNaN(at) ? 0 : at,
        order: Number(e.metadata.resourceVersion) || 0,
      });
    }
    return out;
  }

  /** Where each managed Node's converge stands (for the metrics), whatever its group's type. */
  convergeStates(): { node: CachedNode; state: ConvergeState }[] {
    if (!this.o.nodes.synced || !this.events.synced) return [];
    const sums = this.o.checksums();
    return this.o.nodes
      .all()
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
      current: inst?.status,
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
    if (sameStatus(inst.status, status)) return;
    await this.writeStatus(name, status, inst.metadata.resourceVersion);
  }

  private async create(node: CachedNode, status: InstanceStatus): Promise<void> {
    let created: InstanceObject;
    try {
      created = await this.o.client.request<InstanceObject>("POST", INSTANCES.path, {
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
      if ((err as { status?: number }).status === 409) return;
      throw err;
    }
    this.stats.created++;
    this.log.info({ instance: node.name, group: node.group }, "Instance created");
    await this.writeStatus(node.name, status, created.metadata.resourceVersion);
  }

  private async writeStatus(name: string, status: InstanceStatus, resourceVersion: string | undefined): Promise<void> {
    try {
      this.stats.statusWrites++;
      await this.o.client.request("PATCH", `${INSTANCES.path}/${enc(name)}/status`, {
        body: { metadata: { resourceVersion }, status: { ...status, bootstrapStatus: status.bootstrapStatus ?? null } },
        timeoutMs: 10_000,
      });
    } catch (err) {
      if (isConflict(err) || isNotFound(err)) return; // the watch brings the current object
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
