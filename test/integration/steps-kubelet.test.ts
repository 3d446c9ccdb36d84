// The kubelet steps in a sandbox tree with the pinned kubelet binary: Deckhouse's configuration
// is validated by that kubelet before it is installed (a refused one never is), the unit passes
// systemd-analyze verify and carries the registration labels and taint and the discovered node
// address, a drop-in this step does not own is removed in the plan, the bootstrap token stays out
// of plans, the engine restarts the kubelet only when what it reads changed (configuration, CA,
// bootstrap kubeconfig, unit, drop-ins, binary), and 069 waits for the client certificate or says
// what to check.
import t, { type Test } from "tap";
import { copyFile, link, mkdir, mkdtemp, readFile, rm, stat, symlink, writeFile } from "node:fs/promises";
import { existsSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { parse } from "yaml";
import { stepEnv, type StepEnv } from "../fixtures/steps.ts";
import { createCA } from "../../scripts/lib/pki.ts";
import { PATHS } from "../../bundles/paths.ts";
import type { BundleStep, KubeletSpec } from "../../bundles/types.ts";
import { pollIntervalMs } from "../../steps/kubelet-start.ts";

const KUBELET = path.join(process.env.BASHIBLE_TEST_CACHE ?? "/var/cache/bashible-test", "k8s-v1.34.4/kubelet");
const missing = [KUBELET, "/usr/bin/systemd-analyze"].filter((p) => !existsSync(p));
const skip =
  process.getuid?.() !== 0
    ? "needs root (files are written root-owned)"
    : missing.length
      ? `needs ${missing.join(", ")} (scripts/test-binaries.sh; apt-get install systemd)`
      : false;

const TOKEN = "abcdef.0123456789abcdef";

const spec = (over: Partial<KubeletSpec> = {}): KubeletSpec => ({
  cgroupDriver: "systemd",
  clusterDNS: ["10.222.0.10"],
  clusterDomain: "cluster.local",
  maxPods: 120,
  containerLogMaxSize: "50Mi",
  containerLogMaxFiles: 4,
  nodeStatusUpdateFrequencySeconds: 10,
  providerID: "static://",
  resourceReservation: { mode: "Auto" },
  featureGates: {},
  registerLabels: { "node.deckhouse.io/group": "worker", "node.deckhouse.io/type": "Static" },
  registerTaints: [{ key: "node.deckhouse.io/bashible-uninitialized", effect: "NoSchedule" }],
  apiServer: "https://127.0.0.1:6445",
  package: "kubelet",
  ...over,
});
const kubeletStep = (s: KubeletSpec): BundleStep => ({ name: "064_configure_kubelet", kind: "Kubelet", spec: s });

async function tree(t: Test): Promise<{ env: StepEnv; ca: string }> {
  const env = await stepEnv(t);
  const dir = await mkdtemp(path.join(os.tmpdir(), "kubelet-ca-"));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const ca = await readFile((await createCA(dir, "cluster-ca")).cert, "utf8");
  const bin = path.join(env.root, PATHS.binDir, "kubelet");
  await mkdir(path.dirname(bin), { recursive: true });
  await link(KUBELET, bin).catch(() => copyFile(KUBELET, bin));
  await mkdir(path.join(env.root, PATHS.packageStore, "kubelet"), { recursive: true });
  await writeFile(path.join(env.root, PATHS.packageStore, "kubelet/digest"), `sha256:${"1".repeat(64)}\n`);
  await mkdir(path.join(env.root, PATHS.stateDir), { recursive: true });
  await writeFile(path.join(env.root, PATHS.bootstrapToken), `${TOKEN}\n`, { mode: 0o600 });
  return { env, ca };
}

const actions = async (env: StepEnv) =>
  (await readFile(path.join(env.root, PATHS.sandboxActions), "utf8").catch(() => ""))
    .split("\n")
    .filter(Boolean)
    .map((l) => l.replace(/^\S+ /, ""));

t.test("kubelet: from scratch, validated by the kubelet, restarted only for what it reads", { skip }, async (t) => {
  const { env, ca } = await tree(t);
  const o = { context: { clusterCA: ca }, nodeName: "worker-1" };
  const first = kubeletStep(spec());
  const plan = (await env.planRun([first], o))[0]!;
  t.notOk(plan.error, plan.error ?? "planned");
  t.same(
    plan.changes.map(
      (c) =>
        `${c.kind} ${"path" in c ? c.path : "unit" in c ? `${c.unit} ${c.action}` : c.kind === "flag" ? c.name : c.kind === "command" ? c.argv.join(" ") : ""}`,
    ),
    [
      "dir /etc/kubernetes",
      "dir /etc/kubernetes/pki",
      "dir /etc/kubernetes/manifests",
      "dir /var/lib/kubelet",
      "file /etc/systemd/logind.conf.d/90-bashible-kubelet.conf",
      "command systemctl kill --signal=SIGHUP -- systemd-logind.service",
      "file /etc/kubernetes/pki/ca.crt",
      "file /var/lib/kubelet/config.yaml",
      "file /etc/kubernetes/bootstrap-kubelet.conf",
      "file /etc/systemd/system/kubelet.service",
      "unit kubelet.service daemon-reload",
      "unit kubelet.service enable",
      "flag kubelet-need-restart",
      "service kubelet.service restart",
    ],
  );
  const shown = JSON.stringify(plan, (k, v) => (k === "content" ? undefined : v));
  t.notOk(shown.includes(TOKEN.split(".")[1] as string), "the bootstrap token is in no plan");
  t.match(shown, /bootstrap-kubelet\.conf[^}]*\(secret content\)/);

  const applied = await env.apply(first, o);
  t.equal(applied.outcome, "changed", applied.error ?? "");
  t.same(
    await actions(env),
    [
      "systemctl kill --signal=SIGHUP -- systemd-logind.service",
      "systemctl daemon-reload",
      "systemctl restart kubelet.service",
    ],
    "logind's delay first, then the kubelet started by one restart",
  );
  const live = await readFile(path.join(env.root, PATHS.kubeletConfig), "utf8");
  t.equal((await stat(path.join(env.root, PATHS.kubeletConfig))).mode & 0o777, 0o600, "root's alone (CIS)");
  const config = parse(live) as Record<string, unknown>;
  t.match(config, {
    cgroupDriver: "systemd",
    clusterDNS: ["10.222.0.10"],
    maxPods: 120,
    containerRuntimeEndpoint: "unix:///run/containerd/containerd.sock",
    providerID: "static://",
    protectKernelDefaults: true,
    allowedUnsafeSysctls: ["net.*"],
    shutdownGracePeriod: "2m",
    shutdownGracePeriodCriticalPods: "15s",
    imageGCHighThresholdPercent: 70,
    imageGCLowThresholdPercent: 65,
    nodeStatusUpdateFrequency: "10s",
    resolvConf: "/etc/resolv.conf",
    featureGates: { RotateKubeletServerCertificate: true },
  });
  t.match(
    config.systemReserved,
    { cpu: "70m", memory: /^\d+$/, "ephemeral-storage": "1Gi" },
    "Auto: Deckhouse's reservation, memory in bytes",
  );
  t.match(config.evictionHard, { "memory.available": /^\d+$/, "nodefs.available": /^(5%|20G)$/ });
  if (!existsSync("/sys/fs/cgroup/cgroup.controllers")) t.equal(config.failCgroupV1, false, "cgroup v1 machine");
  t.notOk(
    existsSync(path.join(env.root, "etc/sysctl.d/90-bashible-kubelet.conf")),
    "no kernel values of its own: the sysctl tuner is their one owner",
  );
  t.match(
    await readFile(path.join(env.root, "etc/systemd/logind.conf.d/90-bashible-kubelet.conf"), "utf8"),
    /^InhibitDelayMaxSec=120$/m,
    "logind lets the kubelet hold shutdown for its whole grace period",
  );
  const kubeconfig = await readFile(path.join(env.root, PATHS.kubeletBootstrapKubeconfig), "utf8");
  t.match(kubeconfig, `token: ${TOKEN}`);
  t.match(kubeconfig, "server: https://127.0.0.1:6445");
  const unit = await readFile(path.join(env.root, "etc/systemd/system/kubelet.service"), "utf8");
  t.match(unit, "--node-labels=node.deckhouse.io/group=worker,node.deckhouse.io/type=Static");
  t.match(unit, "--register-with-taints=node.deckhouse.io/bashible-uninitialized:NoSchedule");
  t.match(unit, "--hostname-override=worker-1");
  t.notMatch(unit, "--node-ip", "no address discovered: the kubelet picks its own");
  t.match(unit, `# Binary: package kubelet sha256:${"1".repeat(64)}`);

  t.same((await env.plan(first, o)).changes, [], "a second run plans nothing");
  t.equal((await env.apply(first, o)).outcome, "unchanged");
  t.equal((await actions(env)).length, 3, "and restarts nothing");

  const whyRestart = async (s: BundleStep) => {
    const svc = (await env.planRun([s], o))[0]!.changes.find((c) => c.kind === "service");
    return svc?.kind === "service" ? svc.why : [];
  };
  const more = kubeletStep(spec({ maxPods: 42 }));
  t.same(await whyRestart(more), [PATHS.kubeletConfig], "maxPods: the configuration");
  await env.apply(more, o);
  t.same((await actions(env)).slice(3), ["systemctl restart kubelet.service"]);

  // 000_discover_node_ip (Deckhouse's name and file) found the node's address.
  await writeFile(path.join(env.root, PATHS.discoveredNodeIP), "10.1.2.3\n");
  t.same(await whyRestart(more), ["/etc/systemd/system/kubelet.service"], "a discovered address: the unit");
  await env.apply(more, o);
  const withIP = await readFile(path.join(env.root, "etc/systemd/system/kubelet.service"), "utf8");
  t.match(withIP, "--node-ip=10.1.2.3");
  t.match(withIP, "--address=10.1.2.3");
  await writeFile(path.join(env.root, PATHS.discoveredNodeIP), "not-an-address\n");
  const bad = await env.plan(more, o);
  t.match(bad.problems, [{ subject: PATHS.discoveredNodeIP, message: /not an IP address/ }]);
  await writeFile(path.join(env.root, PATHS.discoveredNodeIP), "10.1.2.3\n");
  t.same((await env.plan(more, o)).changes, [], "converged again");

  await writeFile(path.join(env.root, PATHS.packageStore, "kubelet/digest"), `sha256:${"2".repeat(64)}\n`);
  t.same(await whyRestart(more), ["/etc/systemd/system/kubelet.service"], "a new kubelet package: the unit names it");
  await env.apply(more, o);
  t.equal((await actions(env)).filter((a) => a.includes("restart")).length, 4);

  // The kubelet refuses a feature gate it does not know: the candidate is never installed.
  const before = await readFile(path.join(env.root, PATHS.kubeletConfig), "utf8");
  const r = await env.apply(kubeletStep(spec({ maxPods: 42, featureGates: { NoSuchGate: true } })), o);
  t.equal(r.outcome, "failed");
  t.match(r.error, /kubelet refused the configuration: .*unrecognized feature gate: NoSuchGate/);
  t.equal(await readFile(path.join(env.root, PATHS.kubeletConfig), "utf8"), before, "the live configuration stays");
  t.equal((await actions(env)).filter((a) => a.includes("restart")).length, 4, "nothing restarted");
});

