// The operating-system steps on sandbox trees (Debian, Rocky, ALT): each plans what it would
// change, the engine applies it, and a second plan is empty. What only a running machine shows
// (packages really installed, live sysctls, modules, swap) is in node-host-prep.test.ts (nspawn)
// and vm-host-prep.test.ts (a VM); the hostname-uniqueness check asks a real API server here.
import t from "tap";
import { chmod, lstat, mkdir, readFile, readlink, stat, symlink, writeFile } from "node:fs/promises";
import { existsSync } from "node:fs";
import path from "node:path";
import { stepEnv, OS_RELEASE } from "../fixtures/steps.ts";
import type { BundleStep } from "../../bundles/types.ts";
import { HOST_PREP, PATHS } from "../../bundles/paths.ts";
import { distroPackagesFor, PACKAGE_ROLES } from "../../bundles/os-families.ts";
import { DENY_STARTS_MARKER, POLICY_RC_D } from "../../bundles/os-families.ts";
import { sysctlTuner } from "../../bundles/steps/sysctl-tuner.ts";
import { withControlPlane } from "../../scripts/lib/control-plane-fixture.ts";
import { bootstrapConnection } from "../../lib/kube/kubeconfig.ts";
import { KubeClient } from "../../lib/kube/client.ts";

const root = process.getuid?.() === 0;
const step = (name: string, kind: string, spec: unknown) => ({ name, kind, spec }) as BundleStep;
const actions = async (r: string) => readFile(path.join(r, PATHS.sandboxActions), "utf8").catch(() => "");

const packages = step("000_add_mandatory_packages", "DistributionPackages", { roles: [...PACKAGE_ROLES] });

t.test("packages on Debian: one refresh and one install of what is missing, held nginx, recorded", async (t) => {
  const env = await stepEnv(t);
  // A package database saying curl and sudo are there already.
  await mkdir(path.join(env.root, "var/lib/dpkg/info"), { recursive: true });
  const entry = (p: string) =>
    `Package: ${p}\nStatus: install ok installed\nPriority: optional\nVersion: 1.0\nArchitecture: amd64\nDescription: x\n\n`;
  await writeFile(path.join(env.root, "var/lib/dpkg/status"), entry("curl") + entry("sudo"));
  const plan = await env.plan(packages);
  const argv = plan.changes.flatMap((c) => (c.kind === "command" ? [c.argv] : []));
  t.match(argv[0]?.slice(2), ["/etc/apt/sources.list, /etc/apt/sources.list.d/", "apt-get", "update"]);
  t.equal(argv[0]?.[1]?.endsWith("steps/checks/package-mirror.sh"), true, "wrapped: a mirror error names the mirror");
  const install = argv[1] ?? [];
  t.ok(install.includes("nginx-light") && install.includes("libnginx-mod-stream") && install.includes("jq"));
  t.notOk(install.includes("curl"), "installed packages are not installed again");
  t.notOk(install.includes("sudo"));
  const denyAt = install.findIndex((a) => a.endsWith("steps/checks/deny-service-starts.sh"));
  t.ok(denyAt > 0 && install[denyAt + 1] === "nginx.service", "Debian's nginx kept from starting during the install");
  t.same(argv[2], ["apt-mark", "hold", "nginx-light", "libnginx-mod-stream"], "nginx held where Deckhouse held it");
  const status = await env.apply(packages);
  t.equal(status.outcome, "changed");
  const record = await readFile(path.join(env.root, PATHS.distroPackagesRecord), "utf8");
  t.match(record, /^apt jq$/m);
  t.notMatch(record, /^apt curl$/m, "what was there before is not the agent's to remove");
  t.match(await actions(env.root), /apt-get install -y -q --no-install-recommends/);
  t.same((await env.plan(packages)).changes, [], "a second plan is empty (a sandbox counts recorded packages)");
});

