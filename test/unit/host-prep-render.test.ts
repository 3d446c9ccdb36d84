// The operating-system steps (000_add_mandatory_packages … 098_set_permissions) as the renderer
// builds them from a NodeGroup, the family data they map through, the pure parts of their plans,
// and what cleanup_static_node.sh and bootstrap.sh do for them.
import t from "tap";
import { spawnSync } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { loadConfigDir } from "../../cluster/sources/directory.ts";
import { renderGroup } from "../../cluster/render/render.ts";
import { RenderError } from "../../cluster/render/errors.ts";
import { manualBootstrapData } from "../../cluster/server/bootstrap-secrets.ts";
import type { NodeGroupObject, RenderInputs } from "../../cluster/render/inputs.ts";
import {
  DENY_STARTS_MARKER,
  DISTRO_PACKAGES,
  distroPackagesFor,
  familyOf,
  PACKAGE_MANAGERS,
  PACKAGE_ROLES,
  POLICY_RC_D,
  UnknownOsError,
} from "../../bundles/os-families.ts";
import { CLEANUP_PATHS, HOST_PREP, MANDATORY_MODULES, PATHS } from "../../bundles/paths.ts";
import { sysctlTuner } from "../../bundles/steps/sysctl-tuner.ts";
import { hostnameCheck } from "../../bundles/steps/hostname.ts";
import { heldIn, parseDpkgQuery } from "../../steps/distro-packages.ts";
import { inCidr, NodeIpNotFoundError, staticNodeIp } from "../../steps/node-ip.ts";
import { isSwapLine } from "../../steps/swap.ts";
import { tunedSettings } from "../../steps/sysctl-tuner.ts";
import { renderSysctlFile } from "../../steps/lib/sysctl.ts";
import { sysctlPath } from "../../steps/lib/kernel.ts";
import type { SpecOf, StepKind } from "../../bundles/types.ts";

const EXAMPLE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../examples/cluster");
const base = (await loadConfigDir(EXAMPLE)).snapshot.inputs as RenderInputs;
const NOW = Date.parse("2026-01-01T00:00:00Z");
const worker = () => structuredClone(base.nodeGroups.find((g) => g.metadata.name === "worker")!) as NodeGroupObject;
const render = (ng: NodeGroupObject, context = structuredClone(base.context)) =>
  renderGroup(ng, { ...structuredClone(base), nodeGroups: [ng], context }, NOW);
const spec = <K extends StepKind>(r: ReturnType<typeof render>, kind: K): SpecOf<K> => {
  const found = r.bundle.steps.find((s) => s.kind === kind);
  if (!found) throw new Error(`no ${kind} step`);
  return found.spec as SpecOf<K>;
};

t.test("packages: every role, nginx only where the API proxy runs", async (t) => {
  t.same(spec(render(worker()), "DistributionPackages").roles, [...PACKAGE_ROLES]);
  const context = structuredClone(base.context);
  delete context.packages.kubelet;
  const roles = spec(render(worker(), context), "DistributionPackages").roles;
  t.notOk(roles.includes("nginx"), "no kubelet, no API proxy: no nginx");
  t.ok(roles.includes("sudo") && roles.includes("curl"));
});

t.test("every family names packages for every role; the Debian names are the mirror's", async (t) => {
  for (const [family, roles] of Object.entries(DISTRO_PACKAGES)) {
    for (const r of PACKAGE_ROLES) t.ok(roles[r].length > 0, `${family} ${r}`);
  }
  t.same(distroPackagesFor("debian", ["nginx", "growpart", "netcat"]), [
    "nginx-light",
    "libnginx-mod-stream",
    "cloud-guest-utils",
    "netcat-openbsd",
  ]);
  t.same(distroPackagesFor("rhel", ["nginx", "netcat", "conntrack"]), [
    "nginx",
    "nginx-mod-stream",
    "nmap-ncat",
    "conntrack-tools",
  ]);
  t.same(distroPackagesFor("debian", ["lsblk", "lsblk"]), ["util-linux"], "each package once");
});

t.test("OS families: ROSA is a RHEL-like; openSUSE and MOS are refused with the reason", async (t) => {
  t.equal(familyOf("rosa").family, "rhel");
  t.equal(familyOf("rels").packageManager, "dnf");
  t.throws(() => familyOf("opensuse-leap"), UnknownOsError);
  t.throws(() => familyOf("opensuse-leap"), /SUSE family .* is not implemented/);
  t.throws(() => familyOf("mosos-arbat"), /MOS is not supported yet/);
  t.throws(() => familyOf("constructor"), /'constructor' is not supported; supported IDs/, "no prototype keys");
});

