// The renderer through its public surface: inputs from the example config dir in, served
// objects out. Determinism, what changes the checksum and what does not, and clear errors.
import t from "tap";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { loadConfigDir } from "../../cluster/sources/directory.ts";
import { renderAll, renderGroup, serialize } from "../../cluster/render/render.ts";
import { RenderError } from "../../cluster/render/errors.ts";
import type { NodeGroupObject, RenderInputs } from "../../cluster/render/inputs.ts";
import { EPOCH_SECONDS, updateEpoch, nextEpochChangeMs } from "../../cluster/render/update-epoch.ts";
import { bundleChecksum } from "../../bundles/checksum.ts";
import { acceptBundle } from "../../bundles/verify.ts";

const EXAMPLE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../examples/cluster");
const loaded = await loadConfigDir(EXAMPLE);
const base = loaded.snapshot.inputs as RenderInputs;
const NOW = Date.parse("2026-01-01T00:00:00Z");
const worker = () => structuredClone(base.nodeGroups.find((g) => g.metadata.name === "worker")!) as NodeGroupObject;
const inputs = (patch: Partial<RenderInputs> = {}): RenderInputs => ({ ...structuredClone(base), ...patch });
const render = (i: RenderInputs, ng = i.nodeGroups[0]!, now = NOW) => renderGroup(ng, i, now);

const step = <K extends string>(r: ReturnType<typeof render>, kind: K) => {
  const found = r.bundle.steps.find((s) => s.kind === kind);
  if (!found) throw new Error(`no ${kind} step`);
  return found as Extract<(typeof r.bundle.steps)[number], { kind: K }>;
};

t.test("the example renders the built-in steps and the NGC in name order", async (t) => {
  const r = render(inputs());
  t.same(
    r.bundle.steps.map((s) => `${s.name}:${s.kind}`),
    [
      "000_add_mandatory_packages:DistributionPackages",
      "000_add_node_users:NodeUsers",
      "000_configure_kubernetes_api_proxy:KubernetesApiProxy",
      "000_discover_node_ip:NodeIp",
      "003_disable_rp_filter:RpFilter",
      "003_disable_swap:Swap",
      "003_install_ca_certificates:CACertificates",
      "004_add_deckhouse_paths:DeckhousePath",
      "004_check_hostname:HostnameCheck",
      "004_load_mandatory_modules:KernelModules",
      "005_disable_manage_iprules:NetworkdIpRules",
      "007_fetch_registry_packages:RegistryPackages",
      "032_configure_containerd:Containerd",
      "041_configure_sysctl_tuner:SysctlTuner",
      "050_sysctl-tuning:Script",
      "064_check_hostname_uniqueness:HostnameUniqueness",
      "064_configure_kubelet:Kubelet",
      "069_start_kubelet:KubeletStart",
      "080_setup_bashible_service:BashibleService",
      "083_disable_rsyslog_for_kubelet:RsyslogKubeletFilter",
      "084_configure_journald:Journald",
      "085_rotate_bashible_logs:LogRotation",
      "098_cleanup:BootstrapCleanup",
      "098_set_permissions:FilePermissions",
    ],
  );
  const script = step(r, "Script");
  t.match(script.spec.script, /tuning sysctls/);
  const templated = inputs();
  templated.configurations[0]!.spec.content = 'echo "tuning node group {{ .nodeGroup.name }}"';
  t.match(step(render(templated), "Script").spec.script, /tuning node group worker/, "Go template rendered");
  t.equal(r.checksum, bundleChecksum(r.bundle));
  t.match(r.checksum, /^[0-9a-f]{64}$/);
  t.equal(r.bundle.metadata.annotations?.["bashible.deckhouse.io/configuration-checksum"], r.checksum);
  t.same(
    step(r, "RegistryPackages").spec.packages.map((p) => `${p.name}@${p.repository}`),
    ["containerd@deckhouse/ce/packages", "kubelet@deckhouse/ce/packages"],
    "the agent is not installed by 007: 080 checks it first",
  );
  const agent = step(r, "BashibleService").spec;
  t.equal(agent.agent.name, "bashible");
  t.equal(
    agent.cleanupScript,
    (r.bashible.data as Record<string, string>)["cleanup_static_node.sh"],
    "the cleanup script bashibles serves",
  );
  t.same(step(r, "KubernetesApiProxy").spec, { listen: "127.0.0.1:6445", upstreams: ["127.0.0.1:6443"] });
});

