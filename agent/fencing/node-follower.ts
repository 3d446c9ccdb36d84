// The node follower: the Nodes of this node's group, as fencing reads them (labels, annotations,
// addresses, age), kept through an outage. It gives the peers to ask (the group's other fencing
// nodes the cluster admitted, peer-admission.ts), the askers the peer endpoint lets in, the
// addresses whose connections have the peers' pool, and this node's own annotations (maintenance).
// The list is watched (lib/informer.ts) and re-opened when the API client changes; the last list
// stays meanwhile, and a restarted agent starts from the peers its predecessor saved.
import type { KubeClient } from "../../lib/kube/client.ts";
import { getNode, type KubeObject } from "../../lib/kube/api.ts";
import { Informer } from "../../lib/informer.ts";
import type { Logger } from "../../lib/log/log.ts";
import { NODE_KEYS } from "../../bundles/names.ts";
import type { Clock } from "./clock.ts";
import { admission, type NodeView } from "./peer-admission.ts";
import { canonicalIp } from "./peer-identity.ts";
import type { Peer } from "./peers.ts";

export type { NodeView } from "./peer-admission.ts";

export function nodeView(o: KubeObject): NodeView {
  const reported = ((o.status as { addresses?: { type: string; address: string }[] } | undefined)?.addresses ?? []) as {
    type: string;
    address: string;
  }[];
  const ip = (type: string) =>
    reported.map((a) => (a.type === type ? canonicalIp(a.address) : undefined)).find((a) => a !== undefined);
  const addresses = reported.map((a) => canonicalIp(a.address)).filter((a): a is string => a !== undefined);
  const created = Date.parse(String(o.metadata.creationTimestamp ?? ""));
  return {
    name: o.metadata.name,
    labels: o.metadata.labels ?? {},
    annotations: o.metadata.annotations ?? {},
    address: ip("InternalIP") ?? ip("ExternalIP"),
    addresses,
    ...(Number.isFinite(created) ? { createdAt: created } : {}),
    ...(o.metadata.deletionTimestamp ? { deleting: true } : {}),
  };
}

/** What of a Node the peer list and the peer pool depend on. */
const peerKey = (n: NodeView) =>
  [
    n.address,
    n.addresses?.join(","),
    n.labels[NODE_KEYS.group],
    n.labels[NODE_KEYS.fencingEnabled] !== undefined,
    n.createdAt,
    n.deleting,
  ].join("|");

export class NodeFollower {
  private readonly nodeName: string;
  private readonly log: Logger;
  private readonly now: Clock;
  private readonly minAgeMs: number;
  private group = "";
  private informer: Informer | undefined;
  private informerClient: KubeClient | undefined;
  /** The last Node list seen (kept while the informer re-lists or the API is down). */
  private nodes = new Map<string, NodeView>();
  /** Every address the group's Nodes report, recomputed when the list changed. */
  private addressSet: Set<string> | undefined;

  /** `minAgeMs`: a Node younger than this is not asked yet (peer-admission.ts). */
  constructor(o: { nodeName: string; log: Logger; now: Clock; minAgeMs: number }) {
    this.nodeName = o.nodeName;
    this.log = o.log;
    this.now = o.now;
    this.minAgeMs = o.minAgeMs;
  }

  /** Forgets the list (the node moved to another group). */
  reset(): void {
    this.setNodes(new Map());
  }

  /** Bumped on every change of the list (the status is rewritten when it moves). */
  version = 0;

  private setNodes(nodes: Map<string, NodeView>): void {
    this.nodes = nodes;
    this.changed();
  }

  private changed(): void {
    this.addressSet = undefined;
    this.version++;
  }

  /**
   * The peers the previous agent saw, until the API gives a new list: a restart while the API is
   * out of reach must still have peers to ask (with none, a node would be kept as a lone node).
   */
  seed(peers: Peer[], group: string): void {
    if (this.nodes.size > 0) return;
    this.group = group;
    const address = (p: Peer) => canonicalIp(String(p.address));
    for (const p of peers) {
      const created = Date.parse(p.createdAt ?? "");
      this.nodes.set(p.name, {
        name: p.name,
        address: address(p),
        addresses: [address(p)].filter((a): a is string => a !== undefined),
        labels: { [NODE_KEYS.fencingEnabled]: "", [NODE_KEYS.group]: group },
        annotations: {},
        // A peer saved without its age (an older agent's file) is not admitted until the list comes.
        ...(Number.isFinite(created) ? { createdAt: created } : {}),
      });
    }
    this.changed();
  }

  /** Keeps a Node list of the group, re-opened when the client changes. */
  follow(client: KubeClient | undefined, group: string): void {
    this.group = group;
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
        metadata: {
          name: o.metadata.name,
          labels: o.metadata.labels,
          annotations: o.metadata.annotations,
          creationTimestamp: o.metadata.creationTimestamp,
          deletionTimestamp: o.metadata.deletionTimestamp,
        },
        status: { addresses: (o.status as { addresses?: unknown })?.addresses },
      }),
      onEvent: (ev) => {
        if (ev.type === "SYNC") {
          this.setNodes(new Map([...informer.objects.values()].map((o) => [o.metadata.name, nodeView(o)])));
          return;
        }
        if (ev.type === "DELETED") {
          this.nodes.delete(ev.object.metadata.name);
          this.changed();
        } else this.put(nodeView(ev.object));
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
    this.put(nodeView(node));
  }

  /** A Node added or updated; a change only when what fencing reads of it moved. */
  private put(view: NodeView): void {
    const before = this.nodes.get(view.name);
    this.nodes.set(view.name, view);
    // Most Node updates are a kubelet's status report: nothing fencing reads changes.
    if (!before || peerKey(before) !== peerKey(view)) this.changed();
  }

  /** Whether `node` may ask this node's peer endpoint (anyone, before any list). */
  allows(node: string): boolean {
    return this.nodes.size === 0 || this.nodes.has(node);
  }

  /** Whether a Node of the group reports this address (canonical IP). */
  isNodeAddress(ip: string): boolean {
    if (!this.addressSet) {
      this.addressSet = new Set();
      for (const n of this.nodes.values()) for (const a of n.addresses ?? []) this.addressSet.add(a);
    }
    return this.addressSet.has(ip);
  }

  /** The group's other fencing nodes the cluster admitted (peer-admission.ts): the peers to ask. */
  peers(): Peer[] {
    const out: Peer[] = [];
    const now = this.now();
    for (const n of this.nodes.values()) {
      const a = admission(n, this.rules(), now);
      if (a?.admitted) out.push(a.peer);
    }
    return out;
  }

  /** Fencing nodes of the group not asked yet, and why (for the status). */
  waiting(): { name: string; why: string }[] {
    const out: { name: string; why: string }[] = [];
    const now = this.now();
    for (const n of this.nodes.values()) {
      const a = admission(n, this.rules(), now);
      if (a && !a.admitted) out.push({ name: n.name, why: a.why });
    }
    return out;
  }

  private rules() {
    return { self: this.nodeName, group: this.group, minAgeMs: this.minAgeMs };
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
