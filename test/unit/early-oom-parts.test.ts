// Early OOM's parts on their own: the kernel's file formats, Kubernetes quantities, a pod's
// memory request and QoS as the kubelet computes them, the ranking's reasons, the settings'
// checks, and the local metrics endpoint.
import t from "tap";
import { parseMeminfo, parsePsi, parseVmstat } from "../../agent/early-oom/kernel-files.ts";
import { parseQuantity } from "../../lib/kube/quantity.ts";
import {
  podMemoryRequest,
  podPriority,
  podQos,
  podsFromJson,
  StaticPods,
  trimPod,
  type Pod,
} from "../../agent/early-oom/pods.ts";
import { podLabel, rankCandidates } from "../../agent/early-oom/rank.ts";
import { DEFAULT_EARLY_OOM, mergeNodeAndGroup, resolveEarlyOomConfig } from "../../agent/early-oom/config.ts";
import { evaluate, CALM } from "../../agent/early-oom/trigger.ts";
import type { PodCgroup } from "../../agent/early-oom/cgroups.ts";
import { Registry } from "../../lib/prometheus.ts";
import { parseAddress, startMetricsServer } from "../../agent/metrics-server.ts";
import { captureLogger, manifestUid, mirrorPodObject, podObject } from "../../scripts/lib/early-oom.ts";

t.test("PSI, meminfo and vmstat as the kernel writes them", async (t) => {
  const psi = parsePsi(
    "some avg10=5.18 avg60=1.00 avg300=0.21 total=807574\nfull avg10=1.56 avg60=0.29 avg300=0.06 total=276471\n",
  );
  t.same(psi, {
    some: { avg10: 5.18, avg60: 1, avg300: 0.21, total: 807574 },
    full: { avg10: 1.56, avg60: 0.29, avg300: 0.06, total: 276471 },
  });
  t.equal(parsePsi("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"), undefined, "no full line: not memory PSI");
  t.equal(parsePsi(""), undefined);

  const mem = parseMeminfo(
    "MemTotal:       24684084 kB\nMemFree:        18890000 kB\nMemAvailable:   23818988 kB\nHugePages_Total:       0\n",
    ["MemTotal", "MemAvailable", "HugePages_Total", "Missing"],
  );
  t.same(mem, { MemTotal: 24684084 * 1024, MemAvailable: 23818988 * 1024, HugePages_Total: 0 });

  // 5.8+: pgscan_anon/file count cgroup limit reclaim too; pgscan_kswapd/direct do not.
  t.same(
    parseVmstat(
      "workingset_refault_anon 10\nworkingset_refault_file 75211\npgsteal_kswapd 0\npgsteal_direct 0\npgscan_kswapd 0\npgscan_direct 0\npgscan_direct_throttle 7\npgscan_anon 5\npgscan_file 5140716\npgsteal_anon 1\npgsteal_file 1151478\n",
    ),
    { pgscan: 5140721, pgsteal: 1151479, refault: 75221 },
  );
  // Before 5.8 (and per zone before 4.8): kswapd + direct, throttle left out; one refault counter before 5.9.
  t.same(
    parseVmstat(
      "workingset_refault 300\npgscan_kswapd_dma 1\npgscan_kswapd_normal 100\npgscan_direct_normal 20\npgscan_direct_throttle 99\npgsteal_kswapd_normal 50\npgsteal_direct_normal 5\n",
    ),
    { pgscan: 121, pgsteal: 55, refault: 300 },
  );
});

t.test("Kubernetes quantities", async (t) => {
  const cases: [string, number][] = [
    ["128Mi", 128 * 2 ** 20],
    ["1Gi", 2 ** 30],
    ["1.5Gi", 1.5 * 2 ** 30],
    ["1G", 1e9],
    ["500M", 5e8],
    ["1e3", 1000],
    ["12E2", 1200],
    ["500m", 0.5],
    ["1024", 1024],
    ["1Ki", 1024],
  ];
  for (const [q, v] of cases) t.equal(parseQuantity(q), v, q);
  for (const bad of ["", "Mi", "1MB", "1.2.3", "-"])
    t.ok(Number.isNaN(parseQuantity(bad)), `'${bad}' is not a quantity`);
});

const pod = (spec: Pod["spec"], status?: Pod["status"]): Pod => ({
  metadata: { name: "p", namespace: "n", uid: "u" },
  spec,
  status,
});