t.test("NodeGroup kubelet and cri reach the kubelet and containerd steps; nodeTemplate reaches neither", async (t) => {
  const ng = worker();
  ng.spec.kubelet = {
    maxPods: 42,
    containerLogMaxSize: "10Mi",
    containerLogMaxFiles: 7,
    rootDir: "/data/kubelet",
    resourceReservation: { mode: "Static", static: { cpu: "500m", memory: "1Gi" } },
  };
  ng.spec.cri = { type: "Containerd", containerd: { maxConcurrentDownloads: 9 } };
  ng.spec.nodeTemplate = {
    labels: { "example.com/team": "a", "node-role.kubernetes.io/worker": "", "node.kubernetes.io/pool": "p1" },
    taints: [{ key: "dedicated", value: "db", effect: "NoExecute" }],
  };
  const i = inputs({ nodeGroups: [ng] });
  i.context.kubelet = { featureGates: { MemoryQoS: true } };
  i.context.registry = {
    ...i.context.registry!,
    auth: Buffer.from("puller:s3cret").toString("base64"),
    mirrors: ["https://mirror.example.com"],
  };
  const r = render(i, ng);
  const k = step(r, "Kubelet").spec;
  t.equal(k.maxPods, 42);
  t.equal(k.containerLogMaxSize, "10Mi");
  t.equal(k.containerLogMaxFiles, 7);
  t.equal(k.rootDir, "/data/kubelet");
  t.same(k.resourceReservation, { mode: "Static", static: { cpu: "500m", memory: "1Gi" } });
  t.same(k.featureGates, { MemoryQoS: true });
  t.same(
    k.registerLabels,
    { "node.deckhouse.io/group": "worker", "node.deckhouse.io/type": ng.spec.nodeType },
    "the kubelet registers the group and type; the cluster side keeps nodeTemplate on the Node",
  );
  t.same(k.registerTaints, [{ key: "node.deckhouse.io/bashible-uninitialized", effect: "NoSchedule" }]);
  t.notMatch(JSON.stringify(r.bundle), /example\.com\/team|dedicated/, "nothing of nodeTemplate is in the bundle");
  const c = step(r, "Containerd").spec;
  t.equal(c.maxConcurrentDownloads, 9);
  t.equal(c.cgroupDriver, k.cgroupDriver, "containerd and the kubelet use one cgroup driver");
  t.same(
    c.registries.map((x) => [x.host, x.auth !== undefined, x.mirrors]),
    [["registry.example.com", true, ["https://mirror.example.com"]]],
  );
});

t.test(
  "kubelet extras: seccomp, topology manager, swap, static reservation numbers, a CRI socket of its own",
  async (t) => {
    const ng = worker();
    ng.spec.kubelet = {
      seccompDefault: true,
      topologyManager: { enabled: true, policy: "SingleNumaNode", scope: "Pod" },
      memorySwap: { swapBehavior: "LimitedSwap", limitedSwap: { size: "2G" } },
      resourceReservation: { mode: "Static", static: { cpu: 1, memory: "2Gi" } },
    };
    ng.spec.cri = { type: "NotManaged", notManaged: { criSocketPath: "/run/crio/crio.sock" } };
    const k = step(render(inputs({ nodeGroups: [ng] }), ng), "Kubelet").spec;
    t.equal(k.seccompDefault, true);
    t.same(k.topologyManager, { policy: "single-numa-node", scope: "pod" });
    t.equal(k.swapBehavior, "LimitedSwap");
    t.same(k.resourceReservation.static, { cpu: "1", memory: "2Gi" });
    t.equal(k.criSocket, "/run/crio/crio.sock");
    ng.spec.kubelet = { topologyManager: { enabled: false, policy: "Restricted" } };
    t.notOk(step(render(inputs({ nodeGroups: [ng] }), ng), "Kubelet").spec.topologyManager, "disabled: left out");
  },
);

