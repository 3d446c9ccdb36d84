// The update controller's decision for one group, as a pure function: what it approves, what
// it marks, what it clears, and the reason every other node waits.
import t from "tap";
import { NODE_KEYS } from "../../bundles/names.ts";
import { decideGroup } from "../../cluster/controllers/decide.ts";
import { concurrency, groupPolicy, type NodeView } from "../../cluster/controllers/model.ts";
import { windowState } from "../../cluster/controllers/windows.ts";

const SUM = "a".repeat(64);
const OLD = "b".repeat(64);
const K = NODE_KEYS;

const node = (name: string, annotations: Record<string, string> = {}, o: Partial<NodeView> = {}): NodeView => ({
  name,
  uid: `uid-${name}`,
  resourceVersion: "1",
  group: "worker",
  ready: true,
  unschedulable: false,
  annotations: { [K.checksum]: OLD, ...annotations },
  ...o,
});
const ng = (spec: Record<string, unknown> = {}) =>
  groupPolicy({ metadata: { name: "worker", uid: "ng" }, spec: { nodeType: "Static", ...spec } });
const waiting = { [K.waitingForApproval]: "" };
const approvedNames = (d: ReturnType<typeof decideGroup>) =>
  d.actions.filter((a) => a.patch.annotations[K.approved] === "").map((a) => a.patch.node);
const NOW = Date.parse("2026-03-04T12:00:00Z"); // a Wednesday

t.test("maxConcurrent: a count, a percentage rounding down, at least one", async (t) => {
  t.equal(concurrency(1, 10), 1);
  t.equal(concurrency("3", 10), 3);
  t.equal(concurrency("50%", 4), 2);
  t.equal(concurrency("10%", 4), 1);
  t.equal(concurrency("25%", 200), 50);
  t.throws(() => concurrency("x", 4), /neither a count nor a percentage/);
  t.throws(() => concurrency("150%", 4), /over 100%/);
});

t.test("one node approved at a time by default, in name order; the others say why they wait", async (t) => {
  const d = decideGroup(ng(), [node("w-2", waiting), node("w-1", waiting), node("w-3", waiting)], SUM, NOW);
  t.same(approvedNames(d), ["w-1"]);
  t.same(d.actions[0]?.patch.annotations, { [K.approved]: "", [K.waitingForApproval]: null });
  t.same(
    d.waits.map((w) => w.node),
    ["w-2", "w-3"],
  );
  t.match(d.waits[0]?.message, /waits for a free update slot: at most 1 nodes of group worker/);
  t.equal(d.status.waitingForApproval, 2);
  t.equal(d.status.approved, 1);
});

t.test("an approved node holds its slot; 50% of four approves two", async (t) => {
  const busy = node("w-1", { [K.approved]: "" });
  t.same(approvedNames(decideGroup(ng(), [busy, node("w-2", waiting)], SUM, NOW)), []);
  const four = ["w-1", "w-2", "w-3", "w-4"].map((n) => node(n, waiting));
  t.same(approvedNames(decideGroup(ng({ update: { maxConcurrent: "50%" } }), four, SUM, NOW)), ["w-1", "w-2"]);
  t.same(approvedNames(decideGroup(ng({ update: { maxConcurrent: 2 } }), four, SUM, NOW)), ["w-1", "w-2"]);
});

t.test("a node the pass starts draining or approves to disrupt keeps its slot", async (t) => {
  // Found by the fleet end to end: the node being drained was not counted, so the next one was
  // approved beside it and two nodes were cordoned at once under maxConcurrent 1.
  const asking = node("w-1", { [K.approved]: "", [K.disruptionRequired]: "" });
  const automatic = ng({ disruptions: { approvalMode: "Automatic", automatic: { drainBeforeApproval: true } } });
  let d = decideGroup(automatic, [asking, node("w-2", waiting)], SUM, NOW);
  t.equal(d.actions[0]?.patch.annotations[K.draining], "bashible", "w-1 starts draining");
  t.same(approvedNames(d), [], "and w-2 waits for the slot w-1 holds");
  const drained = node("w-1", { [K.approved]: "", [K.disruptionRequired]: "", [K.drained]: "bashible" });
  d = decideGroup(automatic, [drained, node("w-2", waiting)], SUM, NOW);
  t.equal(d.actions[0]?.patch.annotations[K.disruptionApproved], "", "w-1 drained: its disruption is approved");
  t.same(approvedNames(d), [], "and w-2 still waits");
  const noDrain = ng({ disruptions: { approvalMode: "Automatic", automatic: { drainBeforeApproval: false } } });
  t.same(approvedNames(decideGroup(noDrain, [asking, node("w-2", waiting)], SUM, NOW)), [], "without a drain too");
  const done = node("w-1", { [K.checksum]: SUM, [K.approved]: "", [K.disruptionApproved]: "" });
  t.same(
    approvedNames(decideGroup(automatic, [done, node("w-2", waiting)], SUM, NOW)),
    ["w-2"],
    "a finished node frees it",
  );
});

