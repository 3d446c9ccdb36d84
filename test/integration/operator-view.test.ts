// What an operator sees, against a real kube-apiserver and kube-controller-manager, with the
// controllers as the cluster runs them (runControllers: the Lease, the update controller and
// the ones beside it): the nodeTemplate kept on Nodes, an Instance per static Node derived from
// the Events a node posts with its own credentials, NodeGroup status with Deckhouse's
// conditions and a failing NodeGroupConfiguration, the Deckhouse-named metrics, and drains
// (Deckhouse's exceptions, a forced drain recorded as such).
import t from "tap";
import { execFile, spawn } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { pino } from "pino";
import { EVENTS, INSTANCES, NODE_KEYS, SECRETS } from "../../bundles/names.ts";
import { ControllerMetrics } from "../../cluster/controllers/metrics.ts";
import { runControllers } from "../../cluster/controllers/run.ts";
import { installCrds } from "../../cluster/crds/install.ts";
import { createEvent, list, type KubeObject } from "../../lib/kube/api.ts";
import { KubeClient } from "../../lib/kube/client.ts";
import { loadKubeconfig } from "../../lib/kube/kubeconfig.ts";
import { withControlPlane } from "../../scripts/lib/control-plane-fixture.ts";
import { annotate, createNode, createPod, startKubeletSim } from "../../scripts/lib/sim-nodes.ts";
import { until } from "../../scripts/lib/until.ts";

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const K = NODE_KEYS;
const NS = "d8-cloud-instance-manager";
const log = pino({ level: process.env.TEST_LOG ? "debug" : "silent" });
const SUM = (g: string) => `${g}`.padEnd(64, "0").replace(/[^0-9a-f]/g, "c");

const cp = await withControlPlane(t, { controllerManager: { controllers: ["disruption", "serviceaccount"] } });
const admin = cp.admin;
await installCrds(admin);
await cp.kubectl(["create", "namespace", NS]);
// As `bashible controllers` makes it: a dozen watches hold a connection each.
const client = new KubeClient(await loadKubeconfig(cp.adminKubeconfig), {
  userAgent: "bashible-controller",
  maxSockets: 64,
});
t.teardown(() => client.close());
const metrics = new ControllerMetrics();
const leadership = runControllers({
  client,
  log,
  namespace: NS,
  leaseDurationSeconds: 2,
  retryMs: 100,
  metrics,
  controller: { evictionRetryMs: 300, statusIntervalMs: 50 },
});
t.teardown(() => leadership.stop());
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
const apply = (obj: unknown) => cp.kubectl(["apply", "-f", "-"], { input: JSON.stringify(obj) });
const nodeGroup = (name: string, spec: Record<string, unknown> = {}) =>
  apply({
    apiVersion: "deckhouse.io/v1",
    kind: "NodeGroup",
    metadata: { name },
    spec: { nodeType: "Static", ...spec },
  });

interface NodeObj extends KubeObject {
  spec?: { unschedulable?: boolean; taints?: { key: string; value?: string; effect: string }[]; providerID?: string };
}
const getNode = (name: string) => admin.request<NodeObj>("GET", `/api/v1/nodes/${name}`);
interface InstanceObj extends KubeObject {
  status?: {
    nodeRef?: { name: string };
    currentStatus?: { phase: string };
    bootstrapStatus?: { description: string };
    conditions?: { type: string; status: string; reason: string; message: string }[];
    bashibleStatus?: string;
    message?: string;
  };
}
const getInstance = (name: string) => admin.request<InstanceObj>("GET", `${INSTANCES.path}/${name}`);
const condition = (i: InstanceObj, type: string) => i.status?.conditions?.find((c) => c.type === type);