t.test("cri.type picks the containerd package; NotManaged leaves containerd alone", async (t) => {
  const i = inputs();
  i.context.packages.containerd2 = { digest: `sha256:${"4".repeat(64)}` };
  const pkgs = (r: ReturnType<typeof render>) => step(r, "RegistryPackages").spec.packages.map((p) => p.name);
  const ng = worker();
  t.same(pkgs(render(i, ng)), ["containerd", "kubelet"]);
  ng.spec.cri = { type: "ContainerdV2" };
  const v2 = render(i, ng);
  t.same(pkgs(v2), ["containerd2", "kubelet"]);
  t.equal(step(v2, "Containerd").spec.package, "containerd2");
  ng.spec.cri = { type: "NotManaged" };
  const none = render(i, ng);
  t.same(pkgs(none), ["kubelet"]);
  t.notOk(
    none.bundle.steps.some((s) => s.kind === "Containerd"),
    "no containerd step",
  );
  t.ok(
    none.bundle.steps.some((s) => s.kind === "Kubelet"),
    "the kubelet is still managed",
  );
});

t.test("without a kubelet package there are no kubelet steps and no API proxy", async (t) => {
  const i = inputs();
  delete i.context.packages.kubelet;
  const kinds = render(i).bundle.steps.map((s) => s.kind);
  t.notOk(kinds.includes("Kubelet") || kinds.includes("KubeletStart") || kinds.includes("KubernetesApiProxy"));
  t.ok(kinds.includes("BashibleService"));
});

t.test("a bad kubelet setting is refused naming the NodeGroup", async (t) => {
  const ng = worker();
  ng.spec.kubelet = { containerLogMaxSize: "ten megabytes" };
  t.throws(() => render(inputs({ nodeGroups: [ng] }), ng), {
    name: "RenderError",
    message: /NodeGroup\/worker .*containerLogMaxSize/,
  });
});

t.test("same inputs give byte-identical output, whatever the input order", async (t) => {
  const a = render(inputs());
  const shuffled = inputs();
  shuffled.users.push({
    metadata: { name: "bob" },
    spec: { uid: 1200, sshPublicKeys: ["ssh-ed25519 AAAA bob"] },
  });
  const ordered = inputs({ users: [...shuffled.users].reverse() });
  t.equal(serialize(render(shuffled).bundle), serialize(render(ordered).bundle));
  t.equal(serialize(render(inputs()).bundle), serialize(a.bundle));
  t.equal(serialize(render(inputs()).bootstrap), serialize(a.bootstrap));
});

t.test("scaling a group does not change its checksum; its approval mode does", async (t) => {
  const before = render(inputs()).checksum;
  const scaled = worker();
  scaled.spec.staticInstances = { count: 7 };
  scaled.spec.cloudInstances = { minPerZone: 1, maxPerZone: 9 };
  scaled.spec.update = { maxConcurrent: 3 };
  t.equal(render(inputs(), scaled).checksum, before);
  const manual = worker();
  manual.spec.disruptions = { approvalMode: "Manual" };
  t.not(render(inputs(), manual).checksum, before);
});

t.test("a NodeUser or NGC change changes only the groups it selects", async (t) => {
  const other: NodeGroupObject = { metadata: { name: "frontend" }, spec: { nodeType: "CloudEphemeral" } };
  const i = inputs({ nodeGroups: [worker(), other] });
  const before = renderAll(i, NOW);
  const j = inputs({ nodeGroups: [worker(), other] });
  j.configurations[0]!.spec.content += "echo more\n"; // selects worker only
  const after = renderAll(j, NOW);
  t.not(after.groups.get("worker")!.checksum, before.groups.get("worker")!.checksum);
  t.equal(after.groups.get("frontend")!.checksum, before.groups.get("frontend")!.checksum);
});

