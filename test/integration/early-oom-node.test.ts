// Early OOM on a node whose /proc and /sys/fs/cgroup are a temp tree in the kernel's formats and
// whose pods' tasks are real processes: what it kills, what it leaves alone, and when.
import t, { type Test } from "tap";
import { Registry } from "../../lib/prometheus.ts";
import { EarlyOom, type EarlyOomConfig } from "../../agent/early-oom/early-oom.ts";
import { type Pod, StaticPods } from "../../agent/early-oom/pods.ts";
import { captureLogger, FakeNode, LAYOUTS, type FakePod, type Layout, type Load } from "../../scripts/lib/early-oom.ts";

/** Memory really short: most time fully stalled, little available, reclaim thrashing. */
const THRASH: Load = { full: 0.6, some: 0.85, memAvailableMi: 200, scan: 20_000, refault: 5000 };
const QUIET: Load = { full: 0, some: 0, memAvailableMi: 6000 };

function agent(node: FakeNode, cfg: Partial<EarlyOomConfig> = {}, opts: { pods?: boolean | Pod[] } = {}) {
  const log = captureLogger();
  const metrics = new Registry();
  const eo = new EarlyOom({
    procRoot: node.procRoot,
    cgroupRoot: node.cgroupRoot,
    sysrqPath: node.sysrqPath,
    nodeName: "node-1",
    log,
    kube: () => undefined,
    metrics,
    clock: node.clock,
    pods: new StaticPods(Array.isArray(opts.pods) ? opts.pods : opts.pods === false ? [] : node.podList()),
  });
  eo.configure(cfg);
  return { eo, log, metrics };
}

function newNode(t: Test, layout: Layout = { version: 2, driver: "systemd" }, o?: { psi?: boolean }): FakeNode {
  const node = new FakeNode(layout, o);
  t.teardown(() => node.cleanup());
  return node;
}

/** A node with the ranking laid out so that every key of the kubelet's order matters. */
function mixedPods(node: FakeNode) {
  return {
    // Largest of all, but Guaranteed: protected.
    guaranteed: node.addPod({ name: "db", qos: "Guaranteed", workingSetMi: 3000, limitMi: 3000 }),
    // Large and far above its request, but system-node-critical: never killed.
    critical: node.addPod({
      name: "node-agent",
      namespace: "kube-system",
      qos: "Burstable",
      workingSetMi: 2500,
      requestMi: 100,
      priority: 2_000_001_000,
      priorityClassName: "system-node-critical",
    }),
    // The largest and furthest above its request of all: etcd, run by the kubelet from a manifest
    // (its cgroup carries the manifest UID, its mirror pod another). Never killed.
    etcd: node.addPod({
      name: "etcd-node-1",
      namespace: "kube-system",
      qos: "Burstable",
      workingSetMi: 4000,
      requestMi: 100,
      priority: 2_000_001_000,
      priorityClassName: "system-node-critical",
      staticPod: true,
    }),
    // Exceeds its request by the most, but a higher priority than the victim.
    important: node.addPod({ name: "important", qos: "Burstable", workingSetMi: 2000, requestMi: 100, priority: 1000 }),
    // The largest raw usage (page cache) of the unprotected pods, but within its request.
    cache: node.addPod({ name: "cache", qos: "Burstable", workingSetMi: 1900, inactiveFileMi: 1500, requestMi: 2000 }),
    // Exceeds, priority 0, 700 MiB above request: the kubelet's first pick.
    web: node.addPod({ name: "web", qos: "Burstable", workingSetMi: 1200, requestMi: 500 }),
    // Exceeds, priority 0, 300 MiB above request: second.
    batch: node.addPod({ name: "batch", qos: "BestEffort", workingSetMi: 300 }),
  };
}

function assertOnlyKilled(t: Test, node: FakeNode, victim: FakePod) {
  for (const p of node.pods) {
    if (p === victim) t.equal(node.alive(p), 0, `every task of ${p.input.name} is gone`);
    else t.equal(node.alive(p), p.processes.length, `${p.input.name} keeps all its tasks`);
  }
}