t.test("swap: off by default; LimitedSwap gives the file's size; no size is the NodeGroup's error", async (t) => {
  t.same(spec(render(worker()), "Swap"), { swapBehavior: "NoSwap" });
  const ng = worker();
  ng.spec.kubelet = { memorySwap: { swapBehavior: "LimitedSwap", limitedSwap: { size: "4G" }, swappiness: 30 } };
  const r = render(ng);
  t.same(spec(r, "Swap"), { swapBehavior: "LimitedSwap", limitedSwapSizeGiB: 4 });
  t.equal(spec(r, "SysctlTuner").settings["vm.swappiness"], "30", "swappiness is the tuner's");
  ng.spec.kubelet = { memorySwap: { swapBehavior: "LimitedSwap" } };
  t.throws(() => render(ng), RenderError);
  t.throws(() => render(ng), /NodeGroup\/worker \(spec\.kubelet\.memorySwap\).*limitedSwap\.size/);
  ng.spec.kubelet = { memorySwap: { swapBehavior: "NoSwap" } };
  t.same(spec(render(ng), "Swap"), { swapBehavior: "NoSwap" });
});

t.test("kernel parameters: Deckhouse's set; kernel.panic 0 on a Watchdog group, 10 elsewhere", async (t) => {
  const ng = worker();
  delete ng.spec.fencing;
  const plain = spec(render(ng), "SysctlTuner");
  t.equal(plain.settings["kernel.panic"], "10");
  t.equal(plain.settings["vm.swappiness"], "0", "no swap: swappiness 0");
  t.equal(plain.settings["net.ipv4.conf.all.forwarding"], "1");
  t.equal(plain.settings["net.bridge.bridge-nf-call-iptables"], "1");
  t.equal(plain.settings["fs.inotify.max_user_watches"], "524288");
  t.equal(plain.settings["net.ipv4.tcp_rmem"], "4096 12582912 16777216");
  t.same(plain.conntrack, { perCore: 131072, min: 524288 });
  t.same(Object.keys(plain.settings), Object.keys(plain.settings).sort(), "keys in order: a stable checksum");
  ng.spec.fencing = { mode: "Watchdog" };
  t.equal(spec(render(ng), "SysctlTuner").settings["kernel.panic"], "0", "a fenced node stays down");
  ng.spec.fencing = { mode: "Notify" };
  t.equal(spec(render(ng), "SysctlTuner").settings["kernel.panic"], "10", "Notify arms no watchdog");
  t.same(
    Object.keys(sysctlTuner.defaults).filter((k) => !(k in plain.settings)),
    [],
    "every default reaches the bundle",
  );
});

// The kubelet's own list (pkg/kubelet/cm/container_manager_linux.go, setupKernelTunables): with
// protectKernelDefaults it refuses to start unless each has exactly this value.
const KUBELET_CHECKS = {
  "vm.overcommit_memory": "1",
  "vm.panic_on_oom": "0",
  "kernel.panic": "10",
  "kernel.panic_on_oops": "1",
  "kernel.keys.root_maxkeys": "1000000",
  "kernel.keys.root_maxbytes": "25000000",
};

t.test("the kubelet finds the kernel values it checks; on a Watchdog group it does not check them", async (t) => {
  const ng = worker();
  delete ng.spec.fencing;
  let r = render(ng);
  const tuned = spec(r, "SysctlTuner").settings;
  for (const [k, v] of Object.entries(KUBELET_CHECKS)) t.equal(tuned[k], v, `${k} is the kubelet's ${v}`);
  t.equal(spec(r, "Kubelet").protectKernelDefaults, true, "no fence: the kubelet checks them");
  ng.spec.fencing = { mode: "Watchdog" };
  r = render(ng);
  t.equal(spec(r, "SysctlTuner").settings["kernel.panic"], "0");
  t.equal(
    spec(r, "Kubelet").protectKernelDefaults,
    false,
    "kernel.panic 0 is not the kubelet's 10: a check would keep it from starting",
  );
  ng.spec.fencing = { mode: "Notify" };
  t.equal(spec(render(ng), "Kubelet").protectKernelDefaults, true);
});

