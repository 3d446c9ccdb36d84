// The operating-system steps on a booted bare Debian machine (systemd-nspawn: minbase with
// systemd, as the end-to-end machine and a cloud image have it), installing from a local Debian
// mirror the test serves: what a node shows of each step's effect. Packages really installed and
// held, the distribution's nginx.service not left running, Ubuntu-style fstab swap taken out,
// rp_filter and forwarding in the node's own network namespace, journald and rsyslog restarted
// once with the kubelet's messages kept out of syslog, the step logs rotated, the node's address
// picked from the group's internal network on a machine with two, bb-d8-node-ip reading it, the
// bootstrap token gone once the kubelet has its own credentials, CIS modes; then a forced re-run
// that changes and restarts nothing, an unreachable mirror named in the failure, a bad hostname.
//
// What a container cannot show (modules, swap itself, vm.*/kernel.* sysctls) is in
// vm-host-prep.test.ts; here those are the problems the steps report for a container.
import t from "tap";
import { cp, mkdir, mkdtemp, rm, symlink, writeFile } from "node:fs/promises";
import { existsSync } from "node:fs";
import { randomBytes } from "node:crypto";
import os from "node:os";
import path from "node:path";
import { buildDist } from "../../scripts/build.ts";
import { makeBundle, script } from "../../scripts/lib/bundle.ts";
import { localDebianRepo, serveRepo } from "../../scripts/lib/debian-mirror.ts";
import { debianRoot } from "../../scripts/lib/debian-root.ts";
import { E2E_MIRROR_PACKAGES, E2E_NODE_PACKAGES } from "../../scripts/lib/e2e/world.ts";
import { type NspawnNode, nodeForTest } from "../../scripts/lib/nspawn-node.ts";
import { until } from "../../scripts/lib/until.ts";
import { LAUNCHER_CONTENT } from "../../steps/bashible-service.ts";
import { HOST_PREP, PATHS } from "../../bundles/paths.ts";
import { hostPrepSteps } from "../fixtures/host-prep.ts";

const skip =
  process.getuid?.() !== 0
    ? "needs root (boots a systemd-nspawn node)"
    : !existsSync("/usr/bin/systemd-nspawn") || !existsSync("/usr/bin/dpkg-scanpackages")
      ? "needs systemd-nspawn, debootstrap and dpkg-dev (apt-get install systemd-container debootstrap dpkg-dev)"
      : false;

const NODE = "bn-prep";
const OTHER_NET = "192.168.77";