t.test("kubelet: a drop-in Deckhouse left would override the unit: it is removed, in the plan", { skip }, async (t) => {
  const { env, ca } = await tree(t);
  const o = { context: { clusterCA: ca } };
  const s = kubeletStep(spec());
  t.equal((await env.apply(s, o)).outcome, "changed");
  const dropIn = path.join(env.root, "etc/systemd/system/kubelet.service.d/10-deckhouse.conf");
  await mkdir(path.dirname(dropIn), { recursive: true });
  await writeFile(
    dropIn,
    "[Service]\nExecStart=\nExecStart=/opt/deckhouse/bin/d8-kubelet-forker /opt/deckhouse/bin/kubelet\n",
  );
  const plan = (await env.planRun([s], o))[0]!;
  const del = plan.changes.find((c) => c.kind === "file" && c.action === "delete");
  t.match(del, {
    path: "/etc/systemd/system/kubelet.service.d/10-deckhouse.conf",
    diff: /-ExecStart=\/opt\/deckhouse\/bin\/d8-kubelet-forker/,
  });
  t.ok(
    plan.changes.some((c) => c.kind === "unit" && c.action === "daemon-reload"),
    "systemd forgets it",
  );
  const svc = plan.changes.find((c) => c.kind === "service");
  t.match(svc, { action: "restart", why: ["/etc/systemd/system/kubelet.service.d/10-deckhouse.conf"] });
  const before = (await actions(env)).length;
  t.equal((await env.apply(s, o)).outcome, "changed");
  t.notOk(existsSync(dropIn), "removed");
  t.same((await actions(env)).slice(before), ["systemctl daemon-reload", "systemctl restart kubelet.service"]);
  t.same((await env.plan(s, o)).changes, [], "and then nothing");
});