t.test("nf_conntrack_max is the node's: CPUs × perCore, at least min", async (t) => {
  const s = spec(render(worker()), "SysctlTuner");
  t.equal(tunedSettings(s, 2)["net.netfilter.nf_conntrack_max"], "524288", "2 CPUs: the minimum");
  t.equal(tunedSettings(s, 8)["net.netfilter.nf_conntrack_max"], String(8 * 131072));
  t.equal(tunedSettings(s, 8)["net.nf_conntrack_max"], String(8 * 131072), "the old kernels' name too");
});

t.test("modules, logging, node IP, hostname steps", async (t) => {
  const ng = worker();
  const context = structuredClone(base.context);
  context.internalNetworkCIDRs = ["192.168.10.0/24", "10.0.0.0/8"];
  const r = render(ng, context);
  t.same(spec(r, "KernelModules"), { modules: ["br_netfilter", "overlay"] });
  t.same(spec(r, "Journald"), { maxFileSec: 86400, maxRetentionSec: 14 * 86400 }, "Deckhouse's 24 h and 14 days");
  t.same(spec(r, "LogRotation"), { maxSizeMiB: 10, keep: 5 });
  t.same(spec(r, "NodeIp"), { nodeType: "Static", internalNetworkCIDRs: ["192.168.10.0/24", "10.0.0.0/8"] });
  t.same(spec(r, "HostnameUniqueness"), {});
  context.internalNetworkCIDRs = ["10.0.0.0/33"];
  t.throws(() => render(ng, context), /context \(internalNetworkCIDRs\).*an IPv4 CIDR/);
  const cloud = worker();
  cloud.spec.nodeType = "CloudEphemeral";
  const rc = render(cloud);
  t.notOk(
    rc.bundle.steps.some((s) => s.kind === "HostnameUniqueness"),
    "cloud nodes get their names from the cloud",
  );
  t.same(spec(rc, "NodeIp"), { nodeType: "CloudEphemeral", internalNetworkCIDRs: [] });
});

t.test("hostname rule: Deckhouse's, 63 characters at most", async (t) => {
  for (const ok of ["node-1", "a", "worker.example", "x".repeat(63)]) t.ok(hostnameCheck.pattern.test(ok), ok);
  for (const bad of ["Node-1", "-node", "node-", "node_1", "x".repeat(64), ""]) {
    t.notOk(hostnameCheck.pattern.test(bad), JSON.stringify(bad));
  }
});

t.test("dpkg-query and hold lists parsed as the package managers print them", async (t) => {
  const s = parseDpkgQuery("curl\tii \nnginx-light\thi \nlibnginx-mod-stream\trc \njq:amd64\tii \n");
  t.same([...s.installed].sort(), ["curl", "jq", "nginx-light"]);
  t.same([...s.held], ["nginx-light"]);
  const versionlock = "nginx-1:1.20.1-14.el9_2.1.*\nnginx-mod-stream-1:1.20.1-14.el9_2.1.*\n";
  t.ok(heldIn(versionlock, "nginx"));
  t.ok(heldIn(versionlock, "nginx-mod-stream"));
  t.notOk(heldIn(versionlock, "nginx-mod"), "a prefix is not a hold");
  t.ok(heldIn("type: package\nmatch_type: glob\ncase_sensitive: on\nsolvable_name: nginx\n", "nginx"), "zypper locks");
});

t.test("node IP: internalNetworkCIDRs first, then the one NIC, then the default route", async (t) => {
  const addresses = [
    { interface: "eth0", address: "10.1.2.3", prefix: 24 },
    { interface: "eth1", address: "192.168.10.7", prefix: 24 },
    { interface: "cni0", address: "10.244.0.1", prefix: 24 },
  ];
  t.equal(staticNodeIp(["192.168.10.0/24"], { addresses, physical: ["eth0", "eth1"] }).ip, "192.168.10.7");
  t.equal(
    staticNodeIp(["172.16.0.0/12", "10.0.0.0/8"], { addresses, physical: [] }).ip,
    "10.1.2.3",
    "the first CIDR with an address wins, then interface order",
  );
  t.throws(
    () => staticNodeIp(["172.16.0.0/12"], { addresses, physical: [] }),
    /no address of this machine is in the cluster's internalNetworkCIDRs \(172\.16\.0\.0\/12\); its addresses: 10\.1\.2\.3\/24 \(eth0\)/,
  );
  t.equal(staticNodeIp([], { addresses, physical: ["eth1"] }).ip, "192.168.10.7", "the one NIC");
  t.equal(
    staticNodeIp([], { addresses, physical: ["eth0", "eth1"], defaultRoute: "eth0" }).ip,
    "10.1.2.3",
    "two NICs: the default route's",
  );
  t.throws(() => staticNodeIp([], { addresses, physical: ["eth0", "eth1"] }), NodeIpNotFoundError);
  t.ok(inCidr("10.0.0.1", "0.0.0.0/0"));
  t.notOk(inCidr("10.0.1.1", "10.0.0.0/24"));
  t.ok(inCidr("10.0.0.255", "10.0.0.0/24"));
});