for (const layout of LAYOUTS) {
  t.test(
    `cgroup v${layout.version}, ${layout.driver} driver: sustained pressure kills the kubelet's first pick, whole, and only it`,
    async (t) => {
      const node = newNode(t, layout);
      const pods = mixedPods(node);
      const { eo, metrics, log } = agent(node);
      t.teardown(() => eo.stop());

      const ranking = eo.rank();
      t.same(
        ranking.ranked.map((r) => r.pod?.name),
        ["web", "batch", "important", "cache", "db"],
        "the kubelet's order, protected pods last",
      );
      t.same(
        ranking.excluded.map((e) => [e.pod?.name, e.reason.split(":")[0]]),
        [
          ["etcd-node-1", "static pod (mirror pod of a manifest on the node)"],
          ["node-agent", "critical pod (priority 2000001000 ≥ 2000000000, system-cluster-critical)"],
        ],
        "static and critical pods are never candidates",
      );

      await node.run(2000, QUIET);
      await node.run(2900, THRASH);
      t.equal(eo.status().actions.kill, 0, "nothing killed before the stall held for the duration");
      // The 1 s window crosses 30% about 0.5 s into a 60% stall; 3 s later the pod goes.
      await node.run(1100, THRASH);
      t.equal(eo.status().actions.kill, 1, "one kill once the stall held 3 s");
      const signals = await node.exited(pods.web);
      t.ok(
        signals.every((s) => s === "SIGKILL"),
        "the victim's tasks died of SIGKILL",
      );
      t.equal(signals.length, 5, "sandbox + 2 containers × 2 tasks");
      assertOnlyKilled(t, node, pods.web);

      const last = eo.status().lastAction;
      t.equal(last?.action, "kill");
      t.equal(last?.pod, "default/web");
      t.match(last?.trigger, /full stall 60% .* held 3\.\d+ s/);
      t.match(
        last?.victim,
        /ranked 1 of 5: working set 1\.2 GiB > request 500 MiB, priority 0, Burstable, 700 MiB above request/,
      );
      t.match(
        last?.result,
        layout.version === 2 ? /5 process\(es\) killed \(cgroup\.kill\)/ : /5 process\(es\) killed \(freeze\+SIGKILL\)/,
      );
      t.match(metrics.text(), /bashible_early_oom_kills_total\{namespace="default",qos="Burstable"\} 1/);
      t.match(metrics.text(), /bashible_early_oom_decisions_total\{action="kill"\} 1/);
      t.ok(log.lines.some((l) => l.msg === "early OOM killed a pod" && l.pod === "default/web"));
      t.equal(node.sysrqWrites(), "", "no sysrq");
    },
  );
}

t.test(
  "the pace: every 750 ms while calm, four times a second near a threshold, the stall timed at the fast pace",
  async (t) => {
    const node = newNode(t);
    const victim = node.addPod({ name: "web", qos: "BestEffort", workingSetMi: 900 });
    const { eo, metrics } = agent(node);
    t.teardown(() => eo.stop());
    const samples = () => Number(/bashible_early_oom_samples_total (\d+)/.exec(metrics.text())?.[1]);

    await node.run(5000, QUIET);
    t.same(eo.status().sampling, {
      intervalMs: 750,
      calm: true,
      reason: "PSI and MemAvailable far from the thresholds",
    });
    let before = samples();
    await node.run(60_000, QUIET);
    t.equal(samples() - before, 80, "a calm minute: 80 samples");
    t.match(metrics.text(), /bashible_early_oom_sample_interval_seconds 0.75\n/);

    // Memory getting short (MemAvailable within twice its threshold) brings the fast pace back...
    await node.run(2000, { ...QUIET, memAvailableMi: 1500 });
    before = samples();
    await node.run(10_000, { ...QUIET, memAvailableMi: 1500 });
    t.equal(samples() - before, 40, "four samples a second");
    t.match(eo.status().sampling.reason, /^MemAvailable 18% ≤ 20%$/);
    // ...and so does a stall a quarter of the way to its threshold.
    await node.run(3000, QUIET);
    t.equal(eo.status().sampling.calm, true);
    await node.run(2000, { full: 0.1, some: 0.2, memAvailableMi: 6000 });
    t.match(eo.status().sampling.reason, /^full stall 10% ≥ 25% of the 30% threshold$/);
    t.equal(eo.status().trigger.phase, "calm", "still below the trigger's threshold");

    // A node calm one moment and thrashing the next: the stall is seen within a calm interval,
    // then timed at the fast pace for the whole duration, as before.
    await node.run(5000, QUIET);
    t.equal(eo.status().sampling.calm, true);
    await node.run(3000, THRASH);
    t.equal(eo.status().actions.kill, 0, "nothing before the stall held the duration");
    t.equal(eo.status().sampling.intervalMs, 250);
    await node.run(2000, THRASH);
    t.equal(eo.status().actions.kill, 1, "killed within the duration plus one calm interval and the window");
    await node.exited(victim);
  },
);

