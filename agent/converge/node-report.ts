// Telling the cluster about this node: Events (BashibleNodeUpdate, BashibleStepFailed,
// BashibleBundleRejected) and annotations. Reporting never fails a converge: when the API is
// unreachable the problem is logged and the run goes on.
import type { Logger } from "../../lib/log/log.ts";
import type { KubeClient } from "../../lib/kube/client.ts";
import { createEvent, patchNode } from "../../lib/kube/api.ts";

export class NodeReporter {
  readonly kube: KubeClient | undefined;
  readonly nodeName: string;
  private readonly log: Logger;
  constructor(kube: KubeClient | undefined, nodeName: string, log: Logger) {
    this.kube = kube;
    this.nodeName = nodeName;
    this.log = log;
  }

  async event(reason: string, message: string, type: "Normal" | "Warning" = "Normal"): Promise<void> {
    if (!this.kube) return;
    try {
      await createEvent(this.kube, {
        involved: { kind: "Node", name: this.nodeName, apiVersion: "v1" },
        reason,
        message: message.slice(0, 1024),
        type,
        host: this.nodeName,
      });
    } catch (err) {
      this.log.warn({ reason }, `could not record Event: ${(err as Error).message}`);
    }
  }

  /** Merge-patches labels (null deletes); like annotate. */
  async label(labels: Record<string, string | null>): Promise<boolean> {
    if (!this.kube) return false;
    try {
      await patchNode(this.kube, this.nodeName, { metadata: { labels } });
      return true;
    } catch (err) {
      this.log.warn(`could not label Node ${this.nodeName}: ${(err as Error).message}`);
      return false;
    }
  }

  /** Merge-patches annotations (null deletes). Returns false when the API refused or was unreachable. */
  async annotate(annotations: Record<string, string | null>): Promise<boolean> {
    if (!this.kube) return false;
    try {
      await patchNode(this.kube, this.nodeName, { metadata: { annotations } });
      return true;
    } catch (err) {
      this.log.warn(`could not annotate Node ${this.nodeName}: ${(err as Error).message}`);
      return false;
    }
  }
}
