// The update controllers as the cluster runs them: on whichever replica holds Lease
// bashible-controllers, stopped the moment that replica loses it. `bashible server` runs this
// (unless --no-controllers), and so does `bashible controllers` on its own.
import type { KubeClient } from "../../lib/kube/client.ts";
import type { Logger } from "../../lib/log/log.ts";
import { LEASES } from "../../bundles/names.ts";
import { whileLeading, type Leadership, type LeaseTiming } from "../leadership.ts";
import { UpdateController, type UpdateControllerOptions } from "./controller.ts";
import { InitializedController } from "./initialized.ts";
import { KubeletServingApprover } from "./kubelet-serving.ts";
import { KubeletClientApprover } from "./kubelet-client.ts";
import { CONTROLLER_METRICS, type ControllerMetrics } from "./metrics.ts";
import { OperatorControllers } from "./operator-controllers.ts";

export interface RunControllersOptions extends LeaseTiming {
  client: KubeClient;
  log: Logger;
  namespace: string;
  identity?: string;
  controller?: Omit<UpdateControllerOptions, "client" | "log" | "namespace">;
  /** Where the controllers' metrics go; default the process's (the server's /metrics). */
  metrics?: ControllerMetrics;
}

export function runControllers(o: RunControllersOptions): Leadership {
  return whileLeading(
    {
      client: o.client,
      namespace: o.namespace,
      name: LEASES.controllers,
      log: o.log,
      identity: o.identity,
      leaseDurationSeconds: o.leaseDurationSeconds,
      retryMs: o.retryMs,
    },
    (signal) => {
      // One watch of the managed Nodes for both: the approver reads the addresses trimNode keeps.
      let serving: KubeletServingApprover | undefined;
      let ops: OperatorControllers | undefined;
      const c = new UpdateController({
        ...o.controller,
        client: o.client,
        log: o.log,
        namespace: o.namespace,
        onNodeEvent: (ev) => serving?.onNodeEvent(ev),
        onGroupEvent: (ev) => ops?.onGroupEvent(ev),
        onChecksumsEvent: () => ops?.onChecksums(),
        onDrainDone: (_node, group, result) => ops?.onDrainDone(group, result),
      });
      // nodeTemplate, Instances and the Deckhouse-named metrics, from the same caches.
      ops = new OperatorControllers({
        client: o.client,
        log: o.log,
        update: c,
        metrics: o.metrics ?? CONTROLLER_METRICS,
      });
      const init = new InitializedController({ client: o.client, log: o.log });
      serving = new KubeletServingApprover({ client: o.client, log: o.log, nodes: c.nodes });
      // Bootstrap client certificates: which node names a group's token may take (which names
      // Nodes have, from the operator controllers' NodeCache: one watch of all Nodes).
      const client = new KubeletClientApprover({
        client: o.client,
        log: o.log,
        nodes: ops.nodes,
        namespace: o.namespace,
      });
      c.start();
      init.start();
      serving.start();
      client.start();
      ops.start();
      signal.addEventListener(
        "abort",
        () => {
          c.stop();
          init.stop();
          serving.stop();
          client.stop();
          ops?.stop();
        },
        { once: true },
      );
    },
  );
}
