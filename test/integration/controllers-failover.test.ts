// Two `bashible controllers` processes, one Lease: the leader is SIGKILLed in the middle of a
// drain; the other takes the Lease over and finishes the drain from where it stood. A pod
// evicted before the kill (still terminating) is not evicted again, the drain's deadline is
// the one set before the kill, and the pod a PodDisruptionBudget protects is deleted only
// once that deadline passed. Real kube-apiserver and kube-controller-manager; what the
// controllers did is read from the API server's audit log.
import t from "tap";
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, open, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { pino } from "pino";
import { NODE_KEYS, SECRETS } from "../../bundles/names.ts";
import { installCrds } from "../../cluster/crds/install.ts";
import type { KubeObject } from "../../lib/kube/api.ts";
import { MAIN } from "../../scripts/lib/cli.ts";
import { withControlPlane } from "../../scripts/lib/control-plane-fixture.ts";
import {
  annotate,
  createNode,
  createPod,
  HOLD_LABEL,
  parseAudit,
  POD_AUDIT_POLICY,
  startKubeletSim,
} from "../../scripts/lib/sim-nodes.ts";
import { until } from "../../scripts/lib/until.ts";

const K = NODE_KEYS;
const NS = "d8-cloud-instance-manager";
const TIMEOUT_S = 10;
const log = pino({ level: "silent" });

const dir = await mkdtemp(path.join(os.tmpdir(), "bashible-failover-"));
t.teardown(() => rm(dir, { recursive: true, force: true }));
const auditLog = path.join(dir, "audit.log");
await writeFile(path.join(dir, "policy.yaml"), POD_AUDIT_POLICY);
const cp = await withControlPlane(t, {
  controllerManager: { controllers: ["disruption", "serviceaccount"] },
  extraApiserverArgs: [`--audit-policy-file=${path.join(dir, "policy.yaml")}`, `--audit-log-path=${auditLog}`],
});
const admin = cp.admin;
await installCrds(admin);
await cp.kubectl(["create", "namespace", NS]);
await cp.kubectl(["create", "namespace", "apps"]);
const kubelet = startKubeletSim(admin, log);
t.teardown(() => kubelet.stop());

const procs = new Map<number, ChildProcess>();
async function startController(n: number): Promise<ChildProcess> {
  const out = await open(path.join(dir, `controller-${n}.log`), "a");
  const child = spawn(
    process.execPath,
    [
      MAIN,
      "controllers",
      `--kubeconfig=${cp.adminKubeconfig}`,
      "--lease-duration=3",
      "--eviction-retry=0.5",
      "--log-format=json",
    ],
    { stdio: ["ignore", out.fd, out.fd] },
  );
  await out.close();
  procs.set(child.pid!, child);
  t.teardown(() => void child.kill("SIGKILL"));
  return child;
}
const holder = async () =>
  (
    await admin.request<{ spec?: { holderIdentity?: string; acquireTime?: string } }>(
      "GET",
      `/apis/coordination.k8s.io/v1/namespaces/${NS}/leases/bashible-controllers`,
    )
  ).spec;
const pidOf = (identity: string | undefined) => Number(identity?.split("_")[1]);
const ann = async (name: string) =>
  (await admin.request<KubeObject>("GET", `/api/v1/nodes/${name}`)).metadata.annotations ?? {};
const audit = async () =>
  parseAudit(await readFile(auditLog, "utf8")).filter((e) => e.userAgent.startsWith("bashible-controller"));