t.test("a policy-rc.d left by a killed install goes; the machine's own stays; no install, no wrapper", async (t) => {
  const env = await stepEnv(t);
  await mkdir(path.join(env.root, "var/lib/dpkg"), { recursive: true });
  const entry = (p: string) => `Package: ${p}\nStatus: install ok installed\nVersion: 1.0\nArchitecture: amd64\n\n`;
  await writeFile(
    path.join(env.root, "var/lib/dpkg/status"),
    distroPackagesFor("debian", [...PACKAGE_ROLES])
      .map(entry)
      .join(""),
  );
  await mkdir(path.join(env.root, "usr/sbin"), { recursive: true });
  const policy = path.join(env.root, POLICY_RC_D);
  await writeFile(policy, `#!/bin/sh\n${DENY_STARTS_MARKER}\nexit 0\n`, { mode: 0o755 });
  const plan = await env.plan(packages);
  t.notOk(
    plan.changes.some((c) => c.kind === "command" && c.argv.some((a) => a.includes("deny-service-starts"))),
    "nothing to install: nothing wrapped",
  );
  t.match(plan.changes, [{ kind: "file", path: POLICY_RC_D, action: "delete" }], "the stale one is planned away");
  await env.apply(packages);
  t.notOk(existsSync(policy), "and removed");
  const own = "#!/bin/sh\n# the operator's: no service starts in this image\nexit 101\n";
  await writeFile(policy, own, { mode: 0o755 });
  t.notOk(
    (await env.plan(packages)).changes.some((c) => c.kind === "file"),
    "a policy-rc.d without the marker is the machine's",
  );
  t.equal(await readFile(policy, "utf8"), own);
});

t.test("packages on Rocky and ALT: the family's names and manager", async (t) => {
  const rocky = await stepEnv(t, OS_RELEASE.rocky);
  await mkdir(path.join(rocky.root, "usr/bin"), { recursive: true });
  await writeFile(path.join(rocky.root, "usr/bin/dnf"), "");
  const argv = (await rocky.plan(packages)).changes.flatMap((c) => (c.kind === "command" ? [c.argv] : []));
  t.match(argv[0]?.slice(3), ["dnf", "makecache"]);
  const install = argv[1] ?? [];
  for (const p of [
    "nmap-ncat",
    "conntrack-tools",
    "cloud-utils-growpart",
    "nginx-mod-stream",
    "python3-dnf-plugin-versionlock",
  ]) {
    t.ok(install.includes(p), `installs ${p}`);
  }
  t.same(argv[2], ["dnf", "versionlock", "add", "nginx", "nginx-mod-stream"]);
  await rocky.apply(packages);
  t.same((await rocky.plan(packages)).changes, []);

  const alt = await stepEnv(t, OS_RELEASE.altlinux);
  const altArgv = (await alt.plan(packages)).changes.flatMap((c) => (c.kind === "command" ? [c.argv] : []));
  t.equal(altArgv.length, 2, "refresh and install; apt-rpm cannot hold");
  t.ok(altArgv[1]?.includes("nginx") && altArgv[1]?.includes("netcat"));
});

t.test("modules: a boot file each, loaded (recorded under a sandbox), then nothing", async (t) => {
  const env = await stepEnv(t);
  const s = step("004_load_mandatory_modules", "KernelModules", { modules: ["br_netfilter", "overlay"] });
  await env.apply(s);
  t.equal(
    await readFile(path.join(env.root, HOST_PREP.modulesLoad("br_netfilter")), "utf8"),
    "# Managed by bashible (004_load_mandatory_modules): loaded at boot.\nbr_netfilter\n",
  );
  t.match(await actions(env.root), /modprobe br_netfilter\n.*modprobe overlay/s);
  t.same((await env.plan(s)).changes, []);
});

t.test("swap off: fstab's swap lines out and recorded, swap units and the GPT generator masked", async (t) => {
  const env = await stepEnv(t);
  const fstab = "# /etc/fstab\nUUID=abc / ext4 errors=remount-ro 0 1\n/swap.img\tnone\tswap\tsw\t0\t0\n";
  await writeFile(path.join(env.root, "etc/fstab"), fstab);
  await mkdir(path.join(env.root, "lib/systemd/system-generators"), { recursive: true });
  await writeFile(path.join(env.root, "lib/systemd/system-generators/systemd-gpt-auto-generator"), "");
  await mkdir(path.join(env.root, "lib/systemd/system"), { recursive: true });
  await writeFile(path.join(env.root, "lib/systemd/system/dev-vdb.swap"), "[Swap]\nWhat=/dev/vdb\n");
  const s = step("003_disable_swap", "Swap", { swapBehavior: "NoSwap" });
  const plan = await env.plan(s);
  const fstabChange = plan.changes.find((c) => c.kind === "file" && c.path === "/etc/fstab");
  t.match(
    fstabChange?.kind === "file" && fstabChange.diff,
    /^-\/swap\.img\tnone\tswap/m,
    "the plan shows the line going",
  );
  await env.apply(s);
  t.equal(
    await readFile(path.join(env.root, "etc/fstab"), "utf8"),
    "# /etc/fstab\nUUID=abc / ext4 errors=remount-ro 0 1\n",
  );
  t.equal(await readlink(path.join(env.root, HOST_PREP.gptAutoGeneratorMask)), "/dev/null");
  t.equal(await readlink(path.join(env.root, "etc/systemd/system/dev-vdb.swap")), "/dev/null");
  t.equal(
    await readFile(path.join(env.root, PATHS.swapRecord), "utf8"),
    "fstab-removed /swap.img\tnone\tswap\tsw\t0\t0\nmasked dev-vdb.swap\n",
    "what cleanup puts back",
  );
  t.same((await env.plan(s)).changes, [], "a second plan is empty");
});

