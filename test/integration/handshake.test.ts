// The whole update handshake with the real approval controller and the real agent: a change
// that needs a disruption (a script asking for it with Deckhouse's helper, then a reboot) goes
// waiting-for-approval → approved → disruption-required → draining → drained →
// disruption-approved → reboot, with the node cordoned and a pod evicted through the Eviction
// API; after the reboot the node reports its checksum and the controller clears the
// annotations and uncordons it.
import t from "tap";
import { readFile, rm } from "node:fs/promises";
import path from "node:path";
import { startStack } from "../../scripts/lib/stack.ts";
import { bashible, waitFor } from "../../scripts/lib/cli.ts";
import { requireRoot } from "../fixtures/root.ts";
import * as api from "../../lib/kube/api.ts";
import type { KubeObject } from "../../lib/kube/api.ts";

await requireRoot("the agent sets root ownership on what it writes");

const stack = await startStack({ controllers: { controller: { evictionRetryMs: 500, drainTimeoutMs: 60_000 } } });
t.teardown(() => stack.stop());
const { cp } = stack;
const ANN = "update.node.deckhouse.io/";

async function ready(name: string) {
  await api.patchNodeStatus(cp.admin, name, {
    status: {
      conditions: [
        { type: "Ready", status: "True", reason: "KubeletReady", lastHeartbeatTime: new Date().toISOString() },
      ],
    },
  });
}

t.test("a disruptive change goes through the whole handshake with the real controller", async (t) => {
  const n = await stack.kubeletNode("hs-1");
  await ready("hs-1");
  const sum1 = await stack.served("one");
  const first = await bashible(["once", "--root", n.root, "--kubeconfig", n.kubeconfig]);
  t.equal(first.status, 0, "the first run needs no approval");

  // A pod on the node, so the drain has something to evict (no controller-manager here makes
  // the default ServiceAccount, so the test does).
  await cp.admin
    .request("POST", "/api/v1/namespaces/default/serviceaccounts", {
      body: { apiVersion: "v1", kind: "ServiceAccount", metadata: { name: "default" } },
    })
    .catch(() => undefined);
  await cp.admin.request("POST", "/api/v1/namespaces/default/pods", {
    body: {
      apiVersion: "v1",
      kind: "Pod",
      metadata: { name: "app", namespace: "default" },
      spec: { nodeName: "hs-1", containers: [{ name: "c", image: "example/app:1" }] },
    },
  });

  // Record every annotation the Node carries, in order, from a watch.
  const seen: string[] = [];
  const abort = new AbortController();
  t.teardown(() => abort.abort());
  void (async () => {
    for await (const ev of cp.admin.watch<KubeObject>("/api/v1/nodes", {
      fieldSelector: "metadata.name=hs-1",
      signal: abort.signal,
    })) {
      for (const k of Object.keys(ev.object.metadata.annotations ?? {})) {
        if (k.startsWith(ANN) && !seen.includes(k.slice(ANN.length))) seen.push(k.slice(ANN.length));
      }
    }
  })().catch(() => undefined);

  // Idempotent, as NGC scripts must be: the disruptive change (and its reboot) happens once.
  await stack.setScript(
    "two",
    [
      'if [[ ! -e "$BASHIBLE_ROOT/kernel-tuned" ]]; then',
      "  bb-deckhouse-get-disruptive-update-approval",
      '  touch "$BASHIBLE_ROOT/kernel-tuned"',
      "  bb-flag-set reboot",
      "fi",
      "",
    ].join("\n"),
  );
  const sum2 = await stack.served("two");
  t.not(sum2, sum1);
  const run = await bashible(["once", "--root", n.root, "--kubeconfig", n.kubeconfig, "--log-format", "json"]);
  t.equal(run.status, 0, run.stdout + run.stderr);
  t.equal(await readFile(path.join(n.root, "hello"), "utf8"), "two\n");
  t.match(await readFile(path.join(n.root, "var/lib/bashible/sandbox-actions.log"), "utf8"), /reboot/, "rebooted last");
  await waitFor("the drain's marks", async () => (seen.includes("drained") ? true : undefined));
  const order = [
    "waiting-for-approval",
    "approved",
    "disruption-required",
    "draining",
    "drained",
    "disruption-approved",
  ];
  t.same(
    seen.filter((k) => order.includes(k)),
    order,
    "annotations appear in the handshake's order",
  );
  // Evicted through the Eviction API: without a kubelet to finish it, the pod is terminating.
  const pod = await cp.admin.request<KubeObject>("GET", "/api/v1/namespaces/default/pods/app").catch(() => undefined);
  t.ok(!pod || pod.metadata.deletionTimestamp, "the pod was evicted");
  const node = await api.getNode(cp.admin, "hs-1");
  t.equal((node.spec as { unschedulable?: boolean } | undefined)?.unschedulable, true, "cordoned while it reboots");
  t.notOk(
    "node.deckhouse.io/configuration-checksum" in (node.metadata.annotations ?? {}) &&
      node.metadata.annotations?.["node.deckhouse.io/configuration-checksum"] === sum2,
    "not reported done before the reboot",
  );

  // "After the reboot": a new boot would force a full run; here the checksum file is removed.
  await rm(path.join(n.root, "var/lib/bashible/configuration_checksum"));
  const after = await bashible(["once", "--root", n.root, "--kubeconfig", n.kubeconfig]);
  t.equal(after.status, 0, after.stdout + after.stderr);
  const done = await waitFor(
    "the controller to finish the update",
    async () => {
      const nd = await api.getNode(cp.admin, "hs-1");
      const a = nd.metadata.annotations ?? {};
      const clean = !Object.keys(a).some((k) => k.startsWith(ANN));
      return clean && !(nd.spec as { unschedulable?: boolean } | undefined)?.unschedulable ? nd : undefined;
    },
    30_000,
  );
  t.equal(
    done.metadata.annotations?.["node.deckhouse.io/configuration-checksum"],
    sum2,
    "done at the group's checksum",
  );
  t.pass("annotations cleared and the node uncordoned by the controller");
});

t.test("the first run's end lets workloads in: the controller removes the kubelet's uninitialized taint", async (t) => {
  const n = await stack.kubeletNode("hs-2");
  // As the kubelet registers it (--register-with-taints), with a taint of someone else's beside it.
  await api.patchNode(cp.admin, "hs-2", {
    spec: {
      taints: [
        { key: "node.deckhouse.io/bashible-uninitialized", effect: "NoSchedule" },
        { key: "dedicated", value: "db", effect: "NoSchedule" },
      ],
    },
  });
  await stack.served("two");
  t.equal((await bashible(["once", "--root", n.root, "--kubeconfig", n.kubeconfig])).status, 0);
  const node = await waitFor("the taint removed", async () => {
    const nd = await api.getNode(cp.admin, "hs-2");
    const taints = (nd.spec as { taints?: { key: string }[] } | undefined)?.taints ?? [];
    return taints.some((x) => x.key === "node.deckhouse.io/bashible-uninitialized") ? undefined : nd;
  });
  t.same(
    ((node.spec as { taints?: { key: string }[] }).taints ?? []).map((x) => x.key),
    ["dedicated"],
    "other taints stay",
  );
  t.notOk("node.deckhouse.io/bashible-first-run-finished" in (node.metadata.labels ?? {}), "the label is consumed");
});