t.test(
  "nodeTemplate: applied to every Node of the group, kept as the template changes, others' keys left alone",
  async (t) => {
    await nodeGroup("tpl", {
      nodeTemplate: {
        labels: { tier: "front", "node-role.kubernetes.io/edge": "" },
        annotations: { "example.com/owner": "team-a" },
        taints: [{ key: "dedicated", value: "front", effect: "NoSchedule" }],
      },
    });
    await createNode(admin, "tpl-1", "tpl");
    // As a kubelet registers it: with the labels and taints it may set itself already there.
    await admin.request("POST", "/api/v1/nodes", {
      body: {
        apiVersion: "v1",
        kind: "Node",
        metadata: { name: "tpl-2", labels: { [K.group]: "tpl", tier: "front" } },
        spec: { taints: [{ key: "dedicated", value: "front", effect: "NoSchedule" }] },
      },
    });
    for (const name of ["tpl-1", "tpl-2"]) {
      const n = await until(`${name} carries the template`, async () => {
        const n = await getNode(name);
        return n.metadata.annotations?.[K.lastAppliedNodeTemplate] ? n : undefined;
      });
      t.equal(n.metadata.labels?.tier, "front", `${name}: template label`);
      t.equal(
        n.metadata.labels?.["node-role.kubernetes.io/edge"],
        "",
        `${name}: a kubernetes.io label set from the cluster side`,
      );
      t.equal(n.metadata.labels?.["node-role.kubernetes.io/tpl"], "", `${name}: Deckhouse's role label for the group`);
      t.equal(n.metadata.labels?.[K.nodeType], "Static", `${name}: the group's type`);
      t.equal(n.metadata.annotations?.["example.com/owner"], "team-a", `${name}: template annotation`);
      t.same(
        n.spec?.taints?.filter((x) => x.key === "dedicated"),
        [{ key: "dedicated", value: "front", effect: "NoSchedule" }],
        `${name}: one taint, not a second copy of the one the kubelet registered`,
      );
      t.equal(n.spec?.providerID, "static://", `${name}: static providerID`);
    }
    // Someone else's label, annotation and taint on tpl-1.
    await admin.request("PATCH", "/api/v1/nodes/tpl-1", {
      body: {
        metadata: { labels: { "their.io/label": "x" }, annotations: { "their.io/note": "y" } },
        spec: {
          taints: [
            ...((await getNode("tpl-1")).spec?.taints ?? []),
            { key: "their.io/taint", effect: "PreferNoSchedule" },
          ],
        },
      },
    });
    await nodeGroup("tpl", {
      nodeTemplate: { labels: { zone: "b" }, taints: [{ key: "dedicated", value: "back", effect: "NoSchedule" }] },
    });
    const n = await until("the new template on tpl-1", async () => {
      const n = await getNode("tpl-1");
      return n.metadata.labels?.zone === "b" && n.metadata.labels?.tier === undefined ? n : undefined;
    });
    t.equal(n.metadata.labels?.["node-role.kubernetes.io/edge"], undefined, "a label the template dropped is removed");
    t.equal(n.metadata.annotations?.["example.com/owner"], undefined, "an annotation the template dropped is removed");
    t.equal(n.metadata.labels?.["their.io/label"], "x", "another's label stays");
    t.equal(n.metadata.annotations?.["their.io/note"], "y", "another's annotation stays");
    t.same(
      n.spec?.taints
        ?.filter((x) => !x.key.startsWith("node.kubernetes.io/")) // the API server's own
        .map((x) => `${x.key}=${x.value ?? ""}:${x.effect}`)
        .sort(),
      ["dedicated=back:NoSchedule", "their.io/taint=:PreferNoSchedule"],
      "the template's taint changed in place, another's kept",
    );
    t.match(metrics.text(), /bashible_node_template_patches_total\{node_group="tpl"\} [3-9]/, "patches counted");
  },
);

