// The kubelet and containerd a node gets here for a set of NodeGroups, rendered the way the
// server and the node render them (the renderer's spec, then the step's files for a fixed
// machine), compared with the values docs/steps.md's Deckhouse table names. The table itself
// is checked for completeness: every setting written here has its row.
import t from "tap";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { loadConfigDir } from "../../cluster/sources/directory.ts";
import { renderGroup } from "../../cluster/render/render.ts";
import type { NodeGroupObject, RenderInputs } from "../../cluster/render/inputs.ts";
import type { ContainerdSpec, KubeletSpec } from "../../bundles/types.ts";
import { kubeletConfig, type MachineFacts, renderUnit, TLS_CIPHER_SUITES } from "../../steps/kubelet.ts";
import { baseConfig, renderConfig, renderCrictl } from "../../steps/containerd.ts";
import { isTable, lookup, type TomlTable } from "../../steps/lib/toml.ts";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const base = (await loadConfigDir(path.join(ROOT, "examples/cluster"))).snapshot.inputs as RenderInputs;
const NOW = Date.parse("2026-01-01T00:00:00Z");
const GI = 1024 ** 3;
const table = await readFile(path.join(ROOT, "docs/steps.md"), "utf8");

/** A 16 GiB machine with a 500 GB disk for the kubelet and a 50 GB one for containerd's images. */
const MACHINE: MachineFacts = {
  cgroupV1: false,
  memoryBytes: 16 * GI,
  nodefs: { sizeKiB: 500_000_000, inodes: 30_000_000 },
  imagefs: { sizeKiB: 50_000_000, inodes: 3_000_000 },
};
const NODE = { resolvConf: "/etc/resolv.conf" };

function render(edit: (ng: NodeGroupObject, i: RenderInputs) => void = () => {}) {
  const i = structuredClone(base);
  const ng = i.nodeGroups.find((g) => g.metadata.name === "worker") as NodeGroupObject;
  edit(ng, i);
  const r = renderGroup(ng, i, NOW);
  const spec = <K extends string>(kind: K) => r.bundle.steps.find((s) => s.kind === kind)?.spec;
  return {
    checksum: r.checksum,
    kubelet: spec("Kubelet") as KubeletSpec,
    containerd: spec("Containerd") as ContainerdSpec | undefined,
  };
}
const config = (k: KubeletSpec, m: MachineFacts = MACHINE) => kubeletConfig(k, m, NODE);

t.test("a Static group with nothing set: Deckhouse's kubelet for this machine", async (t) => {
  const { kubelet } = render();
  const c = config(kubelet);
  t.match(c, {
    cgroupRoot: "/",
    cgroupsPerQOS: true,
    cgroupDriver: "systemd",
    clusterDomain: "cluster.local",
    clusterDNS: ["10.222.0.10"],
    cpuManagerReconcilePeriod: "10s",
    enforceNodeAllocatable: ["pods"],
    eventRecordQPS: 50,
    eventBurst: 50,
    evictionPressureTransitionPeriod: "4m0s",
    evictionMaxPodGracePeriod: 90,
    failSwapOn: true,
    serverTLSBootstrap: true,
    featureGates: { RotateKubeletServerCertificate: true },
    fileCheckFrequency: "20s",
    imageMinimumGCAge: "2m0s",
    imageGCHighThresholdPercent: 70,
    imageGCLowThresholdPercent: 65,
    kubeAPIBurst: 50,
    kubeAPIQPS: 50,
    hairpinMode: "promiscuous-bridge",
    httpCheckFrequency: "20s",
    maxOpenFiles: 1000000,
    maxPods: 120,
    nodeStatusUpdateFrequency: "10s",
    podsPerCore: 0,
    podPidsLimit: -1,
    readOnlyPort: 0,
    registryPullQPS: 10,
    registryBurst: 20,
    resolvConf: "/etc/resolv.conf",
    rotateCertificates: true,
    runtimeRequestTimeout: "2m0s",
    serializeImagePulls: true,
    syncFrequency: "1m0s",
    volumeStatsAggPeriod: "1m0s",
    healthzBindAddress: "127.0.0.1",
    healthzPort: 10248,
    protectKernelDefaults: true,
    containerLogMaxSize: "50Mi",
    containerLogMaxFiles: 4,
    allowedUnsafeSysctls: ["net.*"],
    shutdownGracePeriod: "2m",
    shutdownGracePeriodCriticalPods: "15s",
    providerID: "static://",
  });
  t.same(c.tlsCipherSuites, TLS_CIPHER_SUITES);
  t.equal(TLS_CIPHER_SUITES.length, 8);
  t.same(c.systemReserved, { cpu: "70m", memory: "871114998", "ephemeral-storage": "1Gi" }, "16 GiB: 831 Mi");
  t.same(c.evictionHard, {
    "imagefs.available": "5%",
    "imagefs.inodesFree": "5%",
    "memory.available": "171798692",
    "nodefs.available": "20G",
    "nodefs.inodesFree": "1220k",
  });
  t.same(c.evictionSoft, {
    "imagefs.available": "10%",
    "imagefs.inodesFree": "10%",
    "memory.available": "343597384",
    "nodefs.available": "40G",
    "nodefs.inodesFree": "2440k",
  });
  t.notOk("cpuManagerPolicy" in c || "failCgroupV1" in c || "memorySwap" in c);
  const unit = renderUnit(kubelet, {
    stamp: "s",
    nodeName: "worker-1",
    labels: kubelet.registerLabels,
    nodeIP: "10.0.0.5",
  });
  t.match(unit, "--node-labels=node.deckhouse.io/group=worker,node.deckhouse.io/type=Static");
  t.match(unit, "--register-with-taints=node.deckhouse.io/bashible-uninitialized:NoSchedule");
  t.match(unit, "--node-ip=10.0.0.5");
  t.match(unit, "--address=10.0.0.5");
  t.match(unit, "--v=2");
  t.notMatch(unit, "--cloud-provider");
});