t.test("the checksum changes once per 4 hours, at a different moment for each group", async (t) => {
  const uuid = base.context.clusterUUID;
  const changes = (group: string) => {
    const seen: number[] = [];
    let prev = updateEpoch(uuid, group, NOW);
    for (let m = 1; m <= 8 * 60; m++) {
      const e = updateEpoch(uuid, group, NOW + m * 60_000);
      if (e !== prev) seen.push(m);
      prev = e;
    }
    return seen;
  };
  const w = changes("worker");
  const f = changes("frontend");
  t.equal(w.length, 2, "two changes in 8 hours");
  t.equal(w[1]! - w[0]!, 240, "4 hours apart");
  t.not(w[0], f[0], "groups are staggered");
  const next = nextEpochChangeMs(uuid, "worker", NOW);
  t.equal(Math.ceil((next - NOW) / 60_000), w[0], "the server knows when to re-render");
  t.ok(next - NOW <= EPOCH_SECONDS * 1000);
  const a = render(inputs(), worker(), NOW);
  const b = render(inputs(), worker(), next);
  t.not(a.checksum, b.checksum);
  t.equal(render(inputs(), worker(), next - 1).checksum, a.checksum);
});

const renderErr = (i: RenderInputs, ng?: NodeGroupObject) => {
  try {
    render(i, ng);
  } catch (err) {
    return err as RenderError;
  }
  throw new Error("expected a RenderError");
};

t.test("bad input gives an error naming the object", async (t) => {
  const bad = renderErr(inputs(), { metadata: { name: "Bad_Name" }, spec: { nodeType: "Static" } });
  t.type(bad, RenderError);
  t.match(bad.message, /NodeGroup\/Bad_Name: invalid name/);

  const clash = inputs();
  clash.configurations.push({ metadata: { name: "add_node_users" }, spec: { content: "true", weight: 0 } });
  t.match(renderErr(clash).message, /NodeGroupConfiguration\/add_node_users: step name 000_add_node_users .* built-in/);

  const huge = inputs();
  huge.configurations[0]!.spec.content = `#!/bin/bash\n${"x".repeat(300 * 1024)}`;
  t.match(renderErr(huge).message, /NodeGroupConfiguration\/sysctl-tuning: .* limit is 262144/);

  for (const [name, uid, msg] of [
    ["low", 1000, /NodeUser\/low: uid 1000 is not allowed/],
    ["root", 1500, /NodeUser\/root: 'root' is a system account/],
    ["../x", 1500, /NodeUser\/..\/x: invalid user name/],
  ] as const) {
    const i = inputs();
    i.users.push({ metadata: { name }, spec: { uid, sshPublicKeys: ["ssh-ed25519 AAAA x"] } });
    t.match(renderErr(i).message, msg);
  }

  const os = inputs();
  os.configurations[0]!.spec.bundles = ["windows"];
  t.match(renderErr(os).message, /NodeGroupConfiguration\/sysctl-tuning: unknown bundle 'windows'/);

  const tpl = inputs();
  tpl.configurations[0]!.spec.content = "echo start\n{{ if .nodeGroup.name }}\nunclosed";
  t.match(renderErr(tpl).message, /NodeGroupConfiguration\/sysctl-tuning: spec.content line 3: unexpected EOF/);

  const ctx = inputs();
  ctx.context.packages.bashible!.digest = "sha256:nope";
  t.match(renderErr(ctx).message, /context: packages.bashible.digest/);
});

t.test("one group's bad input does not stop the others", async (t) => {
  const i = inputs({
    nodeGroups: [worker(), { metadata: { name: "frontend" }, spec: { nodeType: "Static" } }],
  });
  i.users.push({
    metadata: { name: "mallory" },
    spec: { uid: 0, sshPublicKeys: ["ssh-rsa A"], nodeGroups: ["frontend"] },
  });
  const r = renderAll(i, NOW);
  t.ok(r.groups.has("worker"));
  t.notOk(r.groups.has("frontend"));
  t.match(r.errors.get("frontend")?.message, /NodeUser\/mallory/);
});

