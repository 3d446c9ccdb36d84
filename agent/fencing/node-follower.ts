// The node follower: the Nodes of this node's group, as fencing reads them (labels, annotations,
// an address), kept through an outage. It gives the peers to ask (the group's other fencing
// nodes), the askers the peer endpoint lets in, and this node's own annotations (maintenance).
// The list is watched (lib/informer.ts) and re-opened when the API client changes; the last list
// stays meanwhile, and a restarted agent starts from the peers its predecessor saved.
import type { KubeClient } from "../../lib/kube/client.ts";
import { getNode, type KubeObject } from "../../lib/kube/api.ts";
import { Informer } from "../../lib/informer.ts";
import type { Logger } from "../../lib/log/log.ts";
import { NODE_KEYS } from "../../bundles/names.ts";
import type { Peer } from "./peers.ts";

export interface NodeView {
  name: string;
  labels: Record<string, string>;
  annotations: Record<string, string>;
  address?: string | undefined;
}

export function nodeView(o: KubeObject): NodeView {
  const addresses = ((o.status as { addresses?: { type: string; address: string }[] } | undefined)?.addresses ??
    []) as { type: string; address: string }[];
  return {
    name: o.metadata.name,
    labels: o.metadata.labels ?? {},
    annotations: o.metadata.annotations ?? {},
    address: addresses.find((a) => a.type === "InternalIP")?.address ?? addresses[0]?.address,
  };
}

export class NodeFollower {
  private readonly nodeName: string;
  private readonly log: Logger;
  private informer: Informer | undefined;
  private informerClient: KubeClient | undefined;
  /** The last Node list seen (kept while the informer re-lists or the API is down). */
  private nodes = new Map<string, NodeView>();

  constructor(o: { nodeName: string; log: Logger }) {
    this.nodeName = o.nodeName;
    this.log = o.log;
  }

  /** Forgets the list (the node moved to another group). */
  reset(): void {
    this.nodes = new Map();
  }

  /**
   * The peers the previous agent saw, until the API gives a new list: a restart while the API is
   * out of reach must still have peers to ask (with none, a node would be kept as a lone node).
   */
  seed(peers: Peer[]): void {
    if (this.nodes.size > 0) return;
    for (const p of peers)
      this.nodes.set(p.name, {
        name: p.name,
        address: p.address,
        labels: { [NODE_KEYS.fencingEnabled]: "" },
        annotations: {},
      });
  }

  /** Keeps a Node list of the group, re-opened when the client changes. */
  follow(client: KubeClient | undefined, group: string): void {
    if (!client || client === this.informerClient) return;
    this.informer?.stop();
    this.informerClient = client;
    const informer: Informer = new Informer({
      client,
      path: "/api/v1/nodes",
      labelSelector: `${NODE_KEYS.group}=${group}`,
      log: this.log,
      // Only what fencing reads: no managedFields, images or conditions in the resident process.
      trim: (o) => ({
        metadata: { name: o.metadata.name, labels: o.metadata.labels, annotations: o.metadata.annotations },
        status: { addresses: (o.status as { addresses?: unknown })?.addresses },
      }),
      onEvent: (ev) => {
        if (ev.type === "SYNC") {
          this.nodes = new Map([...informer.objects.values()].map((o) => [o.metadata.name, nodeView(o)]));
        } else if (ev.type === "DELETED") this.nodes.delete(ev.object.metadata.name);
        else this.nodes.set(ev.object.metadata.name, nodeView(ev.object));
      },
    });
    this.informer = informer;
    informer.run();
  }

  stop(): void {
    this.informer?.stop();
    this.informer = undefined;
    this.informerClient = undefined;
  }

  /** The watch has a current list (false without RBAC to list Nodes, or while it fails). */
  get listing(): boolean {
    return !!this.informer?.synced && !this.informer.error;
  }

  /** This node as last seen. */
  self(): NodeView | undefined {
    return this.nodes.get(this.nodeName);
  }

  /** A Node object this agent just read or patched, newer than the list. */
  saw(node: KubeObject): void {
    this.nodes.set(node.metadata.name, nodeView(node));
  }

  /** Whether `node` may ask this node's peer endpoint (anyone, before any list). */
  allows(node: string): boolean {
    return this.nodes.size === 0 || this.nodes.has(node);
  }

  /** Agents of the group that run fencing, with an address to ask. */
  peers(): Peer[] {
    const out: Peer[] = [];
    for (const n of this.nodes.values())
      if (n.name !== this.nodeName && n.address && n.labels[NODE_KEYS.fencingEnabled] !== undefined)
        out.push({ name: n.name, address: n.address });
    return out;
  }

  /**
   * Without the group's Node list (nodes may not list Nodes unless RBAC grants it, see
   * cluster/deploy/fencing-rbac.yaml), reads this node's own object for its annotations.
   */
  async readSelf(client: KubeClient, timeoutMs: number): Promise<void> {
    try {
      this.saw(await getNode(client, this.nodeName, { timeoutMs }));
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, "cannot read this node's Node object");
    }
  }
}