t.test("LimitedSwap: the swap file made, its fstab line, swapon", async (t) => {
  const env = await stepEnv(t);
  await writeFile(path.join(env.root, "etc/fstab"), "UUID=abc / ext4 defaults 0 1\n");
  const s = step("003_disable_swap", "Swap", { swapBehavior: "LimitedSwap", limitedSwapSizeGiB: 2 });
  const plan = await env.plan(s);
  const argv = plan.changes.flatMap((c) => (c.kind === "command" ? [c.argv.join(" ")] : []));
  t.match(argv, [/^fallocate -l 2G .*\/var\/lib\/swapfile$/, /^chmod 0600 /, /^mkswap /]);
  await env.apply(s);
  t.equal(
    await readFile(path.join(env.root, "etc/fstab"), "utf8"),
    "UUID=abc / ext4 defaults 0 1\n/var/lib/swapfile none swap sw 0 0\n",
  );
  t.match(
    await readFile(path.join(env.root, PATHS.swapRecord), "utf8"),
    "fstab-added /var/lib/swapfile none swap sw 0 0",
  );
});

t.test("kernel parameters: one file, the tuner's timer enabled and started", async (t) => {
  const env = await stepEnv(t);
  const settings = { ...sysctlTuner.defaults, "kernel.panic": "0", "vm.swappiness": "0" };
  const s = step("041_configure_sysctl_tuner", "SysctlTuner", { settings, conntrack: sysctlTuner.conntrack });
  await env.apply(s);
  const conf = await readFile(path.join(env.root, HOST_PREP.sysctlTuner), "utf8");
  t.match(conf, /^kernel\.panic = 0$/m);
  t.match(conf, /^net\.ipv4\.conf\.all\.forwarding = 1$/m);
  t.match(conf, /^net\.netfilter\.nf_conntrack_max = \d+$/m);
  t.match(
    await readFile(path.join(env.root, "etc/systemd/system/sysctl-tuner.timer"), "utf8"),
    "OnUnitActiveSec=10min",
  );
  t.match(
    await readFile(path.join(env.root, "etc/systemd/system/sysctl-tuner.service"), "utf8"),
    `ExecStart=-/usr/sbin/sysctl -q -e --load ${HOST_PREP.sysctlTuner}`,
  );
  t.ok(
    (
      await lstat(path.join(env.root, "etc/systemd/system/multi-user.target.wants/sysctl-tuner.timer"))
    ).isSymbolicLink(),
    "the timer enabled",
  );
  t.match(await actions(env.root), "systemctl start sysctl-tuner.timer");
  t.equal(
    await readlink(path.join(env.root, "etc/systemd/system/kubelet.service.wants/sysctl-tuner.service")),
    "/etc/systemd/system/sysctl-tuner.service",
    "and it runs with every start of the kubelet",
  );
  t.same((await env.plan(s)).changes, []);
});

t.test("rp_filter, networkd, journald: drop-ins, and a restart only when one changed", async (t) => {
  const env = await stepEnv(t);
  const steps = [
    step("003_disable_rp_filter", "RpFilter", {}),
    step("005_disable_manage_iprules", "NetworkdIpRules", {}),
    step("084_configure_journald", "Journald", { maxFileSec: 86400, maxRetentionSec: 1209600 }),
  ];
  const run = await env.planRun(steps);
  const journald = run.find((p) => p.name === "084_configure_journald");
  t.same(
    journald?.changes.flatMap((c) => (c.kind === "service" ? [`${c.action} ${c.unit}`] : [])),
    ["restart systemd-journald.service"],
    "the plan shows the restart it causes",
  );
  for (const s of steps) await env.apply(s);
  t.equal(
    await readFile(path.join(env.root, HOST_PREP.rpFilter), "utf8"),
    "# Managed by bashible (003_disable_rp_filter): CNIs route pod traffic asymmetrically.\nnet.ipv4.conf.*.rp_filter = 0\n",
  );
  t.match(
    await readFile(path.join(env.root, HOST_PREP.networkdForeignRules), "utf8"),
    "ManageForeignRoutingPolicyRules=no",
  );
  t.match(await readFile(path.join(env.root, HOST_PREP.journald), "utf8"), "MaxRetentionSec=1209600s");
  const log = await actions(env.root);
  t.match(log, "systemctl try-restart systemd-networkd.service", "networkd restarted only if it runs");
  t.match(log, "systemctl restart systemd-journald.service");
  for (const s of steps) t.same((await env.plan(s)).changes, [], `${s.name}: a second plan is empty`);
  const before = await actions(env.root);
  for (const s of steps) await env.apply(s);
  t.equal(await actions(env.root), before, "and a second run restarts nothing");
});