t.test("NGC scripts cannot reach the packages proxy token", async (t) => {
  const i = inputs();
  i.configurations[0]!.spec.content = "echo {{ .packagesProxy.addresses }}";
  const s = render(i).bundle.steps.find((x) => x.kind === "Script")!;
  t.equal(s.kind === "Script" && s.spec.script, "echo [127.0.0.1:4219]");
  for (const content of ["echo {{ .packagesProxy.token }}", "echo {{ .packagesProxy | toJson }}"]) {
    const bad = inputs();
    bad.configurations[0]!.spec.content = content;
    const err = renderErr(bad).message;
    t.match(err, /packagesProxy\.token is a secret, kept out of scripts/, content);
    t.notMatch(err, new RegExp(i.context.packagesProxy.token), `${content}: the token is not in the error`);
  }
});

t.test("bashibles and bootstrap carry the agent package and a cleanup script", async (t) => {
  const r = render(inputs());
  const data = r.bashible.data as Record<string, string>;
  t.equal(data["agent.package"], "bashible");
  t.match(data["agent.digest"], /^sha256:[0-9a-f]{64}$/);
  t.match(data["cleanup_static_node.sh"], /--yes-i-am-sane-and-i-understand-what-i-am-doing/);
  t.match(data["cleanup_static_node.sh"], /\/var\/lib\/kubelet/);
  t.match(r.bootstrap.bootstrap, /bashibles\/worker/);
  t.match(r.bootstrap.bootstrap, /sha256sum/);
});

t.test(
  "a group with 60 steps renders every step, in order (its speed is measured by npm run bench -- server)",
  async (t) => {
    const i = inputs();
    for (let n = 0; n < 56; n++) {
      i.configurations.push({
        metadata: { name: `step-${n}` },
        spec: { content: `echo ${n}\n`.repeat(50), weight: 100 + n },
      });
    }
    const r = render(i);
    // 56 scripts, the example's one and its 23 built-in steps
    t.equal(r.bundle.steps.length, 80);
    const names = r.bundle.steps.map((s) => s.name);
    t.same(names, [...names].sort(), "ordered by name");
  },
);

t.test("a package's layer digest from the context reaches the bundle, which the agent accepts", async (t) => {
  const i = inputs();
  const layer = `sha256:${"ab".repeat(32)}`;
  i.context.packages.containerd = { ...i.context.packages.containerd!, layer };
  const r = render(i);
  const refs = step(r, "RegistryPackages").spec.packages;
  t.equal(refs.find((p) => p.name === "containerd")?.layer, layer);
  t.notOk(
    refs.some((p) => p.name !== "containerd" && "layer" in p),
    "a package without one carries none",
  );
  t.doesNotThrow(() => acceptBundle(Buffer.from(serialize(r.bundle)), "test"));
  i.context.packages.containerd = { ...i.context.packages.containerd!, layer: "sha256:short" };
  t.throws(() => render(i), /packages\.containerd\.layer must be sha256:<64 hex>/);
});

t.test(
  "the cluster's agent.metricsSecureAddress reaches every bundle's context; absent, bundles stay as they were",
  async (t) => {
    const before = render(inputs());
    t.notOk("agent" in before.bundle.context, "no setting, no key: an older agent accepts the bundle");
    const i = inputs();
    i.context.agent = { ...i.context.agent, metricsSecureAddress: "internal:9650" };
    const r = render(i);
    t.same(r.bundle.context.agent, { metricsSecureAddress: "internal:9650" });
    t.not(r.checksum, before.checksum, "turning it on is a new bundle for every node");
    t.doesNotThrow(() => acceptBundle(Buffer.from(serialize(r.bundle)), "test"));
    for (const bad of ["localhost:9650", "internal", "10.0.0.1:70000", "internal:9650; rm -rf /"]) {
      i.context.agent = { ...i.context.agent, metricsSecureAddress: bad };
      t.throws(() => render(i), /agent\.metricsSecureAddress .* must be internal:PORT/, bad);
    }
    // A node refuses a bundle with a name where an address must be (a server that did not check).
    const forged = JSON.parse(serialize(r.bundle));
    forged.context.agent.metricsSecureAddress = "attacker.example:9650";
    t.throws(() => acceptBundle(Buffer.from(JSON.stringify(forged)), "test"), /metricsSecureAddress/);
  },
);