t.test("a pod's memory request counts init containers, sidecars and overhead as the kubelet does", async (t) => {
  const r = (m: string) => ({ resources: { requests: { memory: m } } });
  t.equal(podMemoryRequest(pod({ containers: [r("100Mi"), r("200Mi")] })), 300 * 2 ** 20, "sum of containers");
  t.equal(
    podMemoryRequest(pod({ containers: [r("100Mi")], initContainers: [r("500Mi")] })),
    500 * 2 ** 20,
    "a larger init container sets the request",
  );
  t.equal(
    podMemoryRequest(
      pod({
        containers: [r("100Mi")],
        initContainers: [{ ...r("50Mi"), restartPolicy: "Always" }, r("120Mi")],
        overhead: { memory: "10Mi" },
      }),
    ),
    (Math.max(150, 170) + 10) * 2 ** 20,
    "a sidecar runs beside the later init containers and the app; overhead on top",
  );
  t.equal(podMemoryRequest(pod({ containers: [{ name: "x" }] })), 0, "no request");
});

t.test("QoS from status, else from the spec; priority from spec.priority, else the class's known value", async (t) => {
  const c = (req?: Record<string, string>, lim?: Record<string, string>) => ({
    resources: { requests: req, limits: lim },
  });
  t.equal(podQos(pod({ containers: [c()] }, { qosClass: "Guaranteed" })), "Guaranteed");
  t.equal(podQos(pod({ containers: [c()] })), "BestEffort");
  t.equal(
    podQos(pod({ containers: [c(undefined, { cpu: "1", memory: "1Gi" })] })),
    "Guaranteed",
    "requests default to limits",
  );
  t.equal(podQos(pod({ containers: [c({ cpu: "1", memory: "1Gi" }, { cpu: "1", memory: "2Gi" })] })), "Burstable");
  t.equal(podQos(pod({ containers: [c({ memory: "1Gi" }, { memory: "1Gi" })] })), "Burstable", "cpu limit missing");
  t.equal(podPriority(pod({ priority: 5 })), 5);
  t.equal(podPriority(pod({ priorityClassName: "system-node-critical" })), 2_000_001_000);
  t.equal(podPriority(pod({})), 0);
});

t.test("a pod list file: kubectl's List, a single Pod, or a clear error", async (t) => {
  t.equal(podsFromJson(JSON.stringify({ kind: "List", items: [pod({})] }), "f").length, 1);
  t.equal(podsFromJson(JSON.stringify({ ...pod({}), kind: "Pod" }), "f").length, 1);
  t.throws(() => podsFromJson("{", "pods.json"), /pods\.json: not JSON .* 'kubectl get pods -o json'/);
  t.throws(() => podsFromJson(JSON.stringify({ kind: "Node" }), "pods.json"), /expected a pod list/);
});

const MiB = 2 ** 20;
function cg(uid: string, workingSetMi: number, qos: PodCgroup["qos"] = "Burstable"): PodCgroup {
  return {
    uid,
    qos,
    driver: "systemd",
    version: 2,
    rel: uid,
    memoryDir: `/x/${uid}`,
    usage: workingSetMi * MiB,
    workingSet: workingSetMi * MiB,
  };
}
const facts = (uid: string, requestMi: number, priority = 0, qos: PodCgroup["qos"] = "Burstable") => ({
  uid,
  namespace: "ns",
  name: uid,
  labels: {},
  priority,
  request: requestMi * MiB,
  qos,
  neverEvicted: undefined,
  staticUid: undefined,
});