t.test("Auto reservation by the machine's size: 64 GiB reserves 1814 Mi", async (t) => {
  const c = config(render().kubelet, { ...MACHINE, memoryBytes: 64 * GI });
  t.same(c.systemReserved, { cpu: "70m", memory: "1902158807", "ephemeral-storage": "1Gi" });
  t.equal(
    (c.evictionHard as Record<string, string>)["memory.available"],
    String(Math.round(64 * 1024 * 2 ** 20 * 0.01)),
  );
});

t.test("resourceReservation Static and Off", async (t) => {
  const statik = render((ng) => {
    ng.spec.kubelet = {
      resourceReservation: { mode: "Static", static: { cpu: "500m", memory: "1Gi", ephemeralStorage: "10Gi" } },
    };
  });
  t.same(config(statik.kubelet).systemReserved, { cpu: "500m", memory: "1073741824", "ephemeral-storage": "10Gi" });
  const off = render((ng) => {
    ng.spec.kubelet = { resourceReservation: { mode: "Off" } };
  });
  t.notOk("systemReserved" in config(off.kubelet));
});

t.test("topologyManager turns on the static CPU and memory managers with NUMA node 0's reservation", async (t) => {
  const { kubelet } = render((ng) => {
    ng.spec.kubelet = { topologyManager: { enabled: true, policy: "SingleNumaNode", scope: "Pod" } };
  });
  t.match(config(kubelet), {
    cpuManagerPolicy: "static",
    memoryManagerPolicy: "Static",
    reservedMemory: [{ numaNode: 0, limits: { memory: String(871114998 + 171798692) } }],
    topologyManagerScope: "pod",
    topologyManagerPolicy: "single-numa-node",
    featureGates: { MemoryManager: true, RotateKubeletServerCertificate: true },
  });
});

t.test("maxPods from the pod subnet per node, unless the NodeGroup says", async (t) => {
  for (const [prefix, pods] of [
    ["26", 120],
    ["24", 120],
    ["23", 250],
    ["22", 500],
    ["21", 1000],
    ["16", 1000],
  ] as const) {
    const { kubelet } = render((_ng, i) => {
      i.context.podSubnetNodeCIDRPrefix = prefix;
    });
    t.equal(kubelet.maxPods, pods, `/${prefix}: ${pods}`);
  }
  t.equal(render((ng) => (ng.spec.kubelet = { maxPods: 60 })).kubelet.maxPods, 60);
  t.throws(
    () =>
      render((_ng, i) => {
        i.context.podSubnetNodeCIDRPrefix = "/24";
      }),
    /podSubnetNodeCIDRPrefix '\/24' is not a prefix length/,
  );
});

t.test("CloudStatic, a CRI of its own, the context's status frequency and feature gates", async (t) => {
  const cloud = render((ng) => {
    ng.spec.nodeType = "CloudStatic";
  });
  t.notOk("providerID" in config(cloud.kubelet), "static:// only on Static nodes");
  t.equal(cloud.kubelet.registerLabels["node.deckhouse.io/type"], "CloudStatic");
  const other = render((ng, i) => {
    ng.spec.cri = { type: "NotManaged", notManaged: { criSocketPath: "/run/crio/crio.sock" } };
    i.context.nodeStatusUpdateFrequency = 4;
    i.context.kubelet = { featureGates: { RotateKubeletServerCertificate: false } };
  });
  t.equal(other.containerd, undefined, "no containerd step");
  t.match(config(other.kubelet, { ...MACHINE, imagefs: undefined }), {
    containerRuntimeEndpoint: "unix:///run/crio/crio.sock",
    nodeStatusUpdateFrequency: "4s",
    featureGates: { RotateKubeletServerCertificate: false },
    evictionHard: { "imagefs.available": "5%" },
  });
});

