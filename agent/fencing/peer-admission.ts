// Which Nodes of the group count as peers, pure: a Node the cluster admitted to the group, as
// far as the agent can see it. What it can see, and what each part is worth:
//   - the group label: the cluster side sets it when the node joins and refuses a Node CREATE
//     with a group other than the bootstrap token's and any change of it afterwards (the label
//     policy), so a Node in this group was joined with a token of this group;
//   - the fencing label: the node's own agent sets it (a node may label itself), so it says the
//     node runs fencing, nothing more;
//   - the Node's age: a Node that joined less than `minAgeMs` ago is not asked yet. It takes
//     nothing from a real node (it is asked once it is older) and makes fake members slow to
//     add: they must sit in the cluster as Nodes, visible, for that long before they count;
//   - not being deleted, and an IP address to ask at (the serving certificate must name it).
// The proof that the peer at that address *is* that Node comes from the answer itself (its
// kubelet serving certificate, peer-identity.ts). What the agent cannot see is left out on
// purpose: a fresh kubelet Lease or a Ready condition is what any machine holding the Node's
// credentials writes for itself, and reading every peer's Lease each round costs what it proves.
import { NODE_KEYS } from "../../bundles/names.ts";
import type { Peer } from "./peers.ts";

/** A Node as fencing reads it (node-follower.ts keeps these). */
export interface NodeView {
  name: string;
  labels: Record<string, string>;
  annotations: Record<string, string>;
  /** The address peers are asked at: the InternalIP, else an ExternalIP (canonical). */
  address?: string | undefined;
  /** Every address the Node reports (canonical IPs), for telling a group member's connection from a stranger's. */
  addresses?: string[];
  /** metadata.creationTimestamp (epoch ms, the API server's clock). */
  createdAt?: number | undefined;
  /** metadata.deletionTimestamp is set. */
  deleting?: boolean;
}

export interface AdmissionRules {
  /** This node (never its own peer). */
  self: string;
  group: string;
  /** A Node younger than this is not asked yet. */
  minAgeMs: number;
}

export type Admission = { admitted: true; peer: Peer } | { admitted: false; why: string };

/** Undefined for a Node that is not a fencing peer at all (this node, or one not running fencing). */
export function admission(n: NodeView, r: AdmissionRules, now: number): Admission | undefined {
  if (n.name === r.self || n.labels[NODE_KEYS.fencingEnabled] === undefined) return undefined;
  if (n.labels[NODE_KEYS.group] !== r.group)
    return {
      admitted: false,
      why: `not a Node of group ${r.group} (${NODE_KEYS.group}=${n.labels[NODE_KEYS.group] ?? ""})`,
    };
  if (n.deleting) return { admitted: false, why: "the Node is being deleted" };
  if (!n.address) return { admitted: false, why: "reports no IP address to ask at" };
  if (n.createdAt === undefined) return { admitted: false, why: "its creation time is unknown" };
  const age = now - n.createdAt;
  if (age < r.minAgeMs)
    return {
      admitted: false,
      why: `the Node was created ${Math.max(0, Math.round(age / 1000))} s ago; it counts once it is ${r.minAgeMs / 1000} s old`,
    };
  return { admitted: true, peer: { name: n.name, address: n.address, createdAt: new Date(n.createdAt).toISOString() } };
}