t.test("kubelet: systemd-resolved's upstream list where /etc/resolv.conf is its stub", { skip }, async (t) => {
  const { env, ca } = await tree(t);
  const o = { context: { clusterCA: ca } };
  await mkdir(path.join(env.root, "run/systemd/resolve"), { recursive: true });
  await writeFile(path.join(env.root, "run/systemd/resolve/stub-resolv.conf"), "nameserver 127.0.0.53\n");
  await writeFile(path.join(env.root, "run/systemd/resolve/resolv.conf"), "nameserver 192.0.2.53\n");
  await rm(path.join(env.root, "etc/resolv.conf"), { force: true });
  await symlink("../run/systemd/resolve/stub-resolv.conf", path.join(env.root, "etc/resolv.conf"));
  t.equal((await env.apply(kubeletStep(spec()), o)).outcome, "changed");
  const config = parse(await readFile(path.join(env.root, PATHS.kubeletConfig), "utf8")) as Record<string, unknown>;
  t.equal(config.resolvConf, "/run/systemd/resolve/resolv.conf", "pods get the upstream servers, not 127.0.0.53");
});

t.test("kubelet: a joined kubelet keeps its credentials; labels it may not set are reported", { skip }, async (t) => {
  const { env, ca } = await tree(t);
  const o = { context: { clusterCA: ca } };
  await mkdir(path.join(env.root, "var/lib/kubelet/pki"), { recursive: true });
  await writeFile(path.join(env.root, "var/lib/kubelet/pki/kubelet-client-2026.pem"), "cert");
  await symlink("kubelet-client-2026.pem", path.join(env.root, PATHS.kubeletClientPem));
  const s = kubeletStep(
    spec({ registerLabels: { "node-role.kubernetes.io/worker": "", "node.kubernetes.io/pool": "a" } }),
  );
  const plan = await env.plan(s, o);
  t.notOk(
    plan.changes.some((c) => c.kind === "file" && c.path === PATHS.kubeletBootstrapKubeconfig),
    "no bootstrap kubeconfig once the kubelet has its certificate",
  );
  t.same(
    plan.problems.map((p) => p.subject),
    ["label node-role.kubernetes.io/worker"],
  );
  await env.apply(s, o);
  const unit = await readFile(path.join(env.root, "etc/systemd/system/kubelet.service"), "utf8");
  t.match(unit, "--node-labels=node.kubernetes.io/pool=a");
  t.notMatch(unit, "node-role.kubernetes.io");
});

