// What the node software steps write, as pure functions of their spec and the machine: the
// reservation the kubelet gets, the labels it may register, containerd's two configuration
// versions, the proxy's balancing, and which values are secrets.
import t from "tap";
import { kubeletMaySetLabel } from "../../bundles/names.ts";
import type { ContainerdSpec } from "../../bundles/types.ts";
import { renderUnit as kubeletUnit } from "../../steps/kubelet.ts";
import { autoReservedMemoryBytes } from "../../steps/lib/kubelet-sizing.ts";
import {
  canLowerOomScores,
  credentials,
  renderConfig as containerdConfig,
  renderHosts,
} from "../../steps/containerd.ts";
import { renderConfig as proxyConfig } from "../../steps/kubernetes-api-proxy.ts";

const GI = 1024 ** 3;

t.test("Auto reservation is Deckhouse's: 831 Mi of 16 GiB, 1814 Mi of 64 GiB, in bytes", async (t) => {
  const mi = (gib: number) => autoReservedMemoryBytes(gib * GI) / 2 ** 20;
  t.equal(Math.round(mi(16)), 831);
  t.equal(Math.round(mi(64)), 1814);
  t.equal(autoReservedMemoryBytes(16 * GI), 871114998, "awk's six digits, then Decimal's rounding");
  t.equal(autoReservedMemoryBytes(2 * GI), Math.round(2048 * 0.08 * 2 ** 20), "8 % below 4 GiB");
  t.ok(mi(256) > mi(128) && mi(128) > mi(64), "grows with the machine");
});

t.test("the kubelet may register its own labels, not the cluster's kubernetes.io ones", async (t) => {
  for (const ok of [
    "node.deckhouse.io/group",
    "example.com/team",
    "plain",
    "node.kubernetes.io/pool",
    "kubelet.kubernetes.io/x",
    "topology.kubernetes.io/zone",
    "kubernetes.io/hostname",
  ]) {
    t.ok(kubeletMaySetLabel(ok), ok);
  }
  for (const no of ["node-role.kubernetes.io/worker", "kubernetes.io/role", "k8s.io/x", "foo.k8s.io/y"]) {
    t.notOk(kubeletMaySetLabel(no), no);
  }
});

const spec: ContainerdSpec = {
  cgroupDriver: "cgroupfs",
  sandboxImage: "registry.example.com/pause:3.10",
  snapshotter: "overlayfs",
  maxConcurrentDownloads: 5,
  registries: [
    {
      host: "registry.example.com",
      scheme: "https",
      auth: Buffer.from("user:pa55word").toString("base64"),
      mirrors: [],
    },
  ],
  package: "containerd",
};

