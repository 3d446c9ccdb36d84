// The fencing controller against a real API server: kubelet Leases that stop being renewed free
// the node's workloads (pods deleted with grace 0, then the Node), except for Static nodes
// (kept), Notify mode (Event + condition only), nodes in maintenance, and nodes whose own
// timings do not fit the threshold. A test loop renews one Lease the way a kubelet does.
// Timings are shortened (threshold 4 s = watchdog 1 + detection 1 + margin 1, plus one).
import t from "tap";
import { withControlPlane } from "../../scripts/lib/control-plane-fixture.ts";
import { createNode } from "../../scripts/lib/fencing.ts";
import { bashible, waitFor } from "../../scripts/lib/cli.ts";
import { createLease, getLease, getNode, list, updateLease, type KubeObject, microTime } from "../../lib/kube/api.ts";
import { isNotFound } from "../../lib/kube/errors.ts";
import { createLogger } from "../../lib/log/log.ts";
import { NAMESPACE, NODE_KEYS } from "../../bundles/names.ts";
import {
  CONDITION_TYPE,
  FencingConfigError,
  fencingTimings,
  startFencingController,
} from "../../cluster/controllers/fencing.ts";
import { ControllerMetrics } from "../../cluster/controllers/metrics.ts";

const cp = await withControlPlane(t);
const admin = cp.admin;
const PODS_NS = "fence-pods";
const log = createLogger({ level: process.env.FENCING_TEST_VERBOSE ? "debug" : "silent", to: "stderr" });

await admin.request("POST", "/api/v1/namespaces", { body: { metadata: { name: NAMESPACE } } });
await admin.request("POST", "/api/v1/namespaces", { body: { metadata: { name: PODS_NS } } });
// No kube-controller-manager here: the service account pods need is made by hand.
await admin.request("POST", `/api/v1/namespaces/${PODS_NS}/serviceaccounts`, {
  body: { metadata: { name: "default" } },
});

async function fencingNode(
  name: string,
  o: { labels?: Record<string, string>; annotations?: Record<string, string>; pods: number },
) {
  await createNode(admin, name, {
    group: "ctl",
    labels: { [NODE_KEYS.fencingEnabled]: "", [NODE_KEYS.fencingMode]: "Watchdog", ...o.labels },
    annotations: o.annotations,
  });
  await createLease(admin, {
    apiVersion: "coordination.k8s.io/v1",
    kind: "Lease",
    metadata: { name, namespace: "kube-node-lease" },
    spec: { holderIdentity: name, leaseDurationSeconds: 40, renewTime: microTime(Date.now()) },
  });
  for (let i = 0; i < o.pods; i++)
    await admin.request("POST", `/api/v1/namespaces/${PODS_NS}/pods`, {
      body: {
        metadata: { name: `${name}-pod-${i}` },
        spec: {
          nodeName: name,
          automountServiceAccountToken: false,
          containers: [{ name: "c", image: "registry.invalid/pause" }],
        },
      },
    });
}

const podsOn = async (node: string) =>
  (await list(admin, `/api/v1/namespaces/${PODS_NS}/pods`, { fieldSelector: `spec.nodeName=${node}` })).items.length;
const nodeGone = async (name: string) =>
  getNode(admin, name).then(
    () => false,
    (err) => isNotFound(err),
  );
const condition = async (name: string) =>
  (
    (await getNode(admin, name)).status as { conditions?: { type: string; reason: string; message: string }[] }
  )?.conditions?.find((c) => c.type === CONDITION_TYPE);

t.test("an unsafe threshold is refused, naming the numbers", async (t) => {
  t.throws(
    () =>
      fencingTimings({
        thresholdSeconds: 60,
        watchdogTimeoutSeconds: 60,
        detectionWindowSeconds: 26,
        marginSeconds: 20,
      }),
    new FencingConfigError(
      "fencing threshold 60 s is not greater than watchdog timeout 60 s + detection window 26 s + margin 20 s = 106 s: a node could still run its pods when they are deleted; raise the threshold above 106 s or shorten the watchdog timeout or detection window",
    ),
  );
  t.throws(
    () => startFencingController({ client: admin, log, timings: { thresholdSeconds: 100 } }),
    FencingConfigError,
  );
  const r = await bashible(["server", "--standalone", "--fencing-threshold", "60"]);
  t.equal(r.status, 1);
  t.match(
    r.stderr,
    /fencing threshold 60 s is not greater than watchdog timeout 60 s \+ detection window 26 s \+ margin 20 s = 106 s/,
  );
});

