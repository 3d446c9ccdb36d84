// Every Node of the cluster, as the operator-facing controllers read it (nodeTemplate, Instance,
// the Deckhouse-named metrics) and the kubelet client approver (which names Nodes have): one
// list + watch shared by all of them, kept trimmed. The update
// controller keeps its own narrower watch of the managed Nodes (model.ts); this one also needs
// the Nodes no group manages (d8_unmanaged_nodes_on_cluster) and every label, annotation and
// taint (the template is merged into them).
import type { KubeClient } from "../../lib/kube/client.ts";
import type { KubeObject } from "../../lib/kube/api.ts";
import { Informer, type InformerEvent } from "../../lib/informer.ts";
import type { Logger } from "../../lib/log/log.ts";
import { NODE_KEYS } from "../../bundles/names.ts";
import type { Taint } from "./node-template.ts";

export interface CachedNode {
  name: string;
  uid: string | undefined;
  resourceVersion: string | undefined;
  created: number | undefined;
  /** The node.deckhouse.io/group label; "" for a Node no group manages. */
  group: string;
  labels: Record<string, string>;
  annotations: Record<string, string>;
  taints: Taint[];
  providerID: string | undefined;
  unschedulable: boolean;
  ready: boolean;
  kubeletVersion: string | undefined;
}

interface NodeObject extends KubeObject {
  spec?: { taints?: Taint[]; providerID?: string; unschedulable?: boolean };
  status?: { conditions?: { type: string; status: string }[]; nodeInfo?: { kubeletVersion?: string } };
}

function trim(n: KubeObject): KubeObject {
  const node = n as NodeObject;
  const ready = node.status?.conditions?.find((c) => c.type === "Ready");
  return {
    metadata: {
      name: node.metadata.name,
      uid: node.metadata.uid,
      resourceVersion: node.metadata.resourceVersion,
      creationTimestamp: node.metadata.creationTimestamp,
      labels: node.metadata.labels ?? {},
      annotations: node.metadata.annotations ?? {},
    },
    spec: {
      taints: node.spec?.taints ?? [],
      providerID: node.spec?.providerID,
      unschedulable: node.spec?.unschedulable === true,
    },
    status: {
      conditions: ready ? [{ type: "Ready", status: ready.status }] : [],
      nodeInfo: { kubeletVersion: node.status?.nodeInfo?.kubeletVersion },
    },
  };
}

export function cachedNode(o: KubeObject): CachedNode {
  const n = o as NodeObject;
  const created = Date.parse(String(n.metadata.creationTimestamp ?? ""));
  return {
    name: n.metadata.name,
    uid: n.metadata.uid,
    resourceVersion: n.metadata.resourceVersion,
    created: Number.isNaN(created) ? undefined : created,
    group: n.metadata.labels?.[NODE_KEYS.group] ?? "",
    labels: n.metadata.labels ?? {},
    annotations: n.metadata.annotations ?? {},
    taints: n.spec?.taints ?? [],
    providerID: n.spec?.providerID || undefined,
    unschedulable: n.spec?.unschedulable === true,
    ready: n.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True") ?? false,
    kubeletVersion: n.status?.nodeInfo?.kubeletVersion,
  };
}

/** One watch of all Nodes; every subscriber is told each change. */
export class NodeCache {
  readonly informer: Informer;
  private readonly subscribers = new Set<(ev: InformerEvent<KubeObject>) => void>();

  constructor(o: { client: KubeClient; log: Logger }) {
    this.informer = new Informer({
      client: o.client,
      path: "/api/v1/nodes",
      log: o.log,
      trim,
      onEvent: (ev) => {
        for (const s of this.subscribers) s(ev);
      },
    });
  }

  get synced(): boolean {
    return this.informer.synced;
  }

  subscribe(fn: (ev: InformerEvent<KubeObject>) => void): () => void {
    this.subscribers.add(fn);
    return () => this.subscribers.delete(fn);
  }

  get(name: string): CachedNode | undefined {
    const o = this.informer.objects.get(name);
    return o ? cachedNode(o) : undefined;
  }

  has(name: string): boolean {
    return this.informer.objects.has(name);
  }

  all(): CachedNode[] {
    return [...this.informer.objects.values()].map(cachedNode);
  }

  start(): void {
    this.informer.run();
  }

  stop(): void {
    this.informer.stop();
    this.subscribers.clear();
  }
}