t.test("an I/O storm (I/O stall, memory calm) kills nothing", async (t) => {
  const node = newNode(t);
  mixedPods(node);
  const { eo } = agent(node);
  t.teardown(() => eo.stop());
  await node.run(20_000, { io: 0.95, full: 0.01, some: 0.05, memAvailableMi: 6000, scan: 0, refault: 0 });
  t.equal(eo.status().actions.kill, 0);
  t.equal(eo.status().trigger.phase, "calm");
  for (const p of node.pods) t.equal(node.alive(p), p.processes.length, `${p.input.name} untouched`);
});

t.test("full memory stall without a second signal (memory to spare, no reclaim) kills nothing", async (t) => {
  const node = newNode(t);
  mixedPods(node);
  const { eo } = agent(node);
  t.teardown(() => eo.stop());
  await node.run(20_000, { full: 0.7, some: 0.9, memAvailableMi: 5000, scan: 0, refault: 0 });
  t.equal(eo.status().actions.kill, 0);
  t.equal(eo.status().trigger.phase, "building");
  t.match(
    eo.status().trigger.reason,
    /but no second signal: MemAvailable 4\.9 GiB \(61%.*\) > 10%, reclaim 0 pages\/s/,
  );
  for (const p of node.pods) t.equal(node.alive(p), p.processes.length, `${p.input.name} untouched`);

  // The same stall with reclaim thrashing (memory still "available": page cache) does act.
  await node.run(4000, { full: 0.7, some: 0.9, memAvailableMi: 5000, scan: 30_000, refault: 8000 });
  t.equal(eo.status().actions.kill, 1);
  t.match(eo.status().lastAction?.trigger, /reclaim \d+ pages\/s \(scanned \+ refaulted\) ≥ 256/);
});

t.test("a spike shorter than the duration kills nothing, however high", async (t) => {
  const node = newNode(t);
  mixedPods(node);
  const { eo } = agent(node);
  t.teardown(() => eo.stop());
  for (let i = 0; i < 5; i++) {
    await node.run(2500, { ...THRASH, full: 1, some: 1 });
    await node.run(1500, QUIET);
  }
  t.equal(eo.status().actions.kill, 0);
  for (const p of node.pods) t.equal(node.alive(p), p.processes.length, `${p.input.name} untouched`);
});

t.test(
  "Guaranteed pods go only when nothing else is left, critical ones never; cooldown holds between kills",
  async (t) => {
    const node = newNode(t, { version: 1, driver: "systemd" });
    const guaranteed = node.addPod({ name: "db", qos: "Guaranteed", workingSetMi: 3000, limitMi: 3000 });
    const critical = node.addPod({
      name: "kube-proxy",
      namespace: "kube-system",
      qos: "Burstable",
      workingSetMi: 2500,
      requestMi: 100,
      priority: 2_000_001_000,
    });
    const small = node.addPod({ name: "tiny", qos: "Burstable", workingSetMi: 20, requestMi: 50 });
    const { eo } = agent(node, { cooldownMs: 15_000, fallback: "none" });
    t.teardown(() => eo.stop());

    await node.run(3500, THRASH);
    t.equal(eo.status().actions.kill, 1);
    await node.exited(small);
    t.equal(node.alive(small), 0, "the small unprotected pod goes first, though it is within its request");
    t.equal(node.alive(guaranteed), guaranteed.processes.length);
    t.equal(node.alive(critical), critical.processes.length);

    const cooldownEnd = node.clock.now() + eo.status().trigger.cooldownRemainingSeconds * 1000;
    await node.run(cooldownEnd - node.clock.now() - 500, THRASH);
    t.equal(eo.status().actions.kill, 1, "no second kill during the cooldown");
    t.equal(eo.status().trigger.phase, "cooldown");

    // After the cooldown the stall must hold for the whole duration again.
    await node.run(500 + 2900, THRASH);
    t.equal(eo.status().actions.kill, 1, "the stall is measured afresh after the cooldown");
    await node.run(500, THRASH);
    t.equal(eo.status().actions.kill, 2, "only protected and critical pods left: the protected one goes");
    await node.exited(guaranteed);
    t.equal(node.alive(critical), critical.processes.length, "the critical pod is never a candidate");

    // Only the critical pod left: no candidate, and with the fallback off, nothing is done.
    await node.run(15_000 + 3500, THRASH);
    t.equal(eo.status().actions.kill, 2);
    t.equal(eo.status().lastAction?.action, "none");
    t.equal(node.alive(critical), critical.processes.length, "still every task of the critical pod");
  },
);