t.test("the controller killed mid-drain: the new leader resumes without double evictions", async (t) => {
  await cp.kubectl(["apply", "-f", "-"], {
    input: JSON.stringify({
      apiVersion: "v1",
      kind: "List",
      items: [
        {
          apiVersion: "v1",
          kind: "Secret",
          metadata: { name: SECRETS.checksums, namespace: NS },
          stringData: { fo: "f".repeat(64) },
        },
        {
          apiVersion: "deckhouse.io/v1",
          kind: "NodeGroup",
          metadata: { name: "fo" },
          spec: { nodeType: "Static", nodeDrainTimeoutSecond: TIMEOUT_S },
        },
        {
          apiVersion: "policy/v1",
          kind: "PodDisruptionBudget",
          metadata: { name: "guarded", namespace: "apps" },
          spec: { minAvailable: 1, selector: { matchLabels: { app: "guarded" } } },
        },
      ],
    }),
  });
  await createNode(admin, "fo-1", "fo");
  await until("ServiceAccount", () => admin.request("GET", "/api/v1/namespaces/apps/serviceaccounts/default"));
  for (const p of ["free-1", "free-2"]) await createPod(admin, "apps", p, "fo-1");
  await createPod(admin, "apps", "stuck", "fo-1", { labels: { [HOLD_LABEL]: "" } });
  await createPod(admin, "apps", "guarded", "fo-1", { labels: { app: "guarded" } });
  await until("PDB counted", async () => {
    const p = await admin.request<{ status?: { currentHealthy?: number; disruptionsAllowed?: number } }>(
      "GET",
      "/apis/policy/v1/namespaces/apps/poddisruptionbudgets/guarded",
    );
    return p.status?.currentHealthy === 1 && p.status.disruptionsAllowed === 0;
  });

  await startController(1);
  await startController(2);
  const first = await until("a leader", async () => {
    const h = await holder();
    return procs.has(pidOf(h?.holderIdentity)) ? h : undefined;
  });

  await annotate(admin, "fo-1", { [K.approved]: "", [K.disruptionRequired]: "" });
  // Mid-drain: the stuck pod's eviction was accepted (it keeps terminating) and the guarded
  // pod's eviction was refused at least once.
  await until("evictions under way", async () => {
    const a = await audit();
    return (
      a.some((e) => e.subresource === "eviction" && e.name === "stuck" && e.code === 201) &&
      a.some((e) => e.subresource === "eviction" && e.name === "guarded" && e.code === 429)
    );
  });
  const startedAt = (await ann("fo-1"))[K.drainStartedAt];
  t.ok(startedAt, "the drain's start is on the Node");
  const killedPid = pidOf(first.holderIdentity);
  procs.get(killedPid)!.kill("SIGKILL");

  const second = await until("the other process leads", async () => {
    const h = await holder();
    const pid = pidOf(h?.holderIdentity);
    return pid !== killedPid && procs.has(pid) ? h : undefined;
  });
  await until("the new leader tried the guarded pod", async () =>
    (await audit()).some(
      (e) => e.subresource === "eviction" && e.name === "guarded" && e.at >= Date.parse(second.acquireTime!),
    ),
  );
  const mid = await ann("fo-1");
  if (mid[K.draining] !== undefined) t.equal(mid[K.drainStartedAt], startedAt, "the deadline was not restarted");

  await until("disruption approved", async () => (await ann("fo-1"))[K.disruptionApproved] !== undefined, 60_000);
  const a = await audit();
  const evictions = (name: string) => a.filter((e) => e.subresource === "eviction" && e.name === name);
  for (const name of ["free-1", "free-2", "stuck"])
    t.equal(evictions(name).filter((e) => e.code === 201).length, 1, `${name} evicted exactly once`);
  t.equal(evictions("stuck").length, 1, "the terminating pod was not evicted again by the new leader");
  t.equal(evictions("guarded").filter((e) => e.code === 201).length, 0, "the PDB held");
  const deletes = a.filter((e) => e.verb === "delete" && !e.subresource && e.resource === "pods");
  t.same(
    deletes.map((e) => e.name),
    ["guarded"],
    "only the guarded pod deleted",
  );
  const deletedAt = deletes[0]!.at;
  t.ok(deletedAt >= Date.parse(startedAt!) + TIMEOUT_S * 1000, "not before the drain's deadline");
  t.ok(
    deletedAt < Date.parse(second.acquireTime!) + TIMEOUT_S * 1000,
    "on the deadline set before the kill, not one restarted by the new leader",
  );
  t.equal((await ann("fo-1"))[K.drained], "bashible");
  await kubelet.release("apps", "stuck");
});