t.test("Instance: one per static Node, from the Node and the Events the node posts", async (t) => {
  await nodeGroup("inst");
  const desired = await setGroupChecksum("inst");
  await admin.request("POST", "/api/v1/nodes", {
    body: {
      apiVersion: "v1",
      kind: "Node",
      metadata: { name: "inst-1", labels: { [K.group]: "inst" } },
      spec: { taints: [{ key: K.uninitializedTaint, effect: "NoSchedule" }] },
    },
  });
  const fresh = await until("the Instance", async () => {
    const i = await getInstance("inst-1").catch(() => undefined);
    return i?.status?.currentStatus ? i : undefined;
  });
  t.equal(fresh.status?.nodeRef?.name, "inst-1");
  t.equal(fresh.status?.currentStatus?.phase, "Provisioning", "the first converge has not finished");
  t.match(fresh.status?.bootstrapStatus?.description, /bootstrap\.log/, "where the bootstrap logs are");
  t.match(condition(fresh, "BashibleReady"), { status: "Unknown", reason: "InitialRunInProgress" });
  t.equal(fresh.metadata.labels?.[K.group], "inst");
  t.same(fresh.metadata.finalizers, [INSTANCES.finalizer], "Deckhouse's finalizer");

  // The node's agent, with the node's own credentials, as NodeReporter posts them.
  const id = await cp.mintNode("inst-1");
  const nodeClient = new KubeClient(await loadKubeconfig(id.kubeconfig), { userAgent: "bashible" });
  t.teardown(() => nodeClient.close());
  const post = (reason: string, message: string, type: "Normal" | "Warning" = "Normal") =>
    createEvent(nodeClient, {
      involved: { kind: "Node", name: "inst-1", apiVersion: "v1" },
      reason,
      message,
      type,
      host: "inst-1",
    });
  await post(EVENTS.nodeUpdate, `converge to ${desired.slice(0, 12)} started: first run`);
  await post(
    EVENTS.stepFailed,
    "step 050_install_tools failed: exit status 100\nE: Unable to locate package nope",
    "Warning",
  );
  await post(
    EVENTS.nodeUpdate,
    `converge to ${desired.slice(0, 12)} failed: step 050_install_tools failed: exit status 100`,
    "Warning",
  );
  const failing = await until("BashibleReady False", async () => {
    const i = await getInstance("inst-1");
    return condition(i, "BashibleReady")?.status === "False" ? i : undefined;
  });
  t.match(condition(failing, "BashibleReady"), { reason: "StepsFailed", message: /Unable to locate package nope/ });
  t.equal(failing.status?.bashibleStatus, "Error");
  t.match(failing.status?.message, /050_install_tools/, "the failing step leads the message");
  t.match(
    metrics.text(),
    /bashible_node_converge_failing\{node="inst-1",node_group="inst",step="050_install_tools"\} 1/,
    "the failing converge in the metrics",
  );
  const table = await cp.kubectl(["get", "instance", "inst-1"]);
  t.match(table, /NAME\s+STATUS\s+BASHIBLE\s+NODE\s+GROUP\s+AGE/);
  t.match(table, /inst-1\s+Provisioning\s+Error\s+inst-1\s+inst\s/);

  // The first converge goes through: the taint comes off, the checksum is written.
  await admin.request("PATCH", "/api/v1/nodes/inst-1", {
    body: { metadata: { annotations: { [K.checksum]: desired } }, spec: { taints: null } },
  });
  const ready = await until("Running and Ready", async () => {
    const i = await getInstance("inst-1");
    return i.status?.bashibleStatus === "Ready" && i.status.currentStatus?.phase === "Running" ? i : undefined;
  });
  t.equal(ready.status?.bootstrapStatus, undefined, "no bootstrap status once Running");
  t.match(condition(ready, "BashibleReady"), { status: "True", reason: "StepsCompleted" });
  t.notMatch(metrics.text(), /bashible_node_converge_failing\{node="inst-1"/, "no longer failing");

  // Another node holds the group's only update slot, so inst-1 keeps waiting.
  await createNode(admin, "inst-2", "inst", { annotations: { [K.approved]: "", [K.checksum]: SUM("old") } });
  await annotate(admin, "inst-1", { [K.waitingForApproval]: "" });
  const waiting = await until("WaitingApproval", async () => {
    const i = await getInstance("inst-1");
    return condition(i, "WaitingApproval")?.status === "True" ? i : undefined;
  });
  t.equal(condition(waiting, "WaitingApproval")?.reason, "UpdateApprovalRequired");
  t.equal(waiting.status?.bashibleStatus, "WaitingApproval");

  // Deleting it: the finalizer comes off at once, the Node stays, the Instance comes back fresh.
  const uid = waiting.metadata.uid;
  await cp.kubectl(["delete", "instance", "inst-1", "--wait=false"]);
  const again = await until(
    "the Instance again",
    async () => {
      const i = await getInstance("inst-1").catch(() => undefined);
      return i && i.metadata.uid !== uid && i.status?.conditions ? i : undefined;
    },
    60_000,
  );
  t.ok(again, "recreated while the Node is in the group");
  t.equal((await getNode("inst-1")).metadata.name, "inst-1", "the Node is untouched");

  await admin.request("DELETE", "/api/v1/nodes/inst-1");
  await admin.request("DELETE", "/api/v1/nodes/inst-2");
  await until("gone with its Node", async () => {
    const r = await admin.raw("GET", `${INSTANCES.path}/inst-1`);
    return r.status === 404;
  });
  t.pass("the Instance of a deleted Node is deleted");
});

t.test(
  "NodeGroup status: Deckhouse's conditions, kubernetesVersion, a failing NodeGroupConfiguration as Error",
  async (t) => {
    // Manual: st-2 stays waiting for its disruption approval.
    await nodeGroup("st", { disruptions: { approvalMode: "Manual" } });
    const desired = await setGroupChecksum("st");
    await createNode(admin, "st-1", "st");
    await createNode(admin, "st-2", "st");
    await admin.request("PATCH", "/api/v1/nodes/st-1/status", {
      contentType: "application/strategic-merge-patch+json",
      body: { status: { nodeInfo: { kubeletVersion: "v1.34.4" } } },
    });
    await annotate(admin, "st-1", { [K.checksum]: desired });
    await annotate(admin, "st-2", { [K.approved]: "", [K.disruptionRequired]: "" });
    await apply({
      apiVersion: "deckhouse.io/v1alpha1",
      kind: "NodeGroupConfiguration",
      metadata: { name: "broken.sh" },
      spec: { nodeGroups: ["st"], bundles: ["*"], weight: 50, content: "echo {{ nope }}" },
    });
    // What the bundle server writes on a NodeGroupConfiguration that does not render.
    await admin.request("PATCH", "/apis/deckhouse.io/v1alpha1/nodegroupconfigurations/broken.sh/status", {
      body: { status: { error: 'spec.content line 1: function "nope" not defined', failedNodeGroups: ["st"] } },
    });
    type Status = {
      kubernetesVersion?: string;
      error?: string;
      conditionSummary?: { ready: string; statusMessage: string };
      conditions?: { type: string; status: string; message?: string }[];
    };
    const ng = await until("status with the error", async () => {
      const o = await admin.request<{ status?: Status }>("GET", "/apis/deckhouse.io/v1/nodegroups/st");
      return o.status?.error ? o.status : undefined;
    });
    const c = (type: string) => ng.conditions?.find((x) => x.type === type);
    t.match(ng.error, /NodeGroupConfiguration broken\.sh: spec\.content line 1/);
    t.match(c("Error"), { status: "True", message: /NodeGroupConfiguration broken\.sh/ });
    t.equal(c("Ready")?.status, "True");
    t.equal(c("Updating")?.status, "True");
    t.equal(c("WaitingForDisruptiveApproval")?.status, "True");
    t.equal(ng.kubernetesVersion, "1.34");
    t.equal(ng.conditionSummary?.ready, "False");
    t.match(ng.conditionSummary?.statusMessage, /^NodeGroupConfiguration broken\.sh: .*; 1\/2 up to date/);
    const table = await cp.kubectl(["get", "nodegroup", "st"]);
    t.match(table, /NAME\s+TYPE\s+READY\s+NODES\s+UPTODATE\s+INSTANCES\s+DESIRED\s+MIN\s+MAX\s+STANDBY\s+STATUS\s+AGE/);
    t.match(
      table,
      /st\s+Static\s+2\s+2\s+1\s+NodeGroupConfiguration broken\.sh/,
      "cloud columns empty, the error first",
    );
    const wide = await cp.kubectl(["get", "nodegroup", "st", "-o", "wide"]);
    t.match(wide, /UPDATING\s+WAITINGAPPROVAL\s+WAITINGDISRUPTION\s+DRAINING\s+KUBERNETES/);

    await admin.request("PATCH", "/apis/deckhouse.io/v1alpha1/nodegroupconfigurations/broken.sh/status", {
      body: { status: { error: null, failedNodeGroups: null } },
    });
    const fixed = await until("the error cleared", async () => {
      const o = await admin.request<{ status?: Status }>("GET", "/apis/deckhouse.io/v1/nodegroups/st");
      return o.status?.error === "" ? o.status : undefined;
    });
    t.equal(fixed.conditions?.find((x) => x.type === "Error")?.status, "False");
  },
);

t.test("metrics under Deckhouse's names, and a Prometheus parser accepts them", async (t) => {
  await admin.request("POST", "/api/v1/nodes", {
    body: { apiVersion: "v1", kind: "Node", metadata: { name: "stray" } },
  });
  const text = await until("the metrics", async () => {
    const m = metrics.text();
    return /d8_unmanaged_nodes_on_cluster\{node="stray"\} 1/.test(m) &&
      /node_group_info\{cri_type="Containerd",name="st"\}/.test(m)
      ? m
      : undefined;
  });
  t.match(text, /node_group_node_status\{node="st-1",node_group="st",status="UpToDate"\} 1/);
  t.match(text, /node_group_node_status\{node="st-2",node_group="st",status="WaitingForManualDisruptionApproval"\} 1/);
  t.match(text, /node_group_node_status\{node="st-2",node_group="st",status="UpToDate"\} 0/);
  t.match(text, /d8_node_group_configurations_total\{node_group="st"\} 1/);
  t.match(text, /bashible_node_group_nodes_up_to_date\{node_group="st"\} 1/);
  const promtool = await new Promise<string | undefined>((resolve) =>
    execFile("promtool", ["--version"], (err) => resolve(err ? undefined : "promtool")),
  );
  if (!promtool) {
    t.comment("promtool not installed (Debian package prometheus): the exposition is not parsed");
    return;
  }
  const out = await new Promise<{ code: number | null; output: string }>((resolve) => {
    const p = spawn("promtool", ["check", "metrics"], { stdio: ["pipe", "pipe", "pipe"] });
    let output = "";
    p.stdout.on("data", (d) => (output += d));
    p.stderr.on("data", (d) => (output += d));
    p.on("close", (code) => resolve({ code, output }));
    p.stdin.end(text);
  });
  // Lint findings (Deckhouse's own gauge d8_node_group_configurations_total ends in _total) are
  // printed but are not parse errors; a parse error names the line and fails.
  t.notMatch(out.output, /error while linting|text format parsing error|parse/i, out.output);
});

t.test("drains: Deckhouse's exceptions; a forced drain recorded on the Node and in the metrics", async (t) => {
  await nodeGroup("drn", { nodeDrainTimeoutSecond: 2 });
  await setGroupChecksum("drn");
  await createNode(admin, "drn-1", "drn");
  await createNode(admin, "drn-2", "drn");
  await cp.kubectl(["create", "namespace", "drn"]);
  await until("the namespace's default ServiceAccount", () =>
    admin.request("GET", "/api/v1/namespaces/drn/serviceaccounts/default"),
  );
  await createPod(admin, "drn", "guarded", "drn-1", { labels: { app: "g" } });
  await createPod(admin, "drn", "mine", "drn-2", { labels: { app: "g" } });
  await apply({
    apiVersion: "policy/v1",
    kind: "PodDisruptionBudget",
    metadata: { name: "g", namespace: "drn" },
    spec: { minAvailable: 2, selector: { matchLabels: { app: "g" } } },
  });
  await until("PDB status computed", async () => {
    const p = await admin.request<{
      metadata: { generation: number };
      status?: { observedGeneration?: number; currentHealthy?: number };
    }>("GET", "/apis/policy/v1/namespaces/drn/poddisruptionbudgets/g");
    return p.status?.observedGeneration === p.metadata.generation && p.status?.currentHealthy === 2;
  });

  // drn-2 was cordoned by an operator before: approved without a drain, its pod left alone.
  await admin.request("PATCH", "/api/v1/nodes/drn-2", { body: { spec: { unschedulable: true } } });
  await annotate(admin, "drn-2", { [K.approved]: "", [K.disruptionRequired]: "" });
  await until(
    "drn-2 approved",
    async () => (await getNode("drn-2")).metadata.annotations?.[K.disruptionApproved] !== undefined,
  );
  const d2 = await getNode("drn-2");
  t.equal(d2.metadata.annotations?.[K.draining], undefined, "not drained");
  t.equal(d2.spec?.unschedulable, true, "still cordoned, as the operator left it");
  t.ok(await admin.request("GET", "/api/v1/namespaces/drn/pods/mine"), "its pod is still there");

  await annotate(admin, "drn-1", { [K.approved]: "", [K.disruptionRequired]: "" });
  const trouble = await until("d8_node_draining while the PDB refuses", async () => {
    const m = /d8_node_draining\{message="([^"]+)",node="drn-1"\} 1/.exec(metrics.text());
    return m?.[1];
  });
  t.match(trouble, /pods could not be evicted/);
  const n = await until("drained, by force", async () => {
    const n = await getNode("drn-1");
    return n.metadata.annotations?.[K.disruptionApproved] !== undefined ? n : undefined;
  });
  t.match(
    n.metadata.annotations?.[K.drainForced],
    /deleted drn\/guarded without eviction/,
    "recorded as forced on the Node",
  );
  const m = metrics.text();
  t.match(m, /bashible_node_drains_total\{node_group="drn",result="forced"\} 1/, "counted as forced");
  t.match(m, /bashible_node_drain_forced_timestamp_seconds\{node="drn-1",node_group="drn"\} \d+/);
  t.notMatch(m, /d8_node_draining\{[^}]*node="drn-1"/, "no longer draining");
  const pods = (await list(admin, "/api/v1/namespaces/drn/pods")).items.map((p) => p.metadata.name);
  t.same(pods, ["mine"], "the guarded pod was deleted at the deadline");
});