t.test("each rank says what put the pod ahead of the next", async (t) => {
  const pods = new Map([
    ["a", facts("a", 100)], // exceeds by 400
    ["b", facts("b", 100)], // exceeds by 100
    ["c", facts("c", 100, 10)], // exceeds, higher priority
    ["d", facts("d", 1000)], // within request
    ["g", facts("g", 900, 0, "Guaranteed")],
  ]);
  const r = rankCandidates(
    [cg("d", 900), cg("c", 5000), cg("b", 200), cg("a", 500), cg("g", 900, "Guaranteed"), cg("x", 50, "BestEffort")],
    pods,
    DEFAULT_EARLY_OOM,
  );
  t.same(
    r.ranked.map((x) => [x.rank, x.pod?.name ?? x.cgroup.uid]),
    [
      [1, "a"],
      [2, "b"],
      [3, "c"],
      [4, "d"],
      [5, "x"],
      [6, "g"],
    ],
  );
  const why = r.ranked.map((x) => x.reason.split("; ").slice(1).join("; "));
  t.same(why, [
    "more memory above its request than the next",
    "lower priority than the next (0 < 10)",
    "exceeds its request, the next does not",
    "the next has no Pod object",
    "the next is protected",
    "",
  ]);
  t.match(r.ranked[0]?.reason, /^working set 500 MiB > request 100 MiB, priority 0, Burstable, 400 MiB above request/);
  t.match(r.ranked[3]?.reason, /^working set 900 MiB ≤ request 1000 MiB, .*100 MiB under request/);
  t.match(r.ranked[5]?.reason, /protected \(Guaranteed\): only when nothing else is left/);
});

t.test(
  "static and critical pods are never candidates: a mirror pod is matched to its static pod's cgroup",
  async (t) => {
    // What a control-plane node holds: etcd and kube-apiserver from manifests (their cgroups carry
    // the manifest UID, their mirror pods another), one manifest whose mirror pod is not in the API
    // (yet), a cluster-critical Deployment's pod, and one ordinary pod. Before the fix, etcd (the
    // largest, far above its request, no Pod object matched) ranked ahead of every protected pod.
    const etcd = manifestUid();
    const apiserver = manifestUid();
    const orphan = manifestUid();
    const etcdMirror = mirrorPodObject(
      { name: "etcd-cp-1", namespace: "kube-system", qos: "Burstable", workingSetMi: 0, requestMi: 100 },
      etcd,
    );
    etcdMirror.spec = { ...etcdMirror.spec, priority: 2_000_001_000, priorityClassName: "system-node-critical" };
    // A mirror pod written by an older kubelet: config.source only.
    const apiMirror = mirrorPodObject(
      { name: "kube-apiserver-cp-1", namespace: "kube-system", qos: "Burstable", workingSetMi: 0, requestMi: 100 },
      apiserver,
    );
    delete apiMirror.metadata.annotations?.["kubernetes.io/config.mirror"];
    apiMirror.metadata.uid = apiserver;
    const coredns = podObject(
      { name: "coredns", namespace: "kube-system", qos: "Burstable", workingSetMi: 0, requestMi: 70 },
      "c0000000-0000-4000-8000-000000000001",
    );
    coredns.spec = { ...coredns.spec, priorityClassName: "system-cluster-critical" };
    const web = podObject(
      {
        name: "web",
        qos: "Burstable",
        workingSetMi: 0,
        requestMi: 100,
        annotations: { "kubernetes.io/config.source": "api" },
      },
      "a0000000-0000-4000-8000-000000000002",
    );
    const pods = new StaticPods([etcdMirror, apiMirror, coredns, web].map(trimPod)).byUid();
    t.equal(pods.get(etcd)?.name, "etcd-cp-1", "the mirror pod is found by the UID its static pod's cgroup carries");
    const r = rankCandidates(
      [
        cg(etcd, 4000),
        cg(apiserver, 3000),
        cg(orphan, 2000, "BestEffort"),
        cg("c0000000-0000-4000-8000-000000000001", 1000),
        cg("a0000000-0000-4000-8000-000000000002", 200),
      ],
      pods,
      { ...DEFAULT_EARLY_OOM, excludeNamespaces: ["kube-system"] },
    );
    t.same(
      r.ranked.map((x) => x.pod?.name),
      ["web"],
      "only the ordinary pod is a candidate",
    );
    t.same(
      r.excluded.map((e) => podLabel(e)),
      [
        "kube-system/coredns",
        "kube-system/etcd-cp-1",
        "kube-system/kube-apiserver-cp-1",
        `pod ${orphan} (no Pod object)`,
      ],
    );
    const reasons = r.excluded.map((e) => e.reason);
    t.match(
      reasons[0],
      /^critical pod \(priority 2000000000 ≥ 2000000000, system-cluster-critical\): the kubelet never evicts it/,
    );
    t.match(reasons[1], /^static pod \(mirror pod of a manifest on the node\): the kubelet never evicts it/);
    t.match(reasons[2], /^static pod \(config source file\)/);
    t.match(reasons[3], /^static pod \(its cgroup carries a manifest UID; no mirror pod known\)/);
  },
);