t.test("069_start_kubelet: waits for the client certificate, or says what to check", { skip }, async (t) => {
  const { env } = await tree(t);
  pollIntervalMs.value = 50;
  const start = (seconds: number): BundleStep => ({
    name: "069_start_kubelet",
    kind: "KubeletStart",
    spec: { clientCertTimeoutSeconds: seconds },
  });
  const r = await env.apply(start(1));
  t.equal(r.outcome, "failed");
  t.equal(r.attempts, 1, "not retried: the next run waits again");
  t.match(r.error, /no client certificate after 1 s/);
  t.match(r.error, /kubectl get csr/);
  t.match(r.error, /bootstrap tokens expire/);
  t.match(r.error, /clock/);

  const running = env.apply(start(60));
  const log = path.join(env.root, "var/log/d8/bashible/step.069_start_kubelet.log");
  while (!(await readFile(log, "utf8").catch(() => "")).includes("plan: wait up to 60 s")) {
    await new Promise((res) => setTimeout(res, 20));
  }
  await mkdir(path.join(env.root, "var/lib/kubelet/pki"), { recursive: true });
  await writeFile(path.join(env.root, PATHS.kubeletClientPem), "cert");
  t.equal((await running).outcome, "changed", "done once the certificate is there");
  t.same((await env.plan(start(60))).changes, [], "and then there is nothing to wait for");
});

