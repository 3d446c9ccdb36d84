// Nodes finish their first converge: the agent labels its Node
// node.deckhouse.io/bashible-first-run-finished (a kubelet may not remove its own taints), and
// this controller removes the taint node.deckhouse.io/bashible-uninitialized the kubelet
// registered with, then the label, as Deckhouse's bashible-cleanup controller does. Workloads
// land on a node only once it is fully converged.
import type { KubeClient } from "../../lib/kube/client.ts";
import type { Logger } from "../../lib/log/log.ts";
import { patchNode, type KubeObject } from "../../lib/kube/api.ts";
import { Informer } from "../../lib/informer.ts";
import { NODE_KEYS } from "../../bundles/names.ts";

interface Taint {
  key: string;
  effect?: string;
  value?: string;
}

export class InitializedController {
  private readonly informer: Informer;
  private readonly client: KubeClient;
  private readonly log: Logger;
  private readonly busy = new Set<string>();

  constructor(o: { client: KubeClient; log: Logger }) {
    this.client = o.client;
    this.log = o.log;
    this.informer = new Informer({
      client: o.client,
      path: "/api/v1/nodes",
      labelSelector: NODE_KEYS.firstRunFinished,
      log: o.log,
      onEvent: (ev) => {
        if (ev.type === "SYNC") for (const n of this.informer.objects.values()) void this.finish(n);
        else if (ev.type !== "DELETED") void this.finish(ev.object);
      },
    });
  }

  start(): void {
    this.informer.run();
  }

  stop(): void {
    this.informer.stop();
  }

  private async finish(node: KubeObject): Promise<void> {
    const name = node.metadata.name;
    if (this.busy.has(name)) return;
    this.busy.add(name);
    try {
      const taints = ((node.spec as { taints?: Taint[] } | undefined)?.taints ?? []).filter(
        (t) => t.key !== NODE_KEYS.uninitializedTaint,
      );
      // One merge patch: the taints list is replaced whole; resourceVersion makes it a compare-and-swap.
      await patchNode(this.client, name, {
        metadata: { resourceVersion: node.metadata.resourceVersion, labels: { [NODE_KEYS.firstRunFinished]: null } },
        spec: { taints },
      });
      this.log.info({ node: name }, "first converge finished: taint node.deckhouse.io/bashible-uninitialized removed");
    } catch (err) {
      // A conflict means the node changed meanwhile: the watch brings it back here.
      this.log.warn({ node: name, err: (err as Error).message }, "could not finish a node's initialisation");
    } finally {
      this.busy.delete(name);
    }
  }
}