t.test("while a node is not Ready no Ready node is approved, but a waiting NotReady one goes first", async (t) => {
  const sick = node("w-9", {}, { ready: false });
  const d = decideGroup(ng(), [node("w-1", waiting), sick], SUM, NOW);
  t.same(approvedNames(d), []);
  t.match(d.waits[0]?.message, /node w-9 of group worker is not Ready/);
  const sickWaiting = node("w-9", waiting, { ready: false });
  t.same(approvedNames(decideGroup(ng(), [node("w-1", waiting), sickWaiting], SUM, NOW)), ["w-9"]);
});

t.test("a node whose checksum is the group's and is Ready is cleared and uncordoned if we cordoned it", async (t) => {
  const done = node("w-1", {
    [K.checksum]: SUM,
    [K.approved]: "",
    [K.disruptionApproved]: "",
    [K.drained]: "bashible",
    [K.cordoned]: "true",
  });
  const d = decideGroup(ng(), [done, node("w-2", waiting)], SUM, NOW);
  t.same(d.actions[0]?.patch, {
    node: "w-1",
    annotations: { [K.approved]: null, [K.disruptionApproved]: null, [K.drained]: null, [K.cordoned]: null },
    unschedulable: false,
  });
  t.same(approvedNames(d), ["w-2"], "its slot goes to the next node in the same pass");
  const notReady = { ...done, ready: false };
  t.same(decideGroup(ng(), [notReady], SUM, NOW).actions, [], "not Ready: not done yet");
  const operatorCordon = node("w-1", { [K.checksum]: SUM, [K.approved]: "" }, { unschedulable: true });
  t.equal(decideGroup(ng(), [operatorCordon], SUM, NOW).actions[0]?.patch.unschedulable, undefined, "not ours");
  const rebooting = node("w-1", { [K.checksum]: SUM, [K.approved]: "", [K.reboot]: "" });
  t.same(decideGroup(ng(), [rebooting], SUM, NOW).actions, [], "a pending reboot is not done");
});

t.test("Manual never approves a disruption and says how to", async (t) => {
  const d = decideGroup(
    ng({ disruptions: { approvalMode: "Manual" } }),
    [node("w-1", { [K.approved]: "", [K.disruptionRequired]: "" })],
    SUM,
    NOW,
  );
  t.same(d.actions, []);
  t.match(d.waits[0]?.message, /kubectl annotate node w-1 update.node.deckhouse.io\/disruption-approved=/);
  t.equal(d.status.waitingForDisruptionApproval, 1);
});

t.test("Automatic drains first, approves once drained; without drainBeforeApproval at once", async (t) => {
  const asks = node("w-1", { [K.approved]: "", [K.disruptionRequired]: "" });
  const d1 = decideGroup(ng(), [asks], SUM, NOW);
  t.same(d1.actions[0]?.patch.annotations, { [K.draining]: "bashible" });
  t.equal(d1.status.draining, 1);
  const draining = node("w-1", { [K.approved]: "", [K.disruptionRequired]: "", [K.draining]: "bashible" });
  t.same(decideGroup(ng(), [draining], SUM, NOW).actions, [], "the drain is under way");
  const drained = node("w-1", { [K.approved]: "", [K.disruptionRequired]: "", [K.drained]: "bashible" });
  t.same(decideGroup(ng(), [drained], SUM, NOW).actions[0]?.patch.annotations, {
    [K.disruptionApproved]: "",
    [K.disruptionRequired]: null,
  });
  const noDrain = ng({ disruptions: { approvalMode: "Automatic", automatic: { drainBeforeApproval: false } } });
  t.same(decideGroup(noDrain, [asks], SUM, NOW).actions[0]?.patch.annotations, {
    [K.disruptionApproved]: "",
    [K.disruptionRequired]: null,
  });
});

