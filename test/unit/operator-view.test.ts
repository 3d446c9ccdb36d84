// What an operator reads, as pure functions of what the cluster shows: an Instance's status and
// conditions from a Node and its agent's Events, a node's Deckhouse update status, NodeGroup
// conditions, and the gauges computed from them.
import t from "tap";
import { EVENTS, NODE_KEYS } from "../../bundles/names.ts";
import { groupConditions, groupErrors, groupKubernetesVersion } from "../../cluster/controllers/group-conditions.ts";
import { type AgentEvent, convergeState, instanceStatus, sameStatus } from "../../cluster/controllers/instance.ts";
import type { NodeView } from "../../cluster/controllers/model.ts";
import { groupPolicy } from "../../cluster/controllers/model.ts";
import type { CachedNode } from "../../cluster/controllers/node-cache.ts";
import { nodeStatus, operatorSamples } from "../../cluster/controllers/operator-metrics.ts";

const K = NODE_KEYS;
const SUM = "a".repeat(64);
const OLD = "b".repeat(64);
const NOW = Date.parse("2026-03-04T12:00:00Z");

const cached = (o: Partial<CachedNode> = {}): CachedNode => ({
  name: "w1",
  uid: "u1",
  resourceVersion: "1",
  created: NOW - 3_600_000,
  group: "worker",
  labels: { [K.group]: "worker" },
  annotations: { [K.checksum]: OLD },
  taints: [],
  providerID: "static://",
  unschedulable: false,
  ready: true,
  kubeletVersion: "v1.34.4",
  ...o,
});
const view = (annotations: Record<string, string>, o: Partial<NodeView> = {}): NodeView => ({
  name: "w1",
  uid: "u",
  resourceVersion: "1",
  group: "worker",
  ready: true,
  unschedulable: false,
  annotations,
  ...o,
});
let order = 0;
const ev = (reason: string, message: string, at: number, type = "Normal"): AgentEvent => ({
  reason,
  message,
  at,
  type,
  order: ++order,
});
const started = (c: string, at: number) =>
  ev(EVENTS.nodeUpdate, `converge to ${c.slice(0, 12)} started: new bundle`, at);
const failed = (c: string, at: number, step = "050_x") =>
  ev(EVENTS.nodeUpdate, `converge to ${c.slice(0, 12)} failed: step ${step} failed: exit 1`, at, "Warning");
const stepFailed = (at: number, step = "050_x") =>
  ev(EVENTS.stepFailed, `step ${step} failed: exit 1\n+ false\ntail of the log`, at, "Warning");

t.test("BashibleReady: applied, failing with the step's log tail, rejected, provisioning, in progress", async (t) => {
  t.match(convergeState(cached({ annotations: { [K.checksum]: SUM } }), SUM, []), {
    status: "True",
    reason: "StepsCompleted",
  });
  const failing = convergeState(cached(), SUM, [started(SUM, 1), stepFailed(2), failed(SUM, 2)]);
  t.match(failing, { status: "False", reason: "StepsFailed", step: "050_x" });
  t.match(failing.message, /tail of the log/, "the failing step's log tail");
  t.match(
    convergeState(cached(), SUM, [started(SUM, 1), stepFailed(2), failed(SUM, 2), started(SUM, 60)]),
    { status: "False", reason: "StepsFailed" },
    "a retry in progress does not clear the failure (no flapping while the agent retries)",
  );
  t.match(
    convergeState(cached(), SUM, [started(OLD, 1), failed(OLD, 2)]),
    { status: "Unknown", reason: "UpdateInProgress" },
    "a failure of an older bundle is history",
  );
  t.match(convergeState(cached(), SUM, [ev(EVENTS.bundleRejected, "checksum mismatch", 5, "Warning")]), {
    status: "False",
    reason: "Error",
  });
  t.match(convergeState(cached({ taints: [{ key: K.uninitializedTaint, effect: "NoSchedule" }] }), SUM, []), {
    status: "Unknown",
    reason: "InitialRunInProgress",
  });
});