t.test("a bare Debian machine prepared as Deckhouse prepares it", { skip, timeout: 40 * 60_000 }, async (t) => {
  const work = await mkdtemp(path.join(os.tmpdir(), "node-host-prep-"));
  t.teardown(() => rm(work, { recursive: true, force: true }));
  const [root, repo] = await Promise.all([
    debianRoot({ packages: E2E_NODE_PACKAGES, log: (l) => t.comment(l) }),
    // rsyslog as well: the machine runs one here, to show the kubelet filter.
    localDebianRepo({ packages: [...E2E_MIRROR_PACKAGES, "rsyslog"], log: (l) => t.comment(l) }),
  ]);
  const dist = path.join(work, "dist");
  await buildDist(dist);
  const node: NspawnNode = await nodeForTest(t, {
    root: root.dir,
    name: NODE,
    parentDir: work,
    // The node's own network sysctls writable, stand-ins for the kernel-wide ones a kubelet sets.
    kubeletSysctls: true,
    async beforeBoot(rootfs) {
      await cp(dist, path.join(rootfs, PATHS.agentDir), { recursive: true });
      await mkdir(path.join(rootfs, PATHS.binDir), { recursive: true });
      await writeFile(path.join(rootfs, PATHS.agentLauncher), LAUNCHER_CONTENT, { mode: 0o755 });
      // The node's port 80 belongs to its ingress controller (here a stand-in that answers on
      // it): the distribution's nginx must never contest it, not even during its install.
      await writeFile(
        path.join(rootfs, "etc/systemd/system/ingress-stand-in.service"),
        `[Service]\nExecStart=${PATHS.agentDir}/bashible.d/node -e "require('node:net').createServer((s) => s.end('ingress')).listen(80)"\n[Install]\nWantedBy=multi-user.target\n`,
      );
      await mkdir(path.join(rootfs, "etc/systemd/system/multi-user.target.wants"), { recursive: true });
      await symlink(
        "../ingress-stand-in.service",
        path.join(rootfs, "etc/systemd/system/multi-user.target.wants/ingress-stand-in.service"),
      );
      // Ubuntu's installer leaves a swap file in fstab (the container does not turn it on).
      await writeFile(
        path.join(rootfs, "etc/fstab"),
        "# <file system> <mount point> <type> <options> <dump> <pass>\n/swap.img\tnone\tswap\tsw\t0\t0\n",
      );
      // The kubelet joined already: its credentials, next to what bootstrap.sh left.
      for (const [f, mode] of [
        [PATHS.kubeletKubeconfig, 0o644],
        [PATHS.kubeletClientPem, 0o600],
        [PATHS.bootstrapToken, 0o600],
        [PATHS.bootstrapCA, 0o600],
        [PATHS.bootstrapAuthHeader, 0o600],
      ] as const) {
        await mkdir(path.dirname(path.join(rootfs, f)), { recursive: true });
        await writeFile(path.join(rootfs, f), "placeholder\n", { mode });
      }
    },
  });
  const mirror = await serveRepo(repo.dir, node.hostAddress);
  t.teardown(() => mirror.close());
  const sh = (s: string) => node.mustExec(["sh", "-c", s], { timeoutMs: 600_000 }).then((r) => r.stdout);
  const pid = async (unit: string) => (await sh(`systemctl show -p MainPID --value ${unit}`)).trim();
  const status = async () => JSON.parse(await sh(`cat ${PATHS.status}`));
  const agent = (args: string[] = []) =>
    node.exec(
      [
        PATHS.agentLauncher,
        "once",
        "--bundle",
        "/root/bundle.json",
        "--node-name",
        NODE,
        "--max-retries",
        "1",
        ...args,
      ],
      { timeoutMs: 1_200_000 },
    );

  // The machine as its operator has it: the mirror as its apt source, rsyslog running, a second
  // network (the group's internal one), rp_filter on.
  await sh(`printf '%s\\n' '${mirror.sourcesLine}' >/etc/apt/sources.list`);
  await sh("apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends rsyslog");
  await until(
    "rsyslog to run",
    async () => (await node.exec(["systemctl", "is-active", "rsyslog"])).stdout.trim() === "active",
    60_000,
  );
  await sh(
    `ip link add prep0 type veth peer name prep1 && ip addr add ${OTHER_NET}.5/24 dev prep0 && ip link set prep0 up && ip link set prep1 up`,
  );
  await sh("sysctl -q -w net.ipv4.conf.all.rp_filter=1 net.ipv4.conf.eth0.rp_filter=1");

  const steps = await hostPrepSteps({ internalNetworkCIDRs: [`${OTHER_NET}.0/24`], fencing: true });
  const bundle = makeBundle([...steps, script("090_uses-node-ip", "bb-d8-node-ip >/root/bb-d8-node-ip\n", 90)]);
  await node.writeFile("/root/bundle.json", JSON.stringify(bundle));
  const before = {
    journald: await pid("systemd-journald"),
    rsyslog: await pid("rsyslog"),
    ingress: await until("the ingress stand-in to listen on :80", async () => {
      const p = await pid("ingress-stand-in");
      return (
        p !== "0" &&
        (await node.exec(["sh", "-c", "cat /proc/net/tcp /proc/net/tcp6 | grep -q ':0050 [0-9A-F:]* 0A'"])).exitCode ===
          0 &&
        p
      );
    }),
  };

  // Exit 3: converged, with problems printed. In a container those are the kernel's: it shares
  // the host's (no modules of its own, most of /proc/sys read-only); nothing else may be one.
  const onlyTheKernels = (st: { steps: { problems?: { message: string }[] }[] }) =>
    st.steps
      .flatMap((s) => s.problems ?? [])
      .map((p) => p.message)
      .filter((m) => !/a container shares its host's kernel|is not in this kernel/.test(m));
  const first = await agent();
  t.ok(first.exitCode === 0 || first.exitCode === 3, `${first.stdout.slice(-3000)}\n${first.stderr.slice(-3000)}`);
  const st = await status();
  t.equal(st.lastRun?.outcome, "applied");
  t.same(onlyTheKernels(st), [], "every problem is the shared kernel's");

  await t.test("distribution packages from the mirror, nginx held and its distribution unit off", async (t) => {
    const q = await sh(
      // biome-ignore lint/suspicious/noTemplateCurlyInString: dpkg-query's own format syntax
      "dpkg-query -W -f '${Package} ${db:Status-Abbrev}\\n' nginx-light libnginx-mod-stream jq sudo iptables conntrack logrotate",
    );
    for (const p of ["nginx-light", "libnginx-mod-stream", "jq", "sudo", "iptables", "conntrack", "logrotate"]) {
      t.match(q, new RegExp(`^${p} [ih]i`, "m"), `${p} is installed`);
    }
    t.same(
      (await sh("apt-mark showhold")).trim().split("\n").sort(),
      ["libnginx-mod-stream", "nginx-light"],
      "nginx held",
    );
    t.ok(
      mirror.served.some((p) => p.startsWith("/nginx-light_")),
      "from the mirror",
    );
    t.equal(
      (await node.exec(["systemctl", "is-active", "nginx"])).stdout.trim(),
      "inactive",
      "Debian's nginx.service stopped",
    );
    t.equal((await node.exec(["systemctl", "is-enabled", "nginx"])).stdout.trim(), "disabled", "and disabled");
    t.equal(
      // A start that failed (the port taken) leaves inactive too, and the unit failed.
      (await sh("systemctl show -p InactiveExitTimestampMonotonic --value nginx.service")).trim(),
      "0",
      "Debian's nginx was never started, not even during its install",
    );
    t.equal(await pid("ingress-stand-in"), before.ingress, "the ingress controller's port 80 was never contested");
    t.equal(await sh("curl -s --http0.9 http://127.0.0.1/"), "ingress", "and it still answers there");
    t.equal((await node.exec(["test", "-e", "/usr/sbin/policy-rc.d"])).exitCode, 1, "no policy-rc.d left behind");
    const record = await sh(`cat ${PATHS.distroPackagesRecord}`);
    t.match(record, /^apt nginx-light$/m, "what cleanup removes is recorded");
    t.notMatch(record, /^apt rsyslog$/m, "what the machine had is not");
  });

  await t.test("swap: fstab's swap line out, recorded for cleanup", async (t) => {
    t.notMatch(await sh("cat /etc/fstab"), "swap.img");
    t.match(await sh(`cat ${PATHS.swapRecord}`), "fstab-removed /swap.img\tnone\tswap\tsw\t0\t0");
    t.equal((await sh(`readlink ${HOST_PREP.gptAutoGeneratorMask}`)).trim(), "/dev/null", "the GPT generator masked");
  });

  await t.test("network: rp_filter 0 everywhere, forwarding on, networkd told to leave ip rules alone", async (t) => {
    for (const i of ["all", "default", "eth0", "prep0"]) {
      t.equal((await sh(`cat /proc/sys/net/ipv4/conf/${i}/rp_filter`)).trim(), "0", `rp_filter ${i}`);
    }
    t.equal((await sh("cat /proc/sys/net/ipv4/conf/all/forwarding")).trim(), "1");
    t.match(await sh(`cat ${HOST_PREP.networkdForeignRules}`), "ManageForeignRoutingPolicyRules=no");
    t.equal(
      (await node.exec(["systemctl", "is-active", "systemd-networkd"])).stdout.trim(),
      "inactive",
      "a networkd the machine does not use is not started",
    );
  });

  await t.test(
    "kernel parameters: the fencing group's kernel.panic 0; what a container cannot set is a problem",
    async (t) => {
      t.equal((await sh("cat /proc/sys/kernel/panic")).trim(), "0", "kernel.panic (the node's stand-in) is 0");
      t.equal((await sh("cat /proc/sys/vm/overcommit_memory")).trim(), "1");
      t.match(await sh(`cat ${HOST_PREP.sysctlTuner}`), /^kernel\.panic = 0$/m);
      const tuner = st.steps.find((s: { name: string }) => s.name === "041_configure_sysctl_tuner");
      t.match(JSON.stringify(tuner.problems), /read-only in \/proc\/sys: a container shares its host's kernel/);
      t.equal((await sh("systemctl is-active sysctl-tuner.timer")).trim(), "active", "the tuner's timer runs");
      const mods = st.steps.find((s: { name: string }) => s.name === "004_load_mandatory_modules");
      if (!existsSync("/sys/module/br_netfilter")) {
        t.match(
          JSON.stringify(mods.problems),
          /br_netfilter not loaded, and this machine has no modules for its kernel/,
        );
      }
      t.match(await sh(`cat ${HOST_PREP.modulesLoad("overlay")}`), /^overlay$/m, "loaded at boot");
    },
  );

  await t.test(
    "logging: journald and rsyslog restarted once, the kubelet kept out of syslog, step logs rotated",
    async (t) => {
      t.not(await pid("systemd-journald"), before.journald, "journald restarted for its drop-in");
      t.not(await pid("rsyslog"), before.rsyslog, "rsyslog restarted for the filter");
      t.match(await sh("systemd-analyze cat-config systemd/journald.conf"), "MaxRetentionSec=1209600s");
      const tag = randomBytes(4).toString("hex");
      await sh(`logger -t kubelet "kubelet-${tag}" && logger -t other "other-${tag}"`);
      await until(
        "the other line in syslog",
        async () => (await sh("cat /var/log/syslog")).includes(`other-${tag}`),
        30_000,
      );
      t.notMatch(await sh("cat /var/log/syslog"), `kubelet-${tag}`, "the kubelet's line is not there");
      t.match(await sh("journalctl -q -t kubelet --no-pager"), `kubelet-${tag}`, "journald has it");
      await sh(`logrotate -f ${HOST_PREP.logrotate}`);
      t.match(
        await sh(`ls ${PATHS.logDir}`),
        /step\.000_add_mandatory_packages\.log\.1/,
        "logrotate rotates the step logs",
      );
    },
  );

  await t.test("node identity: the internal network's address, read by bb-d8-node-ip", async (t) => {
    t.equal(await sh(`cat ${PATHS.discoveredNodeIp}`), `${OTHER_NET}.5\n`, "not eth0's: the group's internal network");
    t.equal(await sh("cat /root/bb-d8-node-ip"), `${OTHER_NET}.5\n`, "bb-d8-node-ip works");
  });

  await t.test("after bootstrap: the token and its files gone, CIS modes", async (t) => {
    for (const f of [PATHS.bootstrapToken, PATHS.bootstrapCA, PATHS.bootstrapAuthHeader]) {
      t.equal((await node.exec(["test", "-e", f])).exitCode, 1, `${f} is gone`);
    }
    t.equal((await sh(`stat -c %a ${PATHS.kubeletKubeconfig}`)).trim(), "600", "kubelet.conf 0600 (CIS 4.1.5)");
    t.equal((await sh("stat -c %a /var/lib/kubelet/pki")).trim(), "700");
  });

  await t.test("a forced re-run on the converged node changes nothing and restarts nothing", async (t) => {
    const pids = { journald: await pid("systemd-journald"), rsyslog: await pid("rsyslog") };
    const served = mirror.served.length;
    await sh(`rm -f ${PATHS.configurationChecksum}`);
    const again = await agent();
    t.ok(again.exitCode === 0 || again.exitCode === 3, again.stderr.slice(-2000));
    const s2 = await status();
    t.same(onlyTheKernels(s2), [], "every problem is the shared kernel's");
    const changed = s2.steps
      .filter((s: { outcome: string }) => s.outcome !== "unchanged")
      .map((s: { name: string }) => s.name);
    t.same(changed, ["090_uses-node-ip"], "only the custom script ran again (it runs on a forced run)");
    t.same({ journald: await pid("systemd-journald"), rsyslog: await pid("rsyslog") }, pids, "nothing restarted");
    t.equal(mirror.served.length, served, "nothing fetched from the mirror");
  });

  await t.test("a mirror that cannot be reached fails the step, naming the mirror", async (t) => {
    const dead = `http://${node.hostAddress}:9/`;
    await sh(
      `printf 'deb [trusted=yes] ${dead} ./\\n' >/etc/apt/sources.list && DEBIAN_FRONTEND=noninteractive apt-mark unhold nginx-light >/dev/null && apt-get purge -y -q jq >/dev/null && rm -f ${PATHS.configurationChecksum}`,
    );
    const r = await agent();
    t.equal(r.exitCode, 1);
    const failed = (await status()).steps.find((s: { name: string }) => s.name === "000_add_mandatory_packages");
    t.equal(failed.outcome, "failed");
    t.match(failed.error, `cannot reach the package mirror ${dead}`);
    t.match(failed.error, "check the node's package sources (/etc/apt/sources.list, /etc/apt/sources.list.d/)");
  });

  await t.test("a name Kubernetes refuses stops the run before anything else of the node is set up", async (t) => {
    await sh(`printf '%s\\n' '${mirror.sourcesLine}' >/etc/apt/sources.list && rm -f ${PATHS.configurationChecksum}`);
    const r = await node.exec(
      [PATHS.agentLauncher, "once", "--bundle", "/root/bundle.json", "--node-name", "Bad_Name", "--max-retries", "1"],
      { timeoutMs: 1_200_000 },
    );
    t.equal(r.exitCode, 1);
    const failed = (await status()).steps.find((s: { name: string }) => s.name === "004_check_hostname");
    t.match(failed.error, "the node name 'Bad_Name' cannot be a Kubernetes Node's");
  });
});
