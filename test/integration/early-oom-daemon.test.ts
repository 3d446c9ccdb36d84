// Early OOM inside the resident agent (`bashible run`), matched against real Pod objects in a
// real kube-apiserver: it watches this node's pods with the node's own identity, kills the pod
// the kubelet would evict first, records an EarlyOOMKilled Event on it with the figures, and
// serves its metrics and state on the local endpoint; `bashible early-oom status` shows the same
// ranking from the live agent (over its root-only socket) and from a saved
// `kubectl get pods -o json`. The node's /proc and
// /sys/fs/cgroup are a tree in the kernel's formats; the pods' tasks are real processes.
import t from "tap";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { withControlPlane } from "../../scripts/lib/control-plane-fixture.ts";
import { freePort } from "../../scripts/lib/control-plane.ts";
import { bashible, bashibleDaemon, waitFor } from "../../scripts/lib/cli.ts";
import { makeBundle, sandbox, script, writeBundle } from "../../scripts/lib/bundle.ts";
import { FakeNode, podObject, type PodSpecInput } from "../../scripts/lib/early-oom.ts";
import type { KubeObject } from "../../lib/kube/api.ts";
import { list } from "../../lib/kube/api.ts";
import { KubeStatusError } from "../../lib/kube/errors.ts";
import type { EarlyOom } from "../../agent/early-oom/early-oom.ts";
import { VERSION } from "../../lib/version.ts";
import { METRICS_SOCKET } from "../../agent/metrics-server.ts";

interface EventObject extends KubeObject {
  type: string;
  message: string;
  involvedObject: { uid?: string };
  source: { host?: string };
}

const cp = await withControlPlane(t);
const admin = cp.admin;
const NODE = "eoom-1";

for (const name of [NODE, "eoom-2"])
  await admin.request("POST", "/api/v1/nodes", { body: { apiVersion: "v1", kind: "Node", metadata: { name } } });
for (const ns of ["default", "kube-system"]) {
  await admin
    .request("POST", `/api/v1/namespaces/${ns}/serviceaccounts`, {
      body: { apiVersion: "v1", kind: "ServiceAccount", metadata: { name: "default" } },
    })
    .catch((e) => {
      if (!(e instanceof KubeStatusError && e.status === 409)) throw e;
    });
}

/** Creates the Pod in the API (bound to a node) and returns it with the UID the server gave. */
async function createPod(input: PodSpecInput, node = NODE): Promise<KubeObject> {
  const body = podObject(input) as KubeObject & { spec: Record<string, unknown>; status?: unknown };
  body.spec.nodeName = node;
  delete body.status;
  return admin.request<KubeObject>("POST", `/api/v1/namespaces/${input.namespace ?? "default"}/pods`, { body });
}

const inputs: PodSpecInput[] = [
  { name: "db", qos: "Guaranteed", workingSetMi: 3000, limitMi: 3000 },
  {
    name: "node-agent",
    namespace: "kube-system",
    qos: "Burstable",
    workingSetMi: 2500,
    requestMi: 100,
    priorityClassName: "system-node-critical",
  },
  { name: "cache", qos: "Burstable", workingSetMi: 1900, inactiveFileMi: 1500, requestMi: 2000 },
  { name: "web", qos: "Burstable", workingSetMi: 1200, requestMi: 500 },
  { name: "batch", qos: "BestEffort", workingSetMi: 300 },
];

const node = new FakeNode({ version: 1, driver: "systemd" });
t.teardown(() => node.cleanup());
const objects = new Map<string, KubeObject>();
for (const input of inputs) {
  const obj = await createPod(input);
  objects.set(input.name, obj);
  node.addPod({ ...input, uid: obj.metadata.uid });
}
// etcd as the kubelet runs it from a manifest: its cgroup carries the manifest UID, and its
// mirror pod in the API (created here as the kubelet would) names that UID in
// kubernetes.io/config.mirror. The largest pod of all, far above its request: never killed.
const etcdInput: PodSpecInput = {
  name: `etcd-${NODE}`,
  namespace: "kube-system",
  qos: "Burstable",
  workingSetMi: 6000,
  requestMi: 100,
  priorityClassName: "system-node-critical",
  staticPod: true,
};
const etcd = node.addPod(etcdInput);
await createPod({ ...etcdInput, annotations: etcd.pod.metadata.annotations });
// A Pod object on another node whose UID this node's tree happens to carry: the watch of this
// node's pods must not match it (it is ranked as a pod without a Pod object).
const elsewhere = await createPod({ name: "elsewhere", qos: "BestEffort", workingSetMi: 5000 }, "eoom-2");
const stray = node.addPod({ name: "elsewhere", qos: "BestEffort", workingSetMi: 5000, uid: elsewhere.metadata.uid });