t.test("Instance status: conditions with Deckhouse's reasons, summary, phase, stable transition times", async (t) => {
  const node = cached({ annotations: { [K.checksum]: OLD, [K.approved]: "", [K.disruptionRequired]: "" } });
  const s = instanceStatus({ node, approvalMode: "Manual", desired: SUM, events: [], current: undefined, now: NOW });
  t.equal(s.nodeRef.name, "w1");
  t.equal(s.currentStatus.phase, "Running");
  t.equal(s.bootstrapStatus, undefined);
  const c = Object.fromEntries(s.conditions.map((x) => [x.type, x]));
  t.match(c.WaitingDisruptionApproval, { status: "True", reason: "DisruptionApprovalRequired" });
  t.match(
    c.WaitingDisruptionApproval?.message,
    /kubectl annotate node w1 update.node.deckhouse.io\/disruption-approved=/,
  );
  t.match(c.WaitingApproval, { status: "False", reason: "UpdateApprovalNotRequired" });
  t.equal(s.bashibleStatus, "WaitingApproval");
  t.equal(s.message, c.WaitingDisruptionApproval?.message);
  const later = instanceStatus({
    node,
    approvalMode: "Manual",
    desired: SUM,
    events: [],
    current: s,
    now: NOW + 60_000,
  });
  t.ok(sameStatus(s, later), "nothing changed: the same status, times kept");
  const fixed = instanceStatus({
    node: cached({ annotations: { [K.checksum]: SUM } }),
    approvalMode: "Manual",
    desired: SUM,
    events: [],
    current: s,
    now: NOW + 60_000,
  });
  t.equal(fixed.bashibleStatus, "Ready");
  t.not(
    fixed.conditions[2]?.lastTransitionTime,
    s.conditions[2]?.lastTransitionTime,
    "a changed condition moves its time",
  );
  const failing = instanceStatus({
    node: cached({ annotations: { [K.checksum]: OLD, [K.waitingForApproval]: "" } }),
    approvalMode: "Automatic",
    desired: SUM,
    events: [started(SUM, 1), stepFailed(2), failed(SUM, 2)],
    current: undefined,
    now: NOW,
  });
  t.equal(failing.bashibleStatus, "WaitingApproval", "waiting wins the summary…");
  t.match(failing.message, /step 050_x failed/, "…but a problem leads the message");
  const fresh = instanceStatus({
    node: cached({ taints: [{ key: K.uninitializedTaint, effect: "NoSchedule" }] }),
    approvalMode: "Automatic",
    desired: SUM,
    events: [],
    current: undefined,
    now: NOW,
  });
  t.equal(fresh.currentStatus.phase, "Provisioning");
  t.match(fresh.bootstrapStatus?.description, /bootstrap.log/);
});

t.test("node_group_node_status: Deckhouse's statuses, first match wins", async (t) => {
  t.equal(nodeStatus(view({ [K.waitingForApproval]: "" }), "Automatic", SUM), "WaitingForApproval");
  t.equal(
    nodeStatus(view({ [K.approved]: "", [K.disruptionRequired]: "", [K.draining]: "bashible" }), "Automatic", SUM),
    "DrainingForDisruption",
  );
  t.equal(nodeStatus(view({ [K.draining]: "bashible" }), "Automatic", SUM), "Draining");
  t.equal(
    nodeStatus(view({ [K.draining]: "user" }), "Automatic", SUM),
    "UpdateFailedNoConfigChecksum",
    "another's drain is not ours",
  );
  t.equal(nodeStatus(view({ [K.drained]: "bashible", [K.checksum]: SUM }), "Automatic", SUM), "Drained");
  t.equal(
    nodeStatus(view({ [K.approved]: "", [K.disruptionRequired]: "" }), "Automatic", SUM),
    "WaitingForDisruptionApproval",
  );
  t.equal(
    nodeStatus(view({ [K.approved]: "", [K.disruptionRequired]: "" }), "Manual", SUM),
    "WaitingForManualDisruptionApproval",
  );
  t.equal(nodeStatus(view({ [K.approved]: "", [K.disruptionApproved]: "" }), "Manual", SUM), "DisruptionApproved");
  t.equal(nodeStatus(view({ [K.approved]: "" }), "Automatic", SUM), "Approved");
  t.equal(nodeStatus(view({}), "Automatic", SUM), "UpdateFailedNoConfigChecksum");
  t.equal(nodeStatus(view({ [K.checksum]: OLD }), "Automatic", SUM), "ToBeUpdated");
  t.equal(nodeStatus(view({ [K.checksum]: SUM }), "Automatic", SUM), "UpToDate");
});