t.test("swap lines of /etc/fstab, and sysctl keys as /proc/sys paths", async (t) => {
  t.ok(isSwapLine("/swap.img\tnone\tswap\tsw\t0\t0"));
  t.ok(isSwapLine("UUID=1234 none swap sw 0 0"));
  t.notOk(isSwapLine("# /swap.img none swap sw 0 0"), "a comment");
  t.notOk(isSwapLine("/dev/vda1 / ext4 defaults,swap 0 1"), "swap as an option is not a swap line");
  t.equal(sysctlPath("net.ipv4.conf.all.rp_filter"), "/proc/sys/net/ipv4/conf/all/rp_filter");
  t.equal(sysctlPath("net/ipv4/conf/eth0.100/rp_filter"), "/proc/sys/net/ipv4/conf/eth0.100/rp_filter");
  t.equal(renderSysctlFile("# h", { "a.b": "1", "c.d": "2 3" }), "# h\na.b = 1\nc.d = 2 3\n");
});

t.test("cleanup_static_node.sh undoes the operating-system steps", async (t) => {
  const r = render(worker());
  const script = (r.bashible.data as Record<string, string>)["cleanup_static_node.sh"]!;
  t.equal(spawnSync("bash", ["-n"], { input: script }).status, 0, "bash reads it");
  for (const p of [...MANDATORY_MODULES.map(HOST_PREP.modulesLoad), HOST_PREP.sysctlTuner, HOST_PREP.journald]) {
    t.ok(CLEANUP_PATHS.includes(p), `${p} is removed`);
    t.match(script, p);
  }
  for (const u of ["sysctl-tuner.service", "sysctl-tuner.timer"]) t.match(script, new RegExp(`^UNITS=\\(.*${u}`, "m"));
  t.match(script, `SWAP_RECORD="${PATHS.swapRecord}"`, "swap put back as it was");
  t.match(script, `PACKAGES_RECORD="${PATHS.distroPackagesRecord}"`, "the packages it installed removed");
  for (const [name, m] of Object.entries(PACKAGE_MANAGERS)) {
    t.match(script, `    ${name}) `, `a removal for ${name}`);
    t.match(script, m.remove.join(" "));
  }
  t.match(script, 'apt) apt-mark unhold "$@"', "held packages released first");
  t.match(
    script,
    `if grep -qxF "${DENY_STARTS_MARKER}" ${POLICY_RC_D} 2>/dev/null; then rm -f ${POLICY_RC_D}; fi`,
    "a policy-rc.d a killed install left goes, only one that carries the marker",
  );
});

t.test("bootstrap.sh installs curl with the package managers' own commands when it is missing", async (t) => {
  const script = manualBootstrapData(
    "worker",
    {
      clusterCA: "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n",
      apiserverEndpoints: ["10.0.0.1:6443"],
    } as RenderInputs["context"],
    { token: "abcdef.0123456789abcdef", expiration: "2026-01-01T04:00:00Z" },
  )["bootstrap.sh"]!;
  t.equal(spawnSync("bash", ["-n"], { input: script }).status, 0, "bash reads it");
  t.match(script, "if ! command -v curl >/dev/null 2>&1; then");
  const apt = PACKAGE_MANAGERS.apt;
  t.match(script, apt.refresh.slice(0, 5).join(" "), "apt-get update as the step runs it");
  t.match(script, `${apt.install.slice(0, 5).join(" ")} -o Dpkg::Options::=--force-confdef`);
  t.match(script, `>>"$STATE/distro-packages"`, `recorded in ${PATHS.distroPackagesRecord}`);
  t.ok(PATHS.distroPackagesRecord.endsWith("/distro-packages"));
});