t.test(
  "expired kubelet Leases: pods then Node deleted; Static kept; Notify, maintenance, unsafe node timings spared",
  async (t) => {
    await fencingNode("f-cloud", { labels: { [NODE_KEYS.nodeType]: "CloudEphemeral" }, pods: 2 });
    await fencingNode("f-static", { labels: { [NODE_KEYS.nodeType]: "Static" }, pods: 1 });
    await fencingNode("f-notify", { labels: { [NODE_KEYS.fencingMode]: "Notify" }, pods: 1 });
    await fencingNode("f-maint", { annotations: { [NODE_KEYS.fencingDisable]: "" }, pods: 1 });
    await fencingNode("f-slow", { annotations: { [NODE_KEYS.fencingTimings]: "watchdog=60s,detection=26s" }, pods: 1 });
    // Fast enough on API loss, too slow to go down once its kubelet stops renewing.
    await fencingNode("f-slow-kubelet", {
      annotations: { [NODE_KEYS.fencingTimings]: "watchdog=1s,detection=1s,kubelet=35s" },
      pods: 1,
    });
    await fencingNode("f-fresh", { pods: 1 });

    // A kubelet for f-fresh: renews its Lease every 500 ms.
    const renew = setInterval(async () => {
      const l = await getLease(admin, "kube-node-lease", "f-fresh").catch(() => undefined);
      if (l)
        await updateLease(admin, { ...l, spec: { ...(l.spec as object), renewTime: microTime(Date.now()) } }).catch(
          () => undefined,
        );
    }, 500);
    t.teardown(() => clearInterval(renew));

    // Deletions in the order the API server made them (resourceVersion of the deleted objects).
    const deletions: { kind: string; name: string; rv: number }[] = [];
    const abort = new AbortController();
    t.teardown(() => abort.abort());
    const follow = async (path: string, kind: string) => {
      for await (const ev of admin.watch<KubeObject>(path, { signal: abort.signal }))
        if (ev.type === "DELETED")
          deletions.push({ kind, name: ev.object.metadata.name, rv: Number(ev.object.metadata.resourceVersion) });
    };
    void follow(`/api/v1/namespaces/${PODS_NS}/pods`, "Pod").catch(() => undefined);
    void follow("/api/v1/nodes", "Node").catch(() => undefined);

    const ctl = startFencingController({
      client: admin,
      log,
      resyncMs: 200,
      timings: {
        thresholdSeconds: 4,
        watchdogTimeoutSeconds: 1,
        detectionWindowSeconds: 1,
        kubeletWindowSeconds: 1,
        marginSeconds: 1,
      },
      lease: { namespace: NAMESPACE, name: "fencing-test", durationSeconds: 15 },
    });
    t.teardown(() => ctl.stop());

    await waitFor("f-cloud's Node deleted", () => nodeGone("f-cloud"), 60_000);
    t.equal(await podsOn("f-cloud"), 0, "f-cloud's pods are gone");
    const cloudPods = deletions.filter((d) => d.kind === "Pod" && d.name.startsWith("f-cloud-"));
    const cloudNode = deletions.find((d) => d.kind === "Node" && d.name === "f-cloud");
    await waitFor("the watch saw the deletions", () => (cloudPods.length === 2 && cloudNode) || undefined).catch(
      () => undefined,
    );
    t.equal(cloudPods.length, 2);
    t.ok(cloudNode && cloudPods.every((p) => p.rv < cloudNode.rv), "both pods were deleted before the Node");

    await waitFor("f-static fenced", async () => (await condition("f-static"))?.reason === "NodeFenced", 60_000);
    t.equal(await podsOn("f-static"), 0, "f-static's pod is gone");
    t.equal(await nodeGone("f-static"), false, "the Static Node is kept");

    await waitFor(
      "f-notify reported",
      async () => (await condition("f-notify"))?.reason === "NodeFencingNotify",
      60_000,
    );
    await waitFor("f-slow refused", async () => (await condition("f-slow"))?.reason === "NodeFencingRefused", 60_000);
    t.match((await condition("f-slow"))?.message, /watchdog timeout 60 s \+ detection window 26 s \+ margin 1 s/);
    await waitFor(
      "f-slow-kubelet refused",
      async () => (await condition("f-slow-kubelet"))?.reason === "NodeFencingRefused",
      60_000,
    );
    t.match((await condition("f-slow-kubelet"))?.message, /watchdog timeout 1 s \+ kubelet window 35 s \+ margin 1 s/);
    const events = await list(admin, "/api/v1/namespaces/default/events", {
      fieldSelector: "involvedObject.name=f-cloud",
    });
    t.ok(
      events.items.some(
        (e) =>
          e.reason === "NodeFenced" && /Deleted 2 pod\(s\) with grace 0; deleting the Node/.test(String(e.message)),
      ),
      "an Event tells what was done",
    );

    for (const [name, why] of [
      ["f-notify", "Notify mode deletes nothing"],
      ["f-maint", "maintenance"],
      ["f-slow", "the node's own timings do not fit"],
      ["f-slow-kubelet", "the node's kubelet window does not fit"],
      ["f-fresh", "its kubelet renews"],
    ] as const) {
      t.equal(await podsOn(name), 1, `${name}: pod kept (${why})`);
      t.equal(await nodeGone(name), false, `${name}: Node kept`);
    }
    t.equal(await condition("f-maint"), undefined, "f-maint: not even reported");
    t.equal(await condition("f-fresh"), undefined, "f-fresh: not even reported");
    const lease = await getLease(admin, NAMESPACE, "fencing-test");
    t.ok((lease.spec as { holderIdentity?: string }).holderIdentity, "the controller ran as the Lease holder");
  },
);

