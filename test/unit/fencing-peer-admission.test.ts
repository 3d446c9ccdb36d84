// Which Nodes count as peers (peer-admission.ts), with time passed in: the group, the fencing
// label, the minimum age, a Node being deleted, an IP address to ask at; and the one spelling of
// an address the serving approver compares.
import t from "tap";
import { admission, type NodeView } from "../../agent/fencing/peer-admission.ts";
import { canonicalIp } from "../../agent/fencing/peer-identity.ts";
import { NODE_KEYS } from "../../bundles/names.ts";

const created = Date.parse("2026-12-01T10:00:00Z");
const rules = { self: "me", group: "worker", minAgeMs: 600_000 };
const node = (o: Partial<NodeView> = {}): NodeView => ({
  name: "peer-1",
  labels: { [NODE_KEYS.group]: "worker", [NODE_KEYS.fencingEnabled]: "" },
  annotations: {},
  address: "10.0.0.2",
  createdAt: created,
  ...o,
});
const minutes = (m: number) => created + m * 60_000;

t.test("a fencing Node of the group counts once it is older than the minimum age", async (t) => {
  t.match(admission(node(), rules, minutes(9)), {
    admitted: false,
    why: "the Node was created 540 s ago; it counts once it is 600 s old",
  });
  t.same(admission(node(), rules, minutes(10)), {
    admitted: true,
    peer: { name: "peer-1", address: "10.0.0.2", createdAt: "2026-12-01T10:00:00.000Z" },
  });
  t.match(admission(node(), { ...rules, minAgeMs: 0 }, created), { admitted: true }, "no minimum: at once");
});

t.test("this node, and Nodes that do not run fencing, are not peers at all", async (t) => {
  t.equal(admission(node({ name: "me" }), rules, minutes(60)), undefined);
  t.equal(admission(node({ labels: { [NODE_KEYS.group]: "worker" } }), rules, minutes(60)), undefined);
});

t.test("a Node of another group, being deleted, without an IP address or a creation time is not asked", async (t) => {
  const later = minutes(60);
  const other = node({ labels: { [NODE_KEYS.group]: "frontend", [NODE_KEYS.fencingEnabled]: "" } });
  t.match(admission(other, rules, later), { admitted: false, why: /not a Node of group worker/ });
  t.match(admission(node({ deleting: true }), rules, later), { admitted: false, why: /being deleted/ });
  t.match(admission(node({ address: undefined }), rules, later), { admitted: false, why: /no IP address/ });
  t.match(admission(node({ createdAt: undefined }), rules, later), { admitted: false, why: /creation time/ });
});

t.test("addresses are compared in one spelling, as the serving approver compares them", async (t) => {
  t.equal(canonicalIp("10.0.0.2"), "10.0.0.2");
  t.equal(canonicalIp("::ffff:10.0.0.2"), "10.0.0.2", "IPv4-mapped is the IPv4 address");
  t.equal(canonicalIp("2001:DB8:0:0::1"), "2001:db8::1");
  t.equal(canonicalIp("fe80::1%eth0"), undefined, "a zone is no node address");
  t.equal(canonicalIp("node-1.example"), undefined, "a peer is asked at an IP address only");
});