t.test("static pods are never killed, matched through their mirror pod or not, even as the only pods", async (t) => {
  // A control-plane node: etcd and kube-apiserver run from manifests, far above their requests.
  // The kubelet never evicts them; before the fix, their cgroups (carrying the manifest UID)
  // matched no Pod object and ranked first, so early OOM killed etcd, even with kube-system
  // excluded.
  const node = newNode(t, { version: 2, driver: "systemd" });
  const etcd = node.addPod({
    name: "etcd-cp-1",
    namespace: "kube-system",
    qos: "Burstable",
    workingSetMi: 4000,
    requestMi: 100,
    priorityClassName: "system-node-critical",
    priority: 2_000_001_000,
    staticPod: true,
  });
  const apiserver = node.addPod({
    name: "kube-apiserver-cp-1",
    namespace: "kube-system",
    qos: "Burstable",
    workingSetMi: 3000,
    requestMi: 100,
    staticPod: true,
  });
  const { eo, log } = agent(node, { excludeNamespaces: ["kube-system"] }, { pods: [etcd.pod] });
  t.teardown(() => eo.stop());
  const r = eo.rank();
  t.same(r.ranked, [], "no candidate");
  t.same(
    r.excluded.map((e) => e.reason.split(":")[0]),
    [
      "static pod (mirror pod of a manifest on the node)",
      "static pod (its cgroup carries a manifest UID; no mirror pod known)",
    ],
  );
  await node.run(3500, THRASH);
  t.equal(eo.status().actions.kill, 0, "nothing killed");
  t.equal(eo.status().lastAction?.action, "sysrq", "the kernel's OOM killer is asked instead");
  t.equal(node.sysrqWrites(), "f");
  t.notOk(log.lines.some((l) => l.msg === "early OOM killed a pod"));
  for (const p of [etcd, apiserver]) t.equal(node.alive(p), p.processes.length, `${p.input.name} keeps every task`);
});

t.test("excluded namespaces and labels are never killed", async (t) => {
  const node = newNode(t, { version: 2, driver: "cgroupfs" });
  const a = node.addPod({ name: "a", namespace: "payments", qos: "BestEffort", workingSetMi: 3000 });
  const b = node.addPod({ name: "b", qos: "BestEffort", workingSetMi: 2000, labels: { "example.com/keep": "yes" } });
  const c = node.addPod({ name: "c", qos: "BestEffort", workingSetMi: 1000, labels: { "example.com/keep": "no" } });
  const { eo } = agent(node, { excludeNamespaces: ["payments"], excludeLabels: ["example.com/keep=yes"] });
  t.teardown(() => eo.stop());
  const r = eo.rank();
  t.same(
    r.excluded.map((e) => [e.pod?.name, e.reason]),
    [
      ["b", "label example.com/keep=yes is excluded"],
      ["a", "namespace payments is excluded"],
    ],
  );
  await node.run(3500, THRASH);
  await node.exited(c);
  t.equal(node.alive(a), a.processes.length);
  t.equal(node.alive(b), b.processes.length);
});

t.test("dry run decides and logs the victim, kills nothing", async (t) => {
  const node = newNode(t, { version: 1, driver: "cgroupfs" });
  mixedPods(node);
  const { eo, log, metrics } = agent(node, { dryRun: true });
  t.teardown(() => eo.stop());
  await node.run(3500, THRASH);
  const line = log.lines.find((l) => l.msg === "dry run: early OOM would kill this pod");
  t.equal(line?.pod, "default/web");
  t.match(String(line?.rank), /700 MiB above request/);
  t.equal(eo.status().actions["dry-run"], 1);
  t.match(metrics.text(), /bashible_early_oom_decisions_total\{action="dry-run"\} 1/);
  for (const p of node.pods) t.equal(node.alive(p), p.processes.length, `${p.input.name} untouched`);
  t.equal(node.sysrqWrites(), "");
});