t.test(
  "kubelet: seccomp, topology manager, swap and a CRI socket of its own pass the kubelet's check",
  { skip },
  async (t) => {
    const { env, ca } = await tree(t);
    const s = kubeletStep(
      spec({
        seccompDefault: true,
        topologyManager: { policy: "best-effort", scope: "pod" },
        swapBehavior: "LimitedSwap",
        criSocket: "/run/crio/crio.sock",
      }),
    );
    const r = await env.apply(s, { context: { clusterCA: ca } });
    t.equal(r.outcome, "changed", r.error ?? "");
    const config = parse(await readFile(path.join(env.root, PATHS.kubeletConfig), "utf8")) as Record<string, unknown>;
    t.match(config, {
      seccompDefault: true,
      topologyManagerPolicy: "best-effort",
      topologyManagerScope: "pod",
      cpuManagerPolicy: "static",
      memoryManagerPolicy: "Static",
      featureGates: { MemoryManager: true },
      memorySwap: { swapBehavior: "LimitedSwap" },
      failSwapOn: false,
      containerRuntimeEndpoint: "unix:///run/crio/crio.sock",
    });
    const reserved = config as { systemReserved: { memory: string }; evictionHard: Record<string, string> };
    t.same(
      (config as { reservedMemory: unknown }).reservedMemory,
      [
        {
          numaNode: 0,
          limits: {
            memory: String(Number(reserved.systemReserved.memory) + Number(reserved.evictionHard["memory.available"])),
          },
        },
      ],
      "NUMA node 0 holds back exactly what the kubelet reserves: the system's share and the hard eviction threshold",
    );
    t.match(reserved.evictionHard, { "imagefs.available": "5%" }, "no containerd of ours: imagefs in percent");

    // The managers refuse a checkpoint of another policy: turning the topology manager off
    // removes their checkpoints with the configuration change, and asks for disruption approval.
    const root = path.join(env.root, "var/lib/kubelet");
    await writeFile(path.join(root, "cpu_manager_state"), '{"policyName":"static"}');
    await writeFile(path.join(root, "memory_manager_state"), '{"policyName":"Static"}');
    const off = kubeletStep(spec({ criSocket: "/run/crio/crio.sock" }));
    const plan = await env.plan(off, { context: { clusterCA: ca } });
    const config2 = plan.changes.find((c) => c.kind === "file" && c.path === PATHS.kubeletConfig);
    t.match(config2?.disruptive, /CPU\/memory manager policy changes \(static\/Static → none\/None\)/);
    t.same(
      plan.changes.filter((c) => c.kind === "file" && c.action === "delete").map((c) => "path" in c && c.path),
      ["/var/lib/kubelet/cpu_manager_state", "/var/lib/kubelet/memory_manager_state"],
    );
    t.equal((await env.apply(off, { context: { clusterCA: ca } })).outcome, "changed");
    t.notOk(existsSync(path.join(root, "cpu_manager_state")), "the checkpoint is gone");
  },
);