t.test(
  "Deckhouse's exceptions: the only master and a node someone else cordoned are approved without a drain",
  async (t) => {
    const approvedAtOnce = { [K.disruptionApproved]: "", [K.disruptionRequired]: null };
    const asks = { [K.approved]: "", [K.disruptionRequired]: "" };
    const master = groupPolicy({ metadata: { name: "master" }, spec: { nodeType: "CloudPermanent" } });
    const lone = decideGroup(master, [node("m-1", asks, { group: "master" })], SUM, NOW);
    t.same(lone.actions[0]?.patch.annotations, approvedAtOnce);
    t.match(lone.actions[0]?.event.message, /not drained: it is the only node of node group master/);
    const two = decideGroup(
      master,
      [node("m-1", asks, { group: "master" }), node("m-2", {}, { group: "master" })],
      SUM,
      NOW,
    );
    t.same(two.actions[0]?.patch.annotations, { [K.draining]: "bashible" }, "with two masters, drained as usual");
    const theirs = decideGroup(ng(), [node("w-1", asks, { unschedulable: true })], SUM, NOW);
    t.same(theirs.actions[0]?.patch.annotations, approvedAtOnce);
    t.notOk("unschedulable" in (theirs.actions[0]?.patch ?? {}), "left cordoned as the operator left it");
    t.match(theirs.actions[0]?.event.message, /cordoned before by someone else/);
    const ours = decideGroup(ng(), [node("w-1", { ...asks, [K.cordoned]: "true" }, { unschedulable: true })], SUM, NOW);
    t.same(
      ours.actions[0]?.patch.annotations,
      { [K.draining]: "bashible" },
      "our own cordon (a drain cut short) is drained",
    );
  },
);

t.test("a maintenance window holds Automatic approval until it opens", async (t) => {
  const policy = ng({
    disruptions: { approvalMode: "Automatic", automatic: { windows: [{ from: "22:00", to: "02:00", days: ["Wed"] }] } },
  });
  const asks = node("w-1", { [K.approved]: "", [K.disruptionRequired]: "" });
  const d = decideGroup(policy, [asks], SUM, NOW);
  t.same(d.actions, []);
  t.equal(d.wakeAt, Date.parse("2026-03-04T22:00:00Z"));
  t.match(d.waits[0]?.message, /the next opens 2026-03-04T22:00 UTC/);
  t.same(decideGroup(policy, [asks], SUM, Date.parse("2026-03-05T01:59:00Z")).actions[0]?.patch.annotations, {
    [K.draining]: "bashible",
  });
  t.same(decideGroup(policy, [asks], SUM, Date.parse("2026-03-05T02:00:00Z")).actions, [], "closed at 02:00");
});

t.test("windows: days, overnight, several, and bad ones", async (t) => {
  const w = [{ from: "08:00", to: "10:00", days: ["Mon", "Fri"] }];
  t.same(windowState(w, NOW), { open: false, nextChange: Date.parse("2026-03-06T08:00:00Z") });
  t.same(windowState(w, Date.parse("2026-03-06T09:00:00Z")), {
    open: true,
    nextChange: Date.parse("2026-03-06T10:00:00Z"),
  });
  t.same(windowState(undefined, NOW), { open: true, nextChange: undefined });
  t.equal(windowState([{ from: "00:00", to: "00:00" }], NOW).open, true, "from = to: the whole day");
  t.match(
    groupPolicy({
      metadata: { name: "g" },
      spec: { disruptions: { automatic: { windows: [{ from: "25:00", to: "1:00" }] } } },
    }).error,
    /windows\[0\]\.from '25:00' is not HH:MM/,
  );
});

t.test("RollingUpdate marks a node asking for a disruption for replacement", async (t) => {
  const policy = ng({ disruptions: { approvalMode: "RollingUpdate" } });
  const d = decideGroup(policy, [node("w-1", { [K.approved]: "", [K.disruptionRequired]: "" })], SUM, NOW);
  t.same(d.actions[0]?.patch.annotations, { [K.rollingUpdate]: "" });
  const marked = decideGroup(policy, [node("w-1", { [K.approved]: "", [K.rollingUpdate]: "" })], SUM, NOW);
  t.same(marked.actions, []);
  t.match(marked.waits[0]?.message, /waits to be replaced/);
  t.equal(marked.status.waitingForReplacement, 1);
});

t.test("an invalid group approves nothing and says why", async (t) => {
  const d = decideGroup(ng({ update: { maxConcurrent: "0" } }), [node("w-1", waiting)], SUM, NOW);
  t.same(d.actions, []);
  t.match(d.waits[0]?.message, /maxConcurrent '0' is neither a count nor a percentage; nothing is approved/);
  t.match(d.status.message, /^NodeGroup worker: /);
});