t.test("the node's dry run or off wins over the node group's; every other setting is the group's", async (t) => {
  t.same(mergeNodeAndGroup({ dryRun: true }, { dryRun: false, fullStallPercent: 40 }), {
    config: { dryRun: true, fullStallPercent: 40 },
    overruled: ["dryRun: the node runs early OOM in dry-run mode"],
  });
  t.same(mergeNodeAndGroup({ enabled: false }, { enabled: true }), {
    config: { enabled: false },
    overruled: ["enabled: the node turned early OOM off"],
  });
  t.same(
    mergeNodeAndGroup({}, { dryRun: true, enabled: false }).config,
    { dryRun: true, enabled: false },
    "the group can add safety",
  );
  t.same(mergeNodeAndGroup({ dryRun: false, durationMs: 5000 }, { dryRun: true }).config, {
    dryRun: true,
    durationMs: 5000,
  });
  t.same(mergeNodeAndGroup({ dryRun: true }, undefined), { config: { dryRun: true }, overruled: [] });
});

t.test("the trigger: held for the duration, with a second signal; both signals off means PSI alone", async (t) => {
  const cfg = { ...DEFAULT_EARLY_OOM, memAvailablePercent: 0, reclaimPagesPerSecond: 0 };
  const w = {
    spanMs: 1000,
    some: 0.5,
    full: 0.4,
    fullAvg10: 0.1,
    memAvailable: 8e9,
    memTotal: 1e10,
    reclaimPerSecond: 0,
    refaultPerSecond: 0,
  };
  let s = evaluate(CALM, cfg, 0, w, () => 0);
  t.equal(s.phase, "building");
  s = evaluate(s, cfg, 2999, w, () => 0);
  t.equal(s.phase, "building");
  s = evaluate(s, cfg, 3000, w, () => 0);
  t.equal(s.phase, "met");
  t.match(s.reason, /none required/);
  t.equal(evaluate(s, cfg, 3250, { ...w, full: 0.29 }, () => 0).phase, "calm", "one sample below resets");
});

t.test("settings: the defaults are valid, and every bad value is named", async (t) => {
  t.same(resolveEarlyOomConfig(undefined), DEFAULT_EARLY_OOM);
  t.same(resolveEarlyOomConfig({ durationMs: 5000 }).durationMs, 5000);
  t.throws(() => resolveEarlyOomConfig({ windowMs: 100, sampleIntervalMs: 250 }), /windowMs \(100\) must be at least/);
  t.throws(() => resolveEarlyOomConfig({ fallback: "panic" as "none" }), /fallback must be "sysrq" or "none"/);
  t.throws(() => resolveEarlyOomConfig({ dryRun: "yes" as unknown as boolean }), /dryRun must be true or false/);
  t.throws(() => resolveEarlyOomConfig([] as unknown as undefined), /must be an object/);
});

t.test("the metrics endpoint: /metrics in Prometheus text, JSON documents, nothing else", async (t) => {
  t.same(parseAddress("127.0.0.1:9650"), { host: "127.0.0.1", port: 9650 });
  t.same(parseAddress(":9650"), { host: "127.0.0.1", port: 9650 }, "no host: loopback");
  t.same(parseAddress("[::1]:80"), { host: "::1", port: 80 });
  t.throws(() => parseAddress("9650"), /HOST:PORT/);
  t.throws(() => parseAddress("x:70000"), /HOST:PORT/);

  const registry = new Registry();
  registry.counter("bashible_test_total", "a test counter").inc({ a: "b" });
  const s = await startMetricsServer({
    registry,
    address: "127.0.0.1:0",
    log: captureLogger(),
    json: { "/x": () => ({ y: 1 }) },
  });
  t.teardown(() => s.close());
  const base = `http://127.0.0.1:${s.port}`;
  const m = await fetch(`${base}/metrics`);
  t.equal(m.headers.get("content-type"), "text/plain; version=0.0.4; charset=utf-8");
  t.equal(
    await m.text(),
    '# HELP bashible_test_total a test counter\n# TYPE bashible_test_total counter\nbashible_test_total{a="b"} 1\n',
  );
  t.same(await (await fetch(`${base}/x`)).json(), { y: 1 });
  t.equal((await fetch(`${base}/nope`)).status, 404);
  t.equal((await fetch(`${base}/metrics`, { method: "POST" })).status, 405);
});