const work = await mkdtemp(path.join(os.tmpdir(), "early-oom-daemon-"));
t.teardown(() => rm(work, { recursive: true, force: true }));
const id = await cp.mintNode(NODE);
const root = await sandbox(undefined, NODE);
t.teardown(() => rm(root, { recursive: true, force: true }));
const bundle = await writeBundle(work, makeBundle([script("050_x", "true")]));
const port = await freePort();
const agentUrl = `http://127.0.0.1:${port}`;

type AgentStatus = ReturnType<EarlyOom["status"]>;
async function agentStatus(): Promise<AgentStatus | undefined> {
  try {
    const r = await fetch(`${agentUrl}/early-oom`);
    return r.ok ? ((await r.json()) as AgentStatus) : undefined;
  } catch {
    return undefined;
  }
}

const daemon = bashibleDaemon([
  "--root",
  root,
  "--bundle",
  bundle,
  "--kubeconfig",
  id.kubeconfig,
  "--node-name",
  NODE,
  "--tick",
  "3600",
  "--proc-root",
  node.procRoot,
  "--cgroup-root",
  node.cgroupRoot,
  "--metrics-address",
  `127.0.0.1:${port}`,
]);
let daemonOut = "";
daemon.stdout?.on("data", (d) => (daemonOut += d));
daemon.stderr?.on("data", (d) => (daemonOut += d));
const daemonExit = new Promise<number | null>((r) => daemon.once("exit", (code) => r(code)));
t.teardown(() => {
  if (daemon.exitCode === null) daemon.kill("SIGKILL");
});

t.test("the agent watches this node's pods with the node's identity and ranks them as the kubelet would", async (t) => {
  const s = await waitFor(
    "the agent's pod watch",
    async () => {
      const st = await agentStatus();
      return st?.pods.synced && st.psi === "available" ? st : undefined;
    },
    30_000,
  );
  t.equal(s.pods.source, "watch");
  t.equal(s.pods.count, 6, "the six pods bound to this node, not the one on eoom-2");

  const live = await bashible([
    "early-oom",
    "status",
    "-o",
    "json",
    "--proc-root",
    node.procRoot,
    "--cgroup-root",
    node.cgroupRoot,
    "--kubeconfig",
    id.kubeconfig,
    "--node-name",
    NODE,
    "--agent",
    path.join(root, METRICS_SOCKET),
  ]);
  t.equal(live.status, 0, live.stderr);
  const j = JSON.parse(live.stdout);
  t.same(
    j.candidates.map((c: { pod: string }) => c.pod),
    ["default/web", "default/batch", "default/cache", `pod ${stray.uid} (no Pod object)`, "default/db"],
  );
  t.same(
    j.excluded.map((e: { pod: string; reason: string }) => [e.pod, e.reason.split(":")[0]]),
    [
      [`kube-system/etcd-${NODE}`, "static pod (mirror pod of a manifest on the node)"],
      ["kube-system/node-agent", "critical pod (priority 2000001000 ≥ 2000000000, system-cluster-critical)"],
    ],
    "the watch keeps the mirror annotation; the API server resolved system-node-critical's priority",
  );
  t.equal(j.trigger.source, "agent");
  t.equal(j.trigger.phase, "calm");

  // Off the node: the same ranking from a saved pod list.
  const saved = path.join(work, "pods.json");
  await writeFile(
    saved,
    await cp.kubectl(["get", "pods", "-A", "-o", "json", "--field-selector", `spec.nodeName=${NODE}`]),
  );
  const off = await bashible([
    "early-oom",
    "status",
    "-o",
    "json",
    "--proc-root",
    node.procRoot,
    "--cgroup-root",
    node.cgroupRoot,
    "--pods",
    saved,
  ]);
  t.equal(off.status, 0, off.stderr);
  t.same(
    JSON.parse(off.stdout).candidates.map((c: { pod: string }) => c.pod),
    j.candidates.map((c: { pod: string }) => c.pod),
  );
  const text = await bashible([
    "early-oom",
    "status",
    "--proc-root",
    node.procRoot,
    "--cgroup-root",
    node.cgroupRoot,
    "--pods",
    saved,
  ]);
  t.match(text.stdout, /candidates, in the order early OOM would kill them:/);
  t.match(
    text.stdout,
    /1\s+default\/web\s+Burstable\s+1\.2 GiB\s+500 MiB\s+0\s+exceeds request; more memory above its request than the next/,
  );
});

