// The fencing label and the timings annotation on this node's Node: what tells the cluster-side
// controller that this node watches itself (and with which numbers), so it may free the node's
// pods once its kubelet Lease is old enough. Set once the node is ready (armed, or Notify mode),
// removed in maintenance, when fencing stops, and when the check loop keeps failing.
import type { KubeClient } from "../../lib/kube/client.ts";
import { patchNode } from "../../lib/kube/api.ts";
import type { Logger } from "../../lib/log/log.ts";
import { NODE_KEYS } from "../../bundles/names.ts";
import type { FencingConfig } from "./fencing.ts";
import type { NodeFollower, NodeView } from "./node-follower.ts";

export interface NodeLabelsOptions {
  nodeName: string;
  /** Told of every Node object a patch returns (the freshest view of this node). */
  follower: NodeFollower;
  /** The timings annotation's value (formatAgentTimingsAnnotation). */
  annotation: () => string;
  log: Logger;
}

export class NodeLabels {
  private readonly o: NodeLabelsOptions;
  /** The label is on the Node, as far as this agent knows. */
  labelled = false;

  constructor(o: NodeLabelsOptions) {
    this.o = o;
  }

  /** The Node carries the label, the mode and this agent's current timings. */
  carries(self: NodeView, mode: FencingConfig["mode"]): boolean {
    return (
      self.labels[NODE_KEYS.fencingEnabled] !== undefined &&
      self.labels[NODE_KEYS.fencingMode] === mode &&
      self.annotations[NODE_KEYS.fencingTimings] === this.o.annotation()
    );
  }

  async label(client: KubeClient, mode: FencingConfig["mode"], timeoutMs: number): Promise<void> {
    try {
      const node = await patchNode(
        client,
        this.o.nodeName,
        {
          metadata: {
            labels: { [NODE_KEYS.fencingEnabled]: "", [NODE_KEYS.fencingMode]: mode },
            annotations: { [NODE_KEYS.fencingTimings]: this.o.annotation() },
          },
        },
        { timeoutMs },
      );
      this.o.follower.saw(node);
      this.labelled = true;
      this.o.log.info({ label: NODE_KEYS.fencingEnabled, mode }, "node labelled: fencing enabled");
    } catch (err) {
      // The device stays armed: without the label the controller never frees this node's
      // workloads, which is safe; the next round tries again.
      this.o.log.warn({ err: (err as Error).message }, "cannot label the node; retrying next round");
    }
  }

  /** Best effort: a failure is logged, and the device is disarmed all the same by the caller. */
  async unlabel(client: KubeClient | undefined, timeoutMs: number): Promise<void> {
    if (!client) return;
    try {
      const node = await patchNode(
        client,
        this.o.nodeName,
        {
          metadata: {
            labels: { [NODE_KEYS.fencingEnabled]: null, [NODE_KEYS.fencingMode]: null },
            annotations: { [NODE_KEYS.fencingTimings]: null },
          },
        },
        { timeoutMs },
      );
      this.o.follower.saw(node);
      this.labelled = false;
      this.o.log.info({ label: NODE_KEYS.fencingEnabled }, "fencing label removed");
    } catch (err) {
      this.o.log.warn(
        { err: (err as Error).message },
        "cannot remove the fencing label (the device is disarmed all the same)",
      );
    }
  }
}