t.test("rsyslog: nothing where it is not enabled; the kubelet filter where it is", async (t) => {
  const env = await stepEnv(t);
  const s = step("083_disable_rsyslog_for_kubelet", "RsyslogKubeletFilter", {});
  t.same((await env.plan(s)).changes, [], "no rsyslog: nothing");
  await mkdir(path.join(env.root, "etc/rsyslog.d"), { recursive: true });
  await mkdir(path.join(env.root, "etc/systemd/system/multi-user.target.wants"), { recursive: true });
  await symlink(
    "/lib/systemd/system/rsyslog.service",
    path.join(env.root, "etc/systemd/system/multi-user.target.wants/rsyslog.service"),
  );
  await env.apply(s);
  t.match(
    await readFile(path.join(env.root, HOST_PREP.rsyslogKubelet), "utf8"),
    ':programname, isequal, "kubelet" stop',
  );
  t.match(await actions(env.root), "systemctl restart rsyslog.service");
  t.same((await env.plan(s)).changes, []);
});

t.test("step logs rotated by logrotate, the file checked by logrotate itself", async (t) => {
  const env = await stepEnv(t);
  const s = step("085_rotate_bashible_logs", "LogRotation", { maxSizeMiB: 10, keep: 5 });
  const status = await env.apply(s);
  t.equal(status.outcome, "changed", status.error ?? "");
  const conf = await readFile(path.join(env.root, HOST_PREP.logrotate), "utf8");
  t.match(conf, "/var/log/d8/bashible/*.log {");
  t.match(conf, /size 10M\n\s+rotate 5/);
  t.same((await env.plan(s)).changes, []);
});