t.test("a nodeTemplate edit changes no bundle: no kubelet restarts for it", async (t) => {
  const before = render();
  const after = render((ng) => {
    ng.spec.nodeTemplate = {
      labels: { "example.com/team": "b" },
      annotations: { "example.com/note": "x" },
      taints: [{ key: "dedicated", value: "db", effect: "NoSchedule" }],
    };
  });
  t.same(after.kubelet, before.kubelet, "the kubelet's spec is the same");
  t.equal(after.checksum, before.checksum, "and so is the bundle: the nodes have nothing to do");
});

t.test("containerd: Deckhouse's configuration with this group's values", async (t) => {
  const { containerd } = render((ng, i) => {
    ng.spec.cri = { type: "Containerd", containerd: { maxConcurrentDownloads: 5 } };
    i.context.proxy = { httpProxy: "http://proxy.example.com:3128", noProxy: [".corp.example.com"] };
  });
  const spec = containerd as ContainerdSpec;
  t.same(spec.proxy, {
    httpProxy: "http://proxy.example.com:3128",
    noProxy: ["127.0.0.1", "169.254.169.254", "cluster.local", ".corp.example.com"],
  });
  const v1 = baseConfig(spec, { major: 1, minor: 7, text: "1.7.27" });
  const cri = lookup(v1, ["plugins", "io.containerd.grpc.v1.cri"]) as TomlTable;
  t.match(cri, {
    disable_tcp_service: true,
    stream_server_address: "127.0.0.1",
    stream_server_port: "0",
    stream_idle_timeout: "4h0m0s",
    sandbox_image: "registry.k8s.io/pause:3.10",
    stats_collect_period: 10n,
    max_container_log_line_size: 16384n,
    restrict_oom_score_adj: false,
    max_concurrent_downloads: 5n,
    tolerate_missing_hugetlb_controller: true,
    disable_hugetlb_controller: true,
    device_ownership_from_security_context: true,
    containerd: { snapshotter: "overlayfs", disable_snapshot_annotations: true, discard_unpacked_layers: true },
    cni: { bin_dir: "/opt/cni/bin", conf_dir: "/etc/cni/net.d", max_conf_num: 1n },
    registry: { config_path: "/etc/containerd/registry.d" },
  });
  t.equal(lookup(v1, ["plugins", "io.containerd.gc.v1.scheduler", "pause_threshold"]), 0.02);
  t.equal(lookup(v1, ["grpc", "max_recv_message_size"]), 16777216n);
  const v2 = baseConfig(spec, { major: 2, minor: 1, text: "2.1.4" });
  t.match(lookup(v2, ["plugins", "io.containerd.cri.v1.runtime"]), {
    device_ownership_from_security_context: true,
    enable_unprivileged_ports: true,
    enable_unprivileged_icmp: true,
    enable_cdi: true,
  });
  t.match(lookup(v2, ["plugins", "io.containerd.cri.v1.images", "pinned_images"]), {
    sandbox: "registry.k8s.io/pause:3.10",
  });
  t.match(renderConfig(spec, { major: 1, minor: 7, text: "1.7.27" }), /^version = 2$/m);
  t.match(renderCrictl(), /^runtime-endpoint: unix:\/\/\/run\/containerd\/containerd\.sock$/m);
});

/** Every key of a table, as dotted paths of plain keys (plugin names kept whole). */
function keys(tbl: TomlTable, prefix = ""): string[] {
  return Object.entries(tbl).flatMap(([k, v]) =>
    isTable(v) && !/^\d/.test(k) ? [`${prefix}${k}`, ...keys(v, "")] : [`${prefix}${k}`],
  );
}

t.test("docs/steps.md's Deckhouse table has a row for every setting written here", async (t) => {
  const section = table.slice(table.indexOf("## The kubelet and containerd, against Deckhouse"));
  t.ok(section.length < table.length, "the section exists");
  const rows = section.slice(0, section.indexOf("\n## ", 5));
  const named = (k: string) => rows.includes(`\`${k}\``);
  const topology = render((ng) => {
    ng.spec.kubelet = {
      topologyManager: { enabled: true },
      memorySwap: { swapBehavior: "LimitedSwap", limitedSwap: { size: "4G" } },
      seccompDefault: true,
    };
  }).kubelet;
  const kubeletKeys = new Set([
    ...Object.keys(config(render().kubelet, { ...MACHINE, cgroupV1: true })),
    ...Object.keys(config(topology)),
  ]);
  for (const k of [...kubeletKeys].filter((k) => k !== "apiVersion" && k !== "kind")) t.ok(named(k), `kubelet ${k}`);
  const spec = render().containerd as ContainerdSpec;
  const v1 = baseConfig(spec, { major: 1, minor: 7, text: "1.7.27" });
  const v2 = baseConfig(spec, { major: 2, minor: 1, text: "2.1.4" });
  const ctdKeys = new Set([...keys(v1), ...keys(v2)].filter((k) => !k.startsWith("io.containerd.")));
  for (const k of ctdKeys) t.ok(named(k), `containerd ${k}`);
});
