// The update controller against a real kube-apiserver and kube-controller-manager (which keeps
// PodDisruptionBudget status, so evictions are refused exactly as in a cluster): Node objects of
// one group per scenario, Pods bound to them, the node side of the handshake played by
// annotation patches. What the controller did is read back from the Nodes, its Events and the
// API server's audit log.
import t from "tap";
import { readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import { pino } from "pino";
import { NODE_KEYS, SECRETS } from "../../bundles/names.ts";
import { UpdateController } from "../../cluster/controllers/controller.ts";
import { installCrds } from "../../cluster/crds/install.ts";
import { KubeClient } from "../../lib/kube/client.ts";
import { loadKubeconfig } from "../../lib/kube/kubeconfig.ts";
import { list, type KubeObject } from "../../lib/kube/api.ts";
import { Informer } from "../../lib/informer.ts";
import { withControlPlane } from "../../scripts/lib/control-plane-fixture.ts";
import {
  annotate,
  createNode,
  createPod,
  parseAudit,
  POD_AUDIT_POLICY,
  setReady,
  startKubeletSim,
} from "../../scripts/lib/sim-nodes.ts";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import { until } from "../../scripts/lib/until.ts";

const K = NODE_KEYS;
const NS = "d8-cloud-instance-manager";
const SUM = (g: string) => `${g}`.padEnd(64, "0").replace(/[^0-9a-f]/g, "e");
const log = pino({ level: process.env.TEST_LOG ? "debug" : "silent" });

const auditDir = await mkdtemp(path.join(os.tmpdir(), "bashible-audit-"));
t.teardown(() => rm(auditDir, { recursive: true, force: true }));
const auditPolicy = path.join(auditDir, "policy.yaml");
const auditLog = path.join(auditDir, "audit.log");
await writeFile(auditPolicy, POD_AUDIT_POLICY);
const cp = await withControlPlane(t, {
  // No nodelifecycle: it would mark these kubelet-less Nodes NotReady.
  controllerManager: { controllers: ["disruption", "serviceaccount"] },
  extraApiserverArgs: [`--audit-policy-file=${auditPolicy}`, `--audit-log-path=${auditLog}`],
});
const admin = cp.admin;
await installCrds(admin);
await cp.kubectl(["create", "namespace", NS]);
const client = new KubeClient(await loadKubeconfig(cp.adminKubeconfig), { userAgent: "bashible-controller" });
t.teardown(() => client.close());

// The controller's client, through which a test can hold back the response to one Node write
// (the write itself reaches the API server at once), as a busy machine delays a response.
let holdWriteTo: { node: string; released: Promise<void>; written?: () => void } | undefined;
const gated = Object.create(client) as KubeClient;
gated.request = async <T>(method: string, p: string, opts?: Parameters<KubeClient["request"]>[2]) => {
  const res = await client.request<T>(method, p, opts);
  const hold = holdWriteTo;
  if (hold && method === "PATCH" && p === `/api/v1/nodes/${hold.node}`) {
    holdWriteTo = undefined;
    hold.written?.();
    await hold.released;
  }
  return res;
};

// The clock the controller sees: real time plus an offset the window test moves forward.
let offset = 0;
// What the controller's Node watch delivered, by Node: the latest object.
const watched = new Map<string, KubeObject>();
const controller = new UpdateController({
  client: gated,
  onNodeEvent: (ev) => {
    if (ev.type !== "SYNC") watched.set(ev.object.metadata.name, ev.object);
  },
  log,
  now: () => Date.now() + offset,
  evictionRetryMs: 300,
  drainTimeoutMs: 60_000,
  statusIntervalMs: 50,
});
controller.start();
t.teardown(() => controller.stop());
const kubelet = startKubeletSim(admin, log);
t.teardown(() => kubelet.stop());

const checksums = new Map<string, string>();
async function setGroupChecksum(group: string): Promise<string> {
  checksums.set(group, SUM(group));
  const data = Object.fromEntries([...checksums].map(([g, c]) => [g, Buffer.from(c).toString("base64")]));
  await cp.kubectl(["apply", "-f", "-"], {
    input: JSON.stringify({
      apiVersion: "v1",
      kind: "Secret",
      metadata: { name: SECRETS.checksums, namespace: NS },
      data,
    }),
  });
  return SUM(group);
}

async function nodeGroup(name: string, spec: Record<string, unknown> = {}): Promise<void> {
  await cp.kubectl(["apply", "-f", "-"], {
    input: JSON.stringify({
      apiVersion: "deckhouse.io/v1",
      kind: "NodeGroup",
      metadata: { name },
      spec: { nodeType: "Static", ...spec },
    }),
  });
}

const getNode = (name: string) =>
  admin.request<KubeObject & { spec?: { unschedulable?: boolean } }>("GET", `/api/v1/nodes/${name}`);
const ann = async (name: string) => (await getNode(name)).metadata.annotations ?? {};

interface EventObj {
  reason: string;
  message: string;
  involvedObject: { name: string };
  source?: { component?: string };
}
async function eventsFor(node: string): Promise<EventObj[]> {
  const l = await list<EventObj>(admin, "/api/v1/namespaces/default/events", {
    fieldSelector: `involvedObject.name=${node}`,
  });
  return l.items.filter((e) => e.source?.component === "bashible-controller");
}
const eventMatching = (node: string, re: RegExp) =>
  until(`an Event on ${node} matching ${re}`, async () => (await eventsFor(node)).find((e) => re.test(e.message)));

/** Watches a group's Nodes and records the most that ever held `approved` at once. */
function approvalMonitor(group: string) {
  let max = 0;
  const order: string[] = [];
  const inf = new Informer({
    client: admin,
    path: "/api/v1/nodes",
    labelSelector: `${K.group}=${group}`,
    log,
    onEvent: (ev) => {
      if (ev.type === "SYNC") return;
      const approved = [...inf.objects.values()].filter((n) => n.metadata.annotations?.[K.approved] !== undefined);
      max = Math.max(max, approved.length);
      for (const n of approved) if (!order.includes(n.metadata.name)) order.push(n.metadata.name);
    },
  });
  inf.run();
  return {
    get max() {
      return max;
    },
    order,
    stop: () => inf.stop(),
  };
}

/** The node side: ask, wait for approval, apply (write the checksum). */
async function rollOut(names: string[], desired: string): Promise<void> {
  const done = new Set<string>();
  while (done.size < names.length) {
    for (const n of names) {
      if (done.has(n)) continue;
      const a = await ann(n);
      if (a[K.approved] !== undefined && a[K.checksum] !== desired) {
        await annotate(admin, n, { [K.checksum]: desired });
      }
      if (a[K.checksum] === desired && a[K.approved] === undefined) done.add(n);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

for (const [group, maxConcurrent, nodes, expect] of [
  ["one", undefined, 3, 1],
  ["two", 2, 4, 2],
  ["half", "50%", 4, 2],
] as const) {
  t.test(
    `maxConcurrent ${maxConcurrent ?? "default"}: at most ${expect} of ${nodes} nodes approved at once`,
    async (t) => {
      const desired = await setGroupChecksum(group);
      const names = Array.from({ length: nodes }, (_, i) => `${group}-${i + 1}`);
      // Every node asks before the group exists, so the first decision sees them all.
      for (const n of names) await createNode(admin, n, group, { annotations: { [K.waitingForApproval]: "" } });
      const monitor = approvalMonitor(group);
      t.teardown(() => monitor.stop());
      await nodeGroup(group, maxConcurrent === undefined ? {} : { update: { maxConcurrent } });
      await rollOut(names, desired);
      t.equal(monitor.max, expect, `never more than ${expect} approved at a time`);
      t.same(monitor.order.slice(0, expect).sort(), names.slice(0, expect), "the first approved in name order");
      for (const n of names) {
        const a = await ann(n);
        t.same(
          Object.keys(a).filter((k) => k.startsWith("update.node.deckhouse.io/")),
          [],
          `${n}: update annotations cleared once up to date`,
        );
      }
      const ng = await until("status caught up", async () => {
        const o = await admin.request<{ status?: { upToDate?: number; nodes?: number } }>(
          "GET",
          `/apis/deckhouse.io/v1/nodegroups/${group}`,
        );
        return o.status?.upToDate === nodes ? o : undefined;
      });
      t.equal(ng.status?.nodes, nodes, "NodeGroup status counts the nodes");
      t.match((await eventsFor(names[0]!)).map((e) => e.message).join("\n"), /update approved: 1 of at most/);
    },
  );
}

t.test("nothing is approved while a node of the group is NotReady; a NotReady one that asks goes first", async (t) => {
  await nodeGroup("sick");
  await setGroupChecksum("sick");
  await createNode(admin, "sick-1", "sick");
  await createNode(admin, "sick-2", "sick");
  await createNode(admin, "sick-3", "sick", { ready: false });
  await annotate(admin, "sick-1", { [K.waitingForApproval]: "" });
  const ev = await eventMatching("sick-1", /waits for approval: node sick-3 of group sick is not Ready/);
  t.ok(ev);
  t.equal((await ann("sick-1"))[K.approved], undefined, "the Ready node waits");
  await annotate(admin, "sick-3", { [K.waitingForApproval]: "" });
  await until("sick-3 approved", async () => (await ann("sick-3"))[K.approved] !== undefined);
  t.equal((await ann("sick-1"))[K.approved], undefined, "still only the NotReady node");
  await annotate(admin, "sick-3", { [K.checksum]: checksums.get("sick")! });
  await setReady(admin, "sick-3", true);
  await until("sick-1 approved once all are Ready", async () => (await ann("sick-1"))[K.approved] !== undefined);
  t.equal((await ann("sick-3"))[K.approved], undefined, "sick-3 finished and was cleared");
});

t.test("a write whose response comes after the watch showed it and a later change holds nothing", async (t) => {
  await nodeGroup("late", { disruptions: { approvalMode: "Automatic" } });
  const desired = await setGroupChecksum("late");
  await createNode(admin, "late-1", "late");
  let release = () => {};
  const written = new Promise<void>((resolve) => {
    holdWriteTo = { node: "late-1", released: new Promise((r) => (release = r)), written: resolve };
  });
  await annotate(admin, "late-1", { [K.waitingForApproval]: "" });
  await written;
  t.ok((await ann("late-1"))[K.approved] !== undefined, "the approval is written; its response is held");
  // Someone else writes the Node at once (a label, an agent's annotation): a later change the
  // watch delivers before the controller reads its write's response. It asks no decision of it.
  t.teardown(() => release());
  const later = await admin.request<KubeObject>("PATCH", "/api/v1/nodes/late-1", {
    body: { metadata: { annotations: { "example.com/touched": "1" } } },
  });
  await until(
    "the controller's watch to show the later change",
    () => watched.get("late-1")?.metadata.resourceVersion === later.metadata.resourceVersion,
  );
  release();
  // The pass that wrote the approval is still running: settled() waits for it to end.
  await controller.settled();
  t.same(
    controller.pendingNodes.filter((n) => n === "late-1"),
    [],
    "no decision on late-1 waits for an event the watch delivered already",
  );
  await annotate(admin, "late-1", { [K.disruptionRequired]: "" });
  await until("the disruption approved", async () => (await ann("late-1"))[K.disruptionApproved] !== undefined);
  await annotate(admin, "late-1", { [K.checksum]: desired });
  await until("cleared", async () => Object.keys(await ann("late-1")).every((k) => !k.startsWith("update.node")));
});

t.test("Manual: the node waits with disruption-required until the operator approves", async (t) => {
  await nodeGroup("manual", { disruptions: { approvalMode: "Manual" } });
  const desired = await setGroupChecksum("manual");
  await createNode(admin, "manual-1", "manual");
  await annotate(admin, "manual-1", { [K.waitingForApproval]: "" });
  await until("approved", async () => (await ann("manual-1"))[K.approved] !== undefined);
  await annotate(admin, "manual-1", { [K.disruptionRequired]: "" });
  const ev = await eventMatching(
    "manual-1",
    /waits for disruption approval \(node group manual, approvalMode Manual\)/,
  );
  t.match(ev.message, /kubectl annotate node manual-1 update.node.deckhouse.io\/disruption-approved=/);
  const a = await ann("manual-1");
  t.equal(a[K.disruptionApproved], undefined);
  t.equal(a[K.draining], undefined, "not drained in Manual mode");
  t.notOk((await getNode("manual-1")).spec?.unschedulable, "not cordoned");
  const st = await until("status shows the wait", async () => {
    const o = await admin.request<{ status?: { waitingForDisruptionApproval?: number } }>(
      "GET",
      "/apis/deckhouse.io/v1/nodegroups/manual",
    );
    return o.status?.waitingForDisruptionApproval === 1 ? o : undefined;
  });
  t.ok(st);
  await cp.kubectl(["annotate", "node", "manual-1", `${K.disruptionApproved}=`]);
  await annotate(admin, "manual-1", { [K.checksum]: desired });
  await until("cleared", async () => Object.keys(await ann("manual-1")).every((k) => !k.startsWith("update.node")));
});

t.test("Automatic: cordon, evict honouring the PDB, delete what is left after the timeout, approve", async (t) => {
  await nodeGroup("auto", { nodeDrainTimeoutSecond: 3 });
  const desired = await setGroupChecksum("auto");
  await createNode(admin, "auto-1", "auto");
  await createNode(admin, "auto-2", "auto");
  await cp.kubectl(["create", "namespace", "apps"]);
  await until("the namespace's default ServiceAccount", () =>
    admin.request("GET", "/api/v1/namespaces/apps/serviceaccounts/default"),
  );
  await createPod(admin, "apps", "free", "auto-1", { labels: { app: "free" } });
  await createPod(admin, "apps", "guarded", "auto-1", { labels: { app: "guarded" } });
  await createPod(admin, "apps", "ds-pod", "auto-1", {
    ownerReferences: [
      {
        apiVersion: "apps/v1",
        kind: "DaemonSet",
        name: "ds",
        uid: "0f0f0f0f-0000-0000-0000-000000000001",
        controller: true,
      },
    ],
  });
  await createPod(admin, "apps", "static-pod", "auto-1", { annotations: { "kubernetes.io/config.mirror": "abc" } });
  await createPod(admin, "apps", "elsewhere", "auto-2", { labels: { app: "guarded" } });
  await cp.kubectl(["apply", "-f", "-"], {
    input: JSON.stringify({
      apiVersion: "policy/v1",
      kind: "PodDisruptionBudget",
      metadata: { name: "guarded", namespace: "apps" },
      spec: { minAvailable: 2, selector: { matchLabels: { app: "guarded" } } },
    }),
  });
  // kube-controller-manager's disruption controller has to count the pods first.
  await until("PDB status computed", async () => {
    const p = await admin.request<{
      metadata: { generation: number };
      status?: { observedGeneration?: number; disruptionsAllowed?: number; currentHealthy?: number };
    }>("GET", "/apis/policy/v1/namespaces/apps/poddisruptionbudgets/guarded");
    return p.status?.observedGeneration === p.metadata.generation && p.status?.currentHealthy === 2 ? p : undefined;
  });

  await annotate(admin, "auto-1", { [K.waitingForApproval]: "" });
  await until("approved", async () => (await ann("auto-1"))[K.approved] !== undefined);
  await annotate(admin, "auto-1", { [K.disruptionRequired]: "" });

  const refused = await eventMatching("auto-1", /eviction of pod apps\/guarded refused/);
  t.match(refused.message, /disruption budget/i, "the PDB is why");
  const mid = await getNode("auto-1");
  t.equal(mid.spec?.unschedulable, true, "cordoned");
  t.equal(mid.metadata.annotations?.[K.draining], "bashible");
  t.equal(mid.metadata.annotations?.[K.disruptionApproved], undefined, "not approved while draining");

  await until("disruption approved", async () => (await ann("auto-1"))[K.disruptionApproved] !== undefined);
  const a = await ann("auto-1");
  t.equal(a[K.drained], "bashible");
  t.equal(a[K.draining], undefined);
  t.equal(a[K.disruptionRequired], undefined);
  const timedOut = await eventMatching("auto-1", /drain timed out after 3 s: deleted apps\/guarded without eviction/);
  t.ok(timedOut);
  t.match(
    a[K.drainForced],
    /^\d{4}-\d\d-\d\dT[\d:.]+Z: deleted apps\/guarded without eviction/,
    "recorded as forced on the Node",
  );

  const pods = (await list(admin, "/api/v1/namespaces/apps/pods")).items.map((p) => p.metadata.name).sort();
  t.same(pods, ["ds-pod", "elsewhere", "static-pod"], "DaemonSet and mirror pods stay; the pod on another node too");
  const audit = parseAudit(await readFile(auditLog, "utf8")).filter((e) =>
    e.userAgent.startsWith("bashible-controller"),
  );
  const evictions = (name: string, code?: number) =>
    audit.filter((e) => e.subresource === "eviction" && e.name === name && (code === undefined || e.code === code));
  t.equal(evictions("free", 201).length, 1, "free evicted once");
  t.ok(evictions("guarded", 429).length >= 2, "guarded: evictions refused and retried");
  t.equal(evictions("guarded", 201).length, 0, "the PDB held");
  t.equal(evictions("ds-pod").length, 0, "DaemonSet pods are not evicted");
  t.equal(evictions("static-pod").length, 0, "mirror pods are not evicted");
  t.same(
    audit.filter((e) => e.verb === "delete" && e.resource === "pods" && !e.subresource).map((e) => e.name),
    ["guarded"],
    "only the guarded pod deleted, after the timeout",
  );

  await annotate(admin, "auto-1", { [K.disruptionApproved]: "", [K.checksum]: desired });
  await until("uncordoned and cleared", async () => {
    const n = await getNode("auto-1");
    return (
      !n.spec?.unschedulable &&
      Object.keys(n.metadata.annotations ?? {}).every(
        (k) => !k.startsWith("update.node") && (!k.startsWith("bashible.deckhouse.io/") || k === K.drainForced),
      )
    );
  });
  t.pass("uncordoned once up to date, since the controller cordoned it");
  t.ok(
    (await ann("auto-1"))[K.drainForced],
    "the forced drain stays on record until a drain of the node needs no force",
  );
});

t.test("Automatic inside maintenance windows: held until the window opens (injected clock)", async (t) => {
  // Move the controller's clock to 21:00 UTC of the coming day, an hour before the window.
  const day = Math.floor(Date.now() / 86_400_000) * 86_400_000 + 86_400_000;
  offset = day + 21 * 3600_000 - Date.now();
  await nodeGroup("window", {
    disruptions: { approvalMode: "Automatic", automatic: { windows: [{ from: "22:00", to: "23:00" }] } },
  });
  const desired = await setGroupChecksum("window");
  await createNode(admin, "window-1", "window", {
    annotations: { [K.approved]: "", [K.disruptionRequired]: "" },
  });
  const ev = await eventMatching("window-1", /waits for a maintenance window of node group window/);
  t.match(ev.message, /the next opens \d{4}-\d\d-\d\dT22:00 UTC/);
  t.equal((await ann("window-1"))[K.draining], undefined, "no drain outside the window");
  t.notOk((await getNode("window-1")).spec?.unschedulable);
  offset += 3600_000;
  controller.poke();
  await until("approved inside the window", async () => (await ann("window-1"))[K.disruptionApproved] !== undefined);
  t.equal((await ann("window-1"))[K.drained], "bashible", "drained first (nothing to evict)");
  await annotate(admin, "window-1", { [K.checksum]: desired });
  await until("cleared", async () => (await ann("window-1"))[K.approved] === undefined);
});

t.test("RollingUpdate: a node asking for a disruption is marked for replacement", async (t) => {
  await nodeGroup("rolling", { disruptions: { approvalMode: "RollingUpdate" } });
  await setGroupChecksum("rolling");
  await createNode(admin, "rolling-1", "rolling", { annotations: { [K.approved]: "", [K.disruptionRequired]: "" } });
  await until("marked", async () => (await ann("rolling-1"))[K.rollingUpdate] !== undefined);
  t.equal((await ann("rolling-1"))[K.disruptionApproved], undefined);
  await eventMatching("rolling-1", /waits to be replaced/);
});