t.test("hostname: a name Kubernetes refuses stops the run, saying what to do", async (t) => {
  const env = await stepEnv(t);
  const s = step("004_check_hostname", "HostnameCheck", {});
  t.equal((await env.apply(s, { nodeName: "worker-1.example" })).outcome, "unchanged");
  const bad = await env.apply(s, { nodeName: "Worker_1" });
  t.equal(bad.outcome, "failed");
  t.match(bad.error, /the node name 'Worker_1' cannot be a Kubernetes Node's: .*hostnamectl set-hostname/);
});

t.test("node IP: the address inside internalNetworkCIDRs, or a failure naming the addresses", async (t) => {
  const env = await stepEnv(t);
  const s = step("000_discover_node_ip", "NodeIp", { nodeType: "Static", internalNetworkCIDRs: ["0.0.0.0/0"] });
  await env.apply(s);
  const ip = await readFile(path.join(env.root, PATHS.discoveredNodeIp), "utf8");
  t.match(ip, /^(\d+\.){3}\d+\n$/, "an address and a newline (what bb-d8-node-ip and --node-ip read)");
  t.same((await env.plan(s)).changes, []);
  const none = step("000_discover_node_ip", "NodeIp", { nodeType: "Static", internalNetworkCIDRs: ["203.0.113.0/24"] });
  const failed = await env.apply(none);
  t.equal(failed.outcome, "failed");
  t.match(
    failed.error,
    /no address of this machine is in the cluster's internalNetworkCIDRs \(203\.0\.113\.0\/24\); its addresses: /,
  );
});

t.test("098_cleanup: the bootstrap token and its files go once the kubelet has its own credentials", async (t) => {
  const env = await stepEnv(t);
  const s = step("098_cleanup", "BootstrapCleanup", {});
  const files = [PATHS.bootstrapToken, PATHS.bootstrapCA, PATHS.bootstrapAuthHeader, PATHS.bootstrapScript];
  for (const f of files) {
    await mkdir(path.dirname(path.join(env.root, f)), { recursive: true });
    await writeFile(path.join(env.root, f), "abcdef.0123456789abcdef\n");
  }
  t.same((await env.plan(s)).changes, [], "no kubelet credentials yet: everything stays");
  for (const f of [PATHS.kubeletKubeconfig, PATHS.kubeletClientPem]) {
    await mkdir(path.dirname(path.join(env.root, f)), { recursive: true });
    await writeFile(path.join(env.root, f), "x");
  }
  const plan = await env.plan(s);
  t.same(
    plan.changes.map((c) => (c.kind === "file" ? `${c.action} ${c.path}` : c.kind)),
    files.map((f) => `delete ${f}`),
  );
  t.notMatch(JSON.stringify(plan), "0123456789abcdef", "the token never shows in a plan");
  await env.apply(s);
  for (const f of files) t.rejects(stat(path.join(env.root, f)), `${f} is gone`);
  t.same((await env.plan(s)).changes, []);
});

t.test("CIS modes: tightened where no step owns the file, reported where one does", async (t) => {
  const env = await stepEnv(t);
  const s = step("098_set_permissions", "FilePermissions", {});
  for (const f of [PATHS.kubeletKubeconfig, PATHS.kubeletConfig]) {
    await mkdir(path.dirname(path.join(env.root, f)), { recursive: true });
    await writeFile(path.join(env.root, f), "x");
    await chmod(path.join(env.root, f), 0o644);
  }
  await env.apply(s);
  t.equal(
    (await stat(path.join(env.root, PATHS.kubeletKubeconfig))).mode & 0o777,
    0o600,
    "kubelet.conf 0600 (CIS 4.1.5)",
  );
  t.equal(
    (await stat(path.join(env.root, PATHS.kubeletConfig))).mode & 0o777,
    0o600,
    "no kubelet step in the bundle: config.yaml 0600",
  );
  await chmod(path.join(env.root, PATHS.kubeletConfig), 0o644);
  const kubeletStep = step("064_configure_kubelet", "Kubelet", {});
  const run = await env.planRun([s, kubeletStep]);
  const perms = run.find((p) => p.name === "098_set_permissions");
  t.same(perms?.changes, [], "the kubelet step owns config.yaml: not changed here");
  t.match(perms?.problems, [
    {
      subject: PATHS.kubeletConfig,
      message: /looser than CIS 4\.1\.9 asks \(0600\); 064_configure_kubelet writes this file/,
    },
  ]);
});

t.test(
  "hostname uniqueness: a Node of this name stops the join; a cluster that may not say is a problem",
  { skip: !root && "needs root (runs a control plane)" },
  async (t) => {
    const cp = await withControlPlane(t, { kubeletBootstrapRbac: true });
    await cp.kubectl(["apply", "-f", "-"], {
      input: JSON.stringify({ apiVersion: "v1", kind: "Node", metadata: { name: "taken-1" } }),
    });
    const env = await stepEnv(t);
    await mkdir(path.join(env.root, "var/lib/bashible"), { recursive: true });
    const token = await cp.mintBootstrapToken();
    await writeFile(path.join(env.root, PATHS.bootstrapToken), token);
    await writeFile(path.join(env.root, PATHS.bootstrapCA), await readFile(cp.ca.cert, "utf8"));
    const kube = new KubeClient(
      await bootstrapConnection(cp.server, PATHS.bootstrapToken, PATHS.bootstrapCA, env.root),
    );
    t.teardown(() => kube.close());
    const s = step("064_check_hostname_uniqueness", "HostnameUniqueness", {});

    const forbidden = await env.plan(s, { kube, nodeName: "taken-1" });
    t.match(forbidden.problems, [{ subject: "Node taken-1", message: /bootstrap token may not read Nodes \(403\)/ }]);
    t.same(forbidden.changes, []);

    await cp.kubectl(["apply", "-f", "-"], {
      input: `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "test:get-nodes"}
rules: [{apiGroups: [""], resources: [nodes], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "test:get-nodes"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "test:get-nodes"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: "system:bootstrappers"}]
`,
    });
    const free = await env.apply(s, { kube, nodeName: "fresh-1" });
    t.equal(free.outcome, "unchanged", "a free name passes");
    const taken = await env.apply(s, { kube, nodeName: "taken-1" });
    t.equal(taken.outcome, "failed");
    t.match(taken.error, /a Node named 'taken-1' already exists in the cluster: names must be unique/);
    t.equal(taken.attempts, 1, "not retried: waiting does not free the name");
    await mkdir(path.dirname(path.join(env.root, PATHS.kubeletClientPem)), { recursive: true });
    await writeFile(path.join(env.root, PATHS.kubeletClientPem), "x");
    t.equal(
      (await env.apply(s, { kube, nodeName: "taken-1" })).outcome,
      "unchanged",
      "the kubelet has its certificate: the Node is this one",
    );
  },
);