t.test("sustained pressure: the kubelet's first pick is killed whole, with an Event and a metric", async (t) => {
  const stop = node.driveRealTime({ full: 0.6, some: 0.85, memAvailableMi: 200, scan: 20_000, refault: 5000 });
  t.teardown(stop);
  const web = node.pods.find((p) => p.input.name === "web");
  if (!web) throw new Error("no web pod");
  const signals = await node.exited(web, 30_000);
  t.ok(
    signals.every((s) => s === "SIGKILL"),
    "every task of default/web died of SIGKILL",
  );
  for (const p of node.pods) if (p !== web) t.equal(node.alive(p), p.processes.length, `${p.input.name} untouched`);

  const ev = await waitFor("the EarlyOOMKilled Event", async () => {
    const l = await list<EventObject>(admin, "/api/v1/namespaces/default/events", {
      fieldSelector: "involvedObject.name=web,reason=EarlyOOMKilled",
    });
    return l.items[0];
  });
  t.equal(ev.type, "Warning");
  t.equal(ev.involvedObject.uid, objects.get("web")?.metadata.uid);
  t.equal(ev.source.host, NODE);
  // Shares follow real time here (the file writer and the agent's samples tick apart): matched loosely.
  t.match(
    ev.message,
    /^Early OOM killed the pod's processes: memory full stall \d+% \(some \d+%\) over the last 1\.\d s, held 3\.\d s; MemAvailable 200 MiB of 8 GiB; reclaim \d+ pages\/s\. Trigger: .*Victim ranked 1 of 5: working set 1\.2 GiB > request 500 MiB.* 5 process\(es\) killed \(freeze\+SIGKILL\) in \d+ ms\.$/,
  );

  const metrics = await (await fetch(`${agentUrl}/metrics`)).text();
  t.match(metrics, /bashible_early_oom_kills_total\{namespace="default",qos="Burstable"\} 1/);
  t.match(metrics, /bashible_early_oom_psi_unavailable 0/);
  t.match(metrics, /bashible_early_oom_cooldown 1/);
  t.match(metrics, /bashible_early_oom_kill_duration_seconds_count 1/);
  t.match(metrics, /process_resident_memory_bytes \d+/);
  t.match(metrics, `bashible_agent_info{version="${VERSION}"} 1`, "the running agent's version");
  const s = await agentStatus();
  t.equal(s?.trigger.phase, "cooldown");
  t.equal(s?.lastAction?.pod, "default/web");
});

t.test("the node group turns early OOM off and on again through the bundle it applies", async (t) => {
  // The agent's first converge waits for update approval (no first_run here): approve, as the
  // approval controller would, so bundles get applied.
  await cp.admin.request("PATCH", `/api/v1/nodes/${NODE}`, {
    body: { metadata: { annotations: { "update.node.deckhouse.io/approved": "" } } },
  });
  const off = makeBundle([script("050_x", "true")], {
    context: { nodeGroup: { ...makeBundle([]).context.nodeGroup, earlyOom: { enabled: false } } },
  });
  await writeBundle(work, off);
  await waitFor(
    "early OOM disabled by the group",
    async () => {
      const m = await fetch(`${agentUrl}/metrics`)
        .then((r) => r.text())
        .catch(() => "");
      return /bashible_early_oom_enabled 0/.test(m) ? true : undefined;
    },
    30_000,
  );
  const on = makeBundle([script("050_x", "true")], {
    context: { nodeGroup: { ...makeBundle([]).context.nodeGroup, earlyOom: { enabled: true, dryRun: true } } },
  });
  await writeBundle(work, on);
  await waitFor(
    "early OOM on again, dry run",
    async () => {
      const st = await agentStatus();
      return st?.config?.dryRun === true ? st : undefined;
    },
    30_000,
  );
  t.pass("followed the applied bundle both ways");
});

t.test("the agent stops on SIGTERM", async (t) => {
  daemon.kill("SIGTERM");
  t.equal(await daemonExit, 0, daemonOut.slice(-2000));
});