t.test(
  "Deckhouse's fencing blockers as metrics, while leading: no kubelet Lease, the node's own timings unsafe",
  async (t) => {
    await createNode(admin, "g-nolease", {
      group: "ctl",
      labels: { [NODE_KEYS.fencingEnabled]: "", [NODE_KEYS.fencingMode]: "Watchdog" },
    });
    await fencingNode("g-unsafe", {
      annotations: { [NODE_KEYS.fencingTimings]: "watchdog=60s,detection=26s" },
      pods: 0,
    });
    await fencingNode("g-fine", { pods: 0 });
    const gauges = new ControllerMetrics();
    const ctl = startFencingController({
      client: admin,
      log,
      gauges,
      timings: {
        thresholdSeconds: 4,
        watchdogTimeoutSeconds: 1,
        detectionWindowSeconds: 1,
        kubeletWindowSeconds: 1,
        marginSeconds: 1,
      },
      lease: { namespace: NAMESPACE, name: "fencing-gauges-test", durationSeconds: 15 },
    });
    const text = await waitFor(
      "the gauges",
      () => (/d8_fencing_invalid_node_reference\{node="g-nolease"/.test(gauges.text()) ? gauges.text() : undefined),
      30_000,
    );
    t.match(text, /d8_fencing_invalid_node_reference\{node="g-nolease",reason="LeaseNotFound"\} 1/);
    t.match(text, /d8_fencing_configuration_error\{node="g-unsafe",profile="agent-timings"\} 1/);
    t.notMatch(text, /node="g-fine"/, "a node with its Lease and safe timings has none");
    t.notMatch(
      text,
      /reason="LeaseNotFound"[^\n]*\n[^\n]*node="g-unsafe"|node="g-unsafe",reason/,
      "g-unsafe has its Lease",
    );
    await ctl.stop();
    t.notMatch(gauges.text(), /d8_fencing_/, "a replica that no longer leads exports none");
  },
);
