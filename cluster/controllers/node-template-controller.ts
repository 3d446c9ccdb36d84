// Keeps every Node of a group carrying the group's nodeTemplate (Deckhouse's
// handle_node_templates hook; the merge rules are node-template.ts). Level-triggered: a change
// of a Node or of a NodeGroup queues the Nodes concerned, each is compared with its group's
// template and patched only when it differs, with its resourceVersion as a precondition (a
// Node that changed meanwhile comes back through the watch and is compared again). This runs
// whether or not the kubelet registered the Node with the template: what is already there is
// not written again. Nodes of CloudEphemeral groups are left to the machine controller that
// creates them, as in Deckhouse.
import type { KubeClient } from "../../lib/kube/client.ts";
import { createEvent, type KubeObject } from "../../lib/kube/api.ts";
import { isConflict, isNotFound } from "../../lib/kube/errors.ts";
import type { Informer } from "../../lib/informer.ts";
import type { Logger } from "../../lib/log/log.ts";
import { EVENTS } from "../../bundles/names.ts";
import type { NodeCache } from "./node-cache.ts";
import { LastAppliedError, nodeTemplatePatch, templateOf } from "./node-template.ts";
import { WorkQueue } from "./work-queue.ts";

export interface NodeTemplateControllerOptions {
  client: KubeClient;
  log: Logger;
  nodes: NodeCache;
  groups: Informer;
  /** Wait before a Node the API refused is tried again; default 30 s. */
  retryMs?: number;
  /** A Node of `group` was patched (the metric counts them). */
  onApplied?: (group: string) => void;
}

export class NodeTemplateController {
  private readonly o: NodeTemplateControllerOptions;
  private readonly log: Logger;
  private readonly queue: WorkQueue;
  private readonly reported = new Map<string, string>();
  private unsubscribe: (() => void) | undefined;
  /** Counters for tests. */
  readonly stats = { patches: 0, conflicts: 0 };

  constructor(o: NodeTemplateControllerOptions) {
    this.o = o;
    this.log = o.log.child({ component: "node-template" });
    this.queue = new WorkQueue({ work: (n) => this.reconcile(n), log: this.log, retryMs: o.retryMs ?? 30_000 });
  }

  start(): void {
    this.unsubscribe = this.o.nodes.subscribe((ev) => {
      if (ev.type === "SYNC") this.all();
      else if (ev.type !== "DELETED") this.queue.add(ev.object.metadata.name);
      else this.reported.delete(ev.object.metadata.name);
    });
  }

  /** A NodeGroup changed (or the groups were re-listed): every Node of it is looked at. */
  onGroupEvent(group: KubeObject | undefined): void {
    if (!group) {
      this.all();
      return;
    }
    for (const n of this.o.nodes.all()) if (n.group === group.metadata.name) this.queue.add(n.name);
  }

  stop(): void {
    this.unsubscribe?.();
    this.queue.stop();
  }

  settled(): Promise<void> {
    return this.queue.settled();
  }

  private all(): void {
    for (const n of this.o.nodes.all()) if (n.group) this.queue.add(n.name);
  }

  private async reconcile(name: string): Promise<void> {
    if (!this.o.nodes.synced || !this.o.groups.synced) return;
    const node = this.o.nodes.get(name);
    if (!node?.group) return;
    const ng = this.o.groups.objects.get(node.group);
    if (!ng) return; // the update controller warns about Nodes of unknown groups
    const nodeType = String((ng.spec as { nodeType?: string } | undefined)?.nodeType ?? "");
    if (nodeType === "CloudEphemeral") return;
    let patch: ReturnType<typeof nodeTemplatePatch>;
    try {
      patch = nodeTemplatePatch(node, { name: ng.metadata.name, nodeType, template: templateOf(ng.spec) });
    } catch (err) {
      if (!(err instanceof LastAppliedError)) throw err;
      this.report(
        ng,
        name,
        `${err.message}; remove the annotation to have the template applied afresh (nothing the last template set will then be removed)`,
      );
      return;
    }
    if (!patch) {
      this.reported.delete(name);
      return;
    }
    try {
      this.stats.patches++;
      await this.o.client.request("PATCH", `/api/v1/nodes/${encodeURIComponent(name)}`, {
        body: patch.body,
        timeoutMs: 10_000,
      });
      this.reported.delete(name);
      this.o.onApplied?.(node.group);
      this.log.info({ node: name, group: node.group, changes: patch.changes }, "nodeTemplate applied");
    } catch (err) {
      // The Node changed since it was read: the watch brings it back here with what changed.
      if (isConflict(err)) {
        this.stats.conflicts++;
        return;
      }
      if (isNotFound(err)) return;
      const status = (err as { status?: number }).status;
      // Invalid key or value (the CRD lets through what the Node's own validation refuses).
      if (status === 422 || status === 400)
        this.report(ng, name, `the API server refused it: ${(err as Error).message}`);
      throw err;
    }
  }

  /** One Warning Event on the NodeGroup per distinct problem of a Node, and a log line. */
  private report(ng: KubeObject, node: string, problem: string): void {
    const message = `nodeTemplate of node group ${ng.metadata.name} not applied to node ${node}: ${problem}`;
    if (this.reported.get(node) === message) return;
    this.reported.set(node, message);
    this.log.warn({ node, group: ng.metadata.name }, message);
    void createEvent(this.o.client, {
      namespace: "default",
      involved: { kind: "NodeGroup", name: ng.metadata.name, uid: ng.metadata.uid, apiVersion: "deckhouse.io/v1" },
      reason: EVENTS.nodeTemplateFailed,
      type: "Warning",
      message: message.slice(0, 1000),
      component: "bashible-controller",
    }).catch((err: Error) => this.log.warn({ err: err.message }, "cannot write Event"));
  }
}
