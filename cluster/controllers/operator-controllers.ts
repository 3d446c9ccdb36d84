// What an operator sees, beside the update controller it reads from: the nodeTemplate kept on
// every Node (node-template-controller.ts), an Instance per static Node
// (instance-controller.ts), and the Deckhouse-named metrics (operator-metrics.ts). Started and
// stopped with the update controller on the leader of Lease bashible-controllers (run.ts), over
// one extra watch of all Nodes they share.
import type { KubeClient } from "../../lib/kube/client.ts";
import type { KubeObject } from "../../lib/kube/api.ts";
import type { InformerEvent } from "../../lib/informer.ts";
import type { Logger } from "../../lib/log/log.ts";
import type { UpdateController } from "./controller.ts";
import { InstanceController } from "./instance-controller.ts";
import type { ControllerMetrics } from "./metrics.ts";
import { NodeCache } from "./node-cache.ts";
import { NodeTemplateController } from "./node-template-controller.ts";
import { operatorSamples } from "./operator-metrics.ts";

export interface OperatorControllersOptions {
  client: KubeClient;
  log: Logger;
  update: UpdateController;
  metrics: ControllerMetrics;
  now?: () => number;
}

export class OperatorControllers {
  readonly nodes: NodeCache;
  readonly nodeTemplate: NodeTemplateController;
  readonly instances: InstanceController;
  private readonly o: OperatorControllersOptions;
  private removeGauges: (() => void) | undefined;

  constructor(o: OperatorControllersOptions) {
    this.o = o;
    this.nodes = new NodeCache({ client: o.client, log: o.log });
    this.nodeTemplate = new NodeTemplateController({
      client: o.client,
      log: o.log,
      nodes: this.nodes,
      groups: o.update.groups,
      onApplied: (group) => o.metrics.templatePatches.inc({ node_group: group }),
    });
    this.instances = new InstanceController({
      client: o.client,
      log: o.log,
      nodes: this.nodes,
      groups: o.update.groups,
      checksums: () => o.update.checksums(),
      now: o.now,
    });
  }

  start(): void {
    this.nodeTemplate.start();
    this.instances.start();
    this.nodes.start();
    const u = this.o.update;
    this.removeGauges = this.o.metrics.add(() => {
      // Every Node once per scrape: both the cluster-wide gauges and the converge states read it.
      const nodes = this.nodes.synced ? this.nodes.all() : undefined;
      return operatorSamples({
        update: u.synced ? u.view() : undefined,
        nodes,
        configurations: u.configurations.synced ? [...u.configurations.objects.values()] : undefined,
        converge: u.synced ? this.instances.convergeStates(nodes) : [],
      });
    });
  }

  stop(): void {
    this.removeGauges?.();
    this.nodeTemplate.stop();
    this.instances.stop();
    this.nodes.stop();
  }

  /** Hooks of the update controller's watches (run.ts wires them). */
  onGroupEvent(ev: InformerEvent<KubeObject>): void {
    // The update controller writes the groups' status about once a second during a rollout:
    // only a change of the spec (or a new list) concerns these controllers.
    if (ev.type === "MODIFIED" && ev.previous && JSON.stringify(ev.previous.spec) === JSON.stringify(ev.object.spec))
      return;
    this.nodeTemplate.onGroupEvent(ev.type === "SYNC" ? undefined : ev.object);
    this.instances.all();
  }

  onChecksums(): void {
    this.instances.all();
  }

  onDrainDone(group: string, result: "clean" | "forced"): void {
    this.o.metrics.drains.inc({ node_group: group, result });
  }

  async settled(): Promise<void> {
    await Promise.all([this.nodeTemplate.settled(), this.instances.settled()]);
  }
}