t.test("containerd 1.x gets configuration version 2, 2.x version 3", async (t) => {
  const v2 = containerdConfig(spec, { major: 1, minor: 7, text: "1.7.24" });
  t.match(v2, /^version = 2$/m);
  t.match(v2, /sandbox_image = "registry\.example\.com\/pause:3\.10"/);
  t.match(v2, /SystemdCgroup = false/, "cgroupfs");
  t.match(v2, /\[plugins\."io\.containerd\.grpc\.v1\.cri"\.registry\.configs\."registry\.example\.com"\.auth\]/);
  t.match(v2, /max_concurrent_downloads = 5/);
  const v3 = containerdConfig(spec, { major: 2, minor: 1, text: "2.1.4" });
  t.match(v3, /^version = 3$/m);
  t.match(v3, /\[plugins\."io\.containerd\.cri\.v1\.images"\.pinned_images\]\n {6}sandbox = /);
  t.match(v3, /bin_dirs = \["\/opt\/cni\/bin"\]/, "2.1 reads bin_dirs");
  t.match(containerdConfig(spec, { major: 2, minor: 0, text: "2.0.5" }), /bin_dir = "\/opt\/cni\/bin"/, "2.0 bin_dir");
  t.notMatch(v3, /sandbox_image/, "version 3 pins the sandbox image instead");
  t.notMatch(v3, /grpc\.v1\.cri"\.registry/, "and keeps registries in the images plugin");
});

t.test("where CAP_SYS_RESOURCE is missing, containerd keeps OOM scores at or above its own", async (t) => {
  const v1 = { major: 1, minor: 6, text: "1.6.20" };
  const v2 = { major: 2, minor: 1, text: "2.1.4" };
  t.match(
    containerdConfig(spec, v1),
    /restrict_oom_score_adj = false/,
    "a machine that may lower scores: Deckhouse's false",
  );
  const restricted1 = containerdConfig(spec, v1, { canLowerOomScores: false });
  t.match(
    restricted1,
    /\[plugins\."io\.containerd\.grpc\.v1\.cri"\]\n(?: {4}\S.*\n)* {4}restrict_oom_score_adj = true\n/,
  );
  const restricted2 = containerdConfig(spec, v2, { canLowerOomScores: false });
  t.match(
    restricted2,
    /\[plugins\."io\.containerd\.cri\.v1\.runtime"\]\n(?: {4}\S.*\n)* {4}restrict_oom_score_adj = true\n/,
  );
  t.equal(typeof (await canLowerOomScores()), "boolean", "read from the machine (PID 1's bounding set)");
});

t.test("registry credentials are secrets, in every form they take", async (t) => {
  t.same(
    credentials(spec).sort(),
    [Buffer.from("user:pa55word").toString("base64"), "pa55word", "user:pa55word"].sort(),
  );
  t.same(credentials({ ...spec, registries: [] }), []);
});

t.test("hosts.toml: mirrors first, in order, with the registry's CA", async (t) => {
  const text = renderHosts(
    { host: "r.example.com:5000", scheme: "https", mirrors: ["https://m1.example.com", "http://m2:8080/v2"] },
    "/etc/containerd/registry.d/r.example.com:5000/ca.crt",
  );
  t.match(text, /^server = "https:\/\/r\.example\.com:5000"$/m);
  t.ok(text.indexOf("m1.example.com") < text.indexOf("m2:8080"));
  t.equal(text.match(/ca = /g)?.length, 3, "server and both mirrors");
});

t.test("the API proxy balances by least connections and marks failures passively", async (t) => {
  const c = proxyConfig({ listen: "127.0.0.1:6445", upstreams: ["10.0.0.1:6443", "10.0.0.2:6443"] }, undefined);
  t.notMatch(c, /load_module/, "a built-in stream module is not loaded");
  t.match(c, /least_conn;\n {4}server 10\.0\.0\.1:6443 max_fails=2 fail_timeout=10s;\n {4}server 10\.0\.0\.2:6443/);
  t.match(c, /proxy_connect_timeout 1s;/);
  t.match(proxyConfig({ listen: "127.0.0.1:6445", upstreams: ["a:1"] }, "/m.so"), /^load_module \/m\.so;$/m);
});

t.test("the kubelet unit names the binary, the node, its labels and taints", async (t) => {
  const unit = kubeletUnit(
    {
      cgroupDriver: "systemd",
      clusterDNS: [],
      clusterDomain: "cluster.local",
      maxPods: 110,
      containerLogMaxSize: "10Mi",
      containerLogMaxFiles: 2,
      nodeStatusUpdateFrequencySeconds: 10,
      resourceReservation: { mode: "Off" },
      featureGates: {},
      rootDir: "/data/kubelet",
      registerLabels: {},
      registerTaints: [
        { key: "a", effect: "NoSchedule" },
        { key: "b", value: "c", effect: "NoExecute" },
      ],
      apiServer: "https://127.0.0.1:6445",
      package: "kubelet",
    },
    { stamp: "package kubelet sha256:x", nodeName: "n-1", labels: { z: "1", a: "2" }, nodeIP: "10.1.2.3" },
  );
  t.match(unit, "# Binary: package kubelet sha256:x");
  t.match(unit, "--node-labels=a=2,z=1");
  t.match(unit, "--register-with-taints=a:NoSchedule,b=c:NoExecute");
  t.match(unit, "--root-dir=/data/kubelet");
  t.match(unit, "--hostname-override=n-1");
  t.match(
    unit,
    "--node-ip=10.1.2.3 \\\n    --address=10.1.2.3",
    "the discovered address: InternalIP and where it listens",
  );
});
