// Real memory pressure on this kernel: a "pod" (real cgroups laid out as the kubelet lays them
// out) whose memory limit is below the file-backed working set its processes keep re-reading
// thrashes, and the stalls show in /proc/pressure/memory. Early OOM, reading the real /proc,
// sees them and kills that pod, whole, while a pod of the same size that stays under its limit
// is untouched; and a static pod (etcd, from a manifest) that thrashes is never killed. Root only.
//
// Thresholds: this shared machine runs other work on both CPUs, so the *node-wide* full stall a
// single thrashing cgroup causes here is a few percent, not the 30% a node thrashing as a whole
// reaches; the test lowers the stall threshold to 2% and keeps the duration and the second
// signal (reclaim + refaults) as they work in production.
import t, { type Test } from "tap";
import { randomUUID } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { Registry } from "../../lib/prometheus.ts";
import { EarlyOom } from "../../agent/early-oom/early-oom.ts";
import { type Pod, StaticPods } from "../../agent/early-oom/pods.ts";
import {
  captureLogger,
  hasV1MemoryAndFreezer,
  manifestUid,
  mirrorPodObject,
  podObject,
  RealThrash,
} from "../../scripts/lib/early-oom.ts";
import { waitFor } from "../../scripts/lib/cli.ts";
import { requireRoot } from "../fixtures/root.ts";

await requireRoot("creates memory cgroups and drops a file's page cache");
const skip = !existsSync("/proc/pressure/memory")
  ? "this kernel has no PSI (/proc/pressure/memory)"
  : !hasV1MemoryAndFreezer()
    ? "needs the cgroup v1 memory and freezer controllers (this test builds v1 pods)"
    : undefined;
if (skip) {
  t.plan(0, `skipped: ${skip}`);
  t.end();
  await new Promise((r) => setImmediate(r));
  process.exit(0);
}

const work = mkdtempSync(path.join(os.tmpdir(), "early-oom-pressure-"));
t.teardown(() => rmSync(work, { recursive: true, force: true }));

/** EarlyOom on the real /proc, thresholds as the header says, with the given Pod objects. */
function agent(t: Test, thrash: RealThrash, pods: Pod[]) {
  const sysrq = path.join(work, `sysrq-trigger-${randomUUID().slice(0, 8)}`);
  writeFileSync(sysrq, "");
  const log = captureLogger();
  const metrics = new Registry();
  const eo = new EarlyOom({
    procRoot: "/proc",
    cgroupRoot: thrash.cg.cgroupRoot,
    sysrqPath: sysrq,
    nodeName: "node-1",
    log,
    kube: () => undefined,
    metrics,
    pods: new StaticPods(pods),
  });
  t.teardown(() => eo.stop());
  eo.configure({
    fullStallPercent: 2,
    durationMs: 2000,
    memAvailablePercent: 0,
    reclaimPagesPerSecond: 256,
    cooldownMs: 600_000,
    fallback: "none",
  });
  return { eo, log, metrics, sysrq };
}

t.test("real thrash in one pod: early OOM sees it in /proc/pressure/memory and kills that pod only", async (t) => {
  const thrash = new RealThrash(work);
  t.teardown(() => thrash.cleanup());
  const thrasher = await thrash.start(
    { name: "thrasher", qos: "BestEffort", workingSetMi: 64, uid: randomUUID() },
    160,
    8,
  );
  const calm = await thrash.start(
    { name: "calm", qos: "Burstable", workingSetMi: 64, requestMi: 64, uid: randomUUID() },
    24,
    2,
  );
  const { eo, metrics, sysrq } = agent(t, thrash, [
    podObject(thrasher.input, thrasher.uid),
    podObject(calm.input, calm.uid),
  ]);

  const seen = await waitFor("a kill", () => (eo.status().actions.kill ? eo.status() : undefined), 120_000);
  const a = seen.lastAction;
  t.comment(`trigger: ${a?.trigger}`);
  t.comment(`result: ${a?.result}`);
  t.equal(a?.pod, "default/thrasher", "the thrashing pod");
  t.match(a?.trigger, /full stall .* held 2\.\d+ s .*; reclaim \d+ pages\/s \(scanned \+ refaulted\) ≥ 256/);
  t.ok((a?.figures.fullStall ?? 0) >= 0.02, `real full stall seen: ${a?.figures.fullStall}`);
  t.ok(
    (a?.figures.reclaimPagesPerSecond ?? 0) > 1000,
    `real reclaim seen: ${a?.figures.reclaimPagesPerSecond} pages/s`,
  );
  t.match(a?.result, /\d+ process\(es\) killed \(freeze\+SIGKILL\) in \d+ ms$/);
  t.same(thrash.cg.pids(thrasher.rel), [], "no task left in the thrashing pod");
  await waitFor("the thrasher's processes reaped", () => thrash.alive(thrasher) === 0);
  t.ok(
    thrasher.procs.every((c) => c.signalCode === "SIGKILL"),
    "every process the thrasher started died of SIGKILL",
  );
  t.equal(thrash.alive(calm), 3, "the calm pod keeps every process");
  t.ok(thrash.cg.pids(calm.rel).length >= 3, "and the kernel still lists them in its cgroups");
  t.equal(readFileSync(sysrq, "utf8"), "", "no sysrq");
  t.match(metrics.text(), /bashible_early_oom_kills_total\{namespace="default",qos="BestEffort"\} 1/);
});

t.test("real thrash in a static pod (etcd's mirror pod): early OOM decides, and kills nothing", async (t) => {
  // The kubelet never evicts a static pod. Its cgroup carries the manifest UID, its mirror pod in
  // the API another UID; before the fix the cgroup matched no Pod object, ranked as a pod
  // without one, and was killed.
  const thrash = new RealThrash(work);
  t.teardown(() => thrash.cleanup());
  const etcd = await thrash.start(
    {
      name: "etcd-node-1",
      namespace: "kube-system",
      qos: "Burstable",
      workingSetMi: 64,
      requestMi: 16,
      priorityClassName: "system-node-critical",
      uid: manifestUid(),
    },
    160,
    8,
  );
  const { eo, log } = agent(t, thrash, [mirrorPodObject(etcd.input, etcd.uid)]);
  const seen = await waitFor("a decision", () => (eo.status().lastAction ? eo.status() : undefined), 120_000);
  t.comment(`trigger: ${seen.lastAction?.trigger}`);
  t.equal(seen.lastAction?.action, "none", "no candidate: nothing done (the fallback is off here)");
  t.match(seen.lastAction?.trigger, /full stall .* held 2\.\d+ s/, "the real stall met the trigger");
  t.equal(seen.actions.kill, 0);
  t.notOk(log.lines.some((l) => l.msg === "early OOM killed a pod"));
  t.equal(thrash.alive(etcd), 9, "the static pod keeps every process");
  const r = eo.rank();
  t.same(r.ranked, []);
  t.match(r.excluded[0]?.reason, /^static pod \(mirror pod of a manifest on the node\): the kubelet never evicts it/);
});