t.test(
  "NodeGroup conditions: >90% Ready with a grace for new nodes, Updating, WaitingForDisruptiveApproval, Error",
  async (t) => {
    const nodes = Array.from({ length: 10 }, (_, i) => view({}, { name: `n${i}`, created: NOW - 3_600_000 }));
    const get = (c: ReturnType<typeof groupConditions>, type: string) => c.find((x) => x.type === type);
    t.equal(get(groupConditions(nodes, [], undefined, NOW), "Ready")?.status, "True");
    const oneDown = nodes.map((n, i) => (i === 0 ? { ...n, ready: false } : n));
    t.equal(
      get(groupConditions(oneDown, [], undefined, NOW), "Ready")?.status,
      "False",
      "9 of 10 is not more than 90%",
    );
    const young = oneDown.map((n, i) => (i === 0 ? { ...n, created: NOW - 60_000 } : n));
    t.equal(
      get(groupConditions(young, [], undefined, NOW), "Ready")?.status,
      "True",
      "a node created a minute ago counts",
    );
    const cordoned = oneDown.map((n, i) => (i === 0 ? { ...n, unschedulable: true } : n));
    t.equal(
      get(groupConditions(cordoned, [], undefined, NOW), "Ready")?.status,
      "True",
      "only schedulable nodes count",
    );
    t.equal(get(groupConditions([], [], undefined, NOW), "Ready")?.status, "True", "no nodes: Ready");
    const upd = [view({ [K.approved]: "", [K.disruptionRequired]: "" })];
    t.equal(get(groupConditions(upd, [], undefined, NOW), "Updating")?.status, "True");
    t.equal(get(groupConditions(upd, [], undefined, NOW), "WaitingForDisruptiveApproval")?.status, "True");
    const errs = groupConditions(nodes, ["a", "b"], undefined, NOW);
    t.match(get(errs, "Error"), { status: "True", message: "a|b" });
    const again = groupConditions(nodes, ["a", "b"], errs, NOW + 999_000);
    t.equal(get(again, "Error")?.lastTransitionTime, get(errs, "Error")?.lastTransitionTime, "unchanged: time kept");
    t.equal(
      groupKubernetesVersion([view({}, { kubeletVersion: "v1.34.4" }), view({}, { kubeletVersion: "v1.33.9" })]),
      "1.33",
    );
    t.same(
      groupErrors("worker", undefined, [
        {
          metadata: { name: "bad" },
          status: { error: "line 3: 'template' is not supported", failedNodeGroups: ["worker"] },
        },
        { metadata: { name: "other" }, status: { error: "x", failedNodeGroups: ["front"] } },
        { metadata: { name: "fine" }, status: {} },
      ]),
      ["NodeGroupConfiguration bad: line 3: 'template' is not supported"],
    );
  },
);

t.test(
  "gauges: one status per node set to 1, unmanaged nodes, configurations per group, failing converges",
  async (t) => {
    const policy = groupPolicy({
      metadata: { name: "worker" },
      spec: { nodeType: "Static", disruptions: { approvalMode: "Manual" } },
    });
    const s = operatorSamples({
      update: {
        groups: [{ policy, spec: { nodeType: "Static", fencing: { mode: "Watchdog" } } }],
        nodes: [view({ [K.approved]: "", [K.disruptionRequired]: "" })],
        checksums: new Map([["worker", SUM]]),
        drainTrouble: new Map([["w2", "pods could not be evicted"]]),
      },
      nodes: [cached(), cached({ name: "stray", group: "", labels: {} })],
      configurations: [
        { metadata: { name: "a" }, spec: { nodeGroups: ["worker"] } },
        { metadata: { name: "b" }, spec: {} },
      ],
      converge: [{ node: cached(), state: { status: "False", reason: "StepsFailed", message: "x", step: "050_x" } }],
    });
    const on = (s.node_group_node_status ?? []).filter((x) => x.value === 1).map((x) => x.labels.status);
    t.same(on, ["WaitingForManualDisruptionApproval"]);
    t.equal(s.node_group_node_status?.length, 11, "every status, as Deckhouse exports them");
    t.same(s.node_group_info, [{ labels: { name: "worker", cri_type: "Containerd" }, value: 1 }]);
    t.same(s.d8_unmanaged_nodes_on_cluster, [{ labels: { node: "stray" }, value: 1 }]);
    t.same(
      s.d8_node_group_configurations_total?.map((x) => [x.labels.node_group, x.value]),
      [
        ["worker", 1],
        ["*", 1],
      ],
    );
    t.same(s.d8_node_draining, [{ labels: { node: "w2", message: "pods could not be evicted" }, value: 1 }]);
    t.same(s.bashible_node_converge_failing, [
      { labels: { node: "w1", node_group: "worker", step: "050_x" }, value: 1 },
    ]);
    t.same(
      s.bashible_node_fencing_disarmed,
      [{ labels: { node: "w1", node_group: "worker" }, value: 1 }],
      "a Ready node of a Watchdog group without the fencing label",
    );
  },
);