t.test(
  "no pod to choose: the kernel's OOM killer is asked (sysrq f), or nothing when the fallback is off",
  async (t) => {
    const node = newNode(t);
    const { eo, metrics } = agent(node);
    t.teardown(() => eo.stop());
    await node.run(3500, THRASH);
    t.equal(node.sysrqWrites(), "f");
    t.equal(eo.status().lastAction?.action, "sysrq");
    t.match(metrics.text(), /bashible_early_oom_decisions_total\{action="sysrq"\} 1/);

    const node2 = newNode(t);
    const { eo: eo2 } = agent(node2, { fallback: "none" });
    t.teardown(() => eo2.stop());
    await node2.run(3500, THRASH);
    t.equal(node2.sysrqWrites(), "");
    t.equal(eo2.status().lastAction?.action, "none");
  },
);

t.test("a pod without a Pod object is killed after the matched ones, by its cgroup's figures", async (t) => {
  const node = newNode(t, { version: 2, driver: "systemd" });
  const known = node.addPod({ name: "known", qos: "Burstable", workingSetMi: 100, requestMi: 200 });
  const unknown = node.addPod({ name: "unknown", qos: "BestEffort", workingSetMi: 3000 });
  const log = captureLogger();
  const eo = new EarlyOom({
    procRoot: node.procRoot,
    cgroupRoot: node.cgroupRoot,
    sysrqPath: node.sysrqPath,
    nodeName: "node-1",
    log,
    kube: () => undefined,
    metrics: new Registry(),
    clock: node.clock,
    pods: new StaticPods([known.pod]),
  });
  eo.configure({});
  t.teardown(() => eo.stop());
  const r = eo.rank().ranked;
  t.same(
    r.map((x) => [x.pod?.name ?? x.cgroup.uid, x.tier]),
    [
      ["known", "pod"],
      [unknown.uid, "unmatched"],
    ],
  );
  t.match(r[1]?.reason, /request unknown, priority unknown, BestEffort.*no Pod object/);
  await node.run(3500, THRASH);
  await node.exited(known);
  t.equal(node.alive(unknown), unknown.processes.length);
});

t.test("cgroup v2 without cgroup.kill (kernel < 5.14): freeze, SIGKILL every task, thaw", async (t) => {
  const node = newNode(t, { version: 2, driver: "systemd" });
  const v = node.addPod({ name: "v", qos: "BestEffort", workingSetMi: 900, noCgroupKill: true });
  const other = node.addPod({ name: "other", qos: "Burstable", workingSetMi: 100, requestMi: 500 });
  const { eo } = agent(node);
  t.teardown(() => eo.stop());
  await node.run(3500, THRASH);
  t.match(eo.status().lastAction?.result, /5 process\(es\) killed \(freeze\+SIGKILL\)/);
  await node.exited(v);
  t.equal(node.alive(other), other.processes.length);
});

t.test("PSI absent: said once, exposed as a metric, then idle", async (t) => {
  const node = newNode(t, { version: 2, driver: "systemd" }, { psi: false });
  const p = node.addPod({ name: "p", qos: "BestEffort", workingSetMi: 900 });
  const { eo, log, metrics } = agent(node);
  t.teardown(() => eo.stop());
  await node.run(10_000, THRASH);
  t.equal(log.lines.filter((l) => /PSI\) is not available/.test(l.msg)).length, 1);
  t.match(metrics.text(), /bashible_early_oom_psi_unavailable 1/);
  t.equal(eo.status().psi, "unavailable");
  t.equal(node.clock.pending, 0, "no further samples scheduled");
  t.equal(node.alive(p), p.processes.length);
});

t.test("a bad configuration is refused with its name and the running one stays; disabled stops sampling", async (t) => {
  const node = newNode(t);
  const { eo } = agent(node, { fullStallPercent: 40 });
  t.teardown(() => eo.stop());
  t.throws(
    () => eo.configure({ fullStallPercent: 400 }),
    /fullStallPercent must be a number from 0\.1 to 100, got 400/,
  );
  t.throws(() => eo.configure({ fullStalPercent: 40 } as Partial<EarlyOomConfig>), /unknown setting 'fullStalPercent'/);
  t.throws(() => eo.configure({ excludeLabels: ["=x"] }), /excludeLabels entry "=x"/);
  t.equal(eo.status().config?.fullStallPercent, 40);
  t.ok(node.clock.pending > 0);
  eo.configure({ enabled: false });
  t.equal(eo.status().enabled, false);
  t.equal(node.clock.pending, 0, "disabled: nothing scheduled");
  eo.configure(undefined);
  t.equal(node.clock.pending, 0);
});