t.test(
  "the node agents' metrics, cluster side: a node can check a scraper's token and rights as kube-rbac-proxy does",
  async (t) => {
    await cp.kubectl(["apply", "-f", path.join(REPO, "cluster/deploy/monitoring/rbac.yaml")]);
    const tokenFor = async (sa: string) =>
      (
        await admin.request<{ status: { token: string } }>(
          "POST",
          `/api/v1/namespaces/${NS}/serviceaccounts/${sa}/token`,
          {
            body: { apiVersion: "authentication.k8s.io/v1", kind: "TokenRequest", spec: { expirationSeconds: 600 } },
          },
        )
      ).status.token;
    await admin.request("POST", `/api/v1/namespaces/${NS}/serviceaccounts`, {
      body: { apiVersion: "v1", kind: "ServiceAccount", metadata: { name: "someone-else" } },
    });
    await createNode(admin, "auth-1", "st");
    // What the agent does with the kubelet's credentials for each scrape.
    const id = await cp.mintNode("auth-1");
    const agent = new KubeClient(await loadKubeconfig(id.kubeconfig), { userAgent: "bashible" });
    t.teardown(() => agent.close());
    const allowed = async (sa: string) => {
      const review = await agent.request<{
        status: { authenticated?: boolean; user?: { username: string; groups?: string[] } };
      }>("POST", "/apis/authentication.k8s.io/v1/tokenreviews", {
        body: { apiVersion: "authentication.k8s.io/v1", kind: "TokenReview", spec: { token: await tokenFor(sa) } },
      });
      t.ok(review.status.authenticated, `${sa}: the token is reviewed with the node's own credentials`);
      const sar = await agent.request<{ status: { allowed: boolean } }>(
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {
          body: {
            apiVersion: "authorization.k8s.io/v1",
            kind: "SubjectAccessReview",
            spec: {
              user: review.status.user?.username,
              groups: review.status.user?.groups,
              resourceAttributes: { verb: "get", resource: "nodes", subresource: "metrics", name: "auth-1" },
            },
          },
        },
      );
      return sar.status.allowed;
    };
    t.equal(await allowed("bashible-metrics-scraper"), true, "the scraper may read the node's metrics");
    t.equal(await allowed("someone-else"), false, "another account may not");
  },
);
