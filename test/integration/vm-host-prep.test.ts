// The operating-system steps where only a kernel of its own shows their effect: one QEMU VM
// (scripts/lib/vm-node.ts), the agent built from this checkout converging the steps locally.
// Swap on before, off after (fstab's line out); br_netfilter and overlay loaded, and again after
// a reboot; Deckhouse's kernel parameters set, kernel.panic 0 on a fencing group, and the tuner's
// service putting back what the kubelet changes at its start; LimitedSwap's swap file made and on,
// with the group's swappiness; every re-run changing nothing.
//
// Root only; skipped without qemu-system-x86_64. Boots are emulated (no usable KVM here): one VM
// for the file, one reboot.
import t, { type Test } from "tap";
import { spawnSync } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { buildDist } from "../../scripts/build.ts";
import { makeBundle } from "../../scripts/lib/bundle.ts";
import { vmForTest } from "../../scripts/lib/vm-node.ts";
import { vmImage } from "../../scripts/lib/vm-image.ts";
import { LAUNCHER_CONTENT } from "../../steps/bashible-service.ts";
import { HOST_PREP, PATHS } from "../../bundles/paths.ts";
import { hostPrepSteps } from "../fixtures/host-prep.ts";

const isRoot = process.getuid?.() === 0;
const hasQemu = spawnSync("sh", ["-c", "command -v qemu-system-x86_64 && command -v qemu-img"]).status === 0;
/** What a VM converges: what needs its own kernel (packages would take minutes under emulation). */
const KINDS = ["Swap", "KernelModules", "SysctlTuner"];

if (!isRoot) t.plan(0, "needs root (tap devices, loop mounts, debootstrap)");
else if (!hasQemu)
  t.plan(0, "needs qemu-system-x86_64 and qemu-img: apt-get install qemu-system-x86 qemu-utils busybox-static");
else {
  t.setTimeout(60 * 60_000);
  const work = await mkdtemp(path.join(os.tmpdir(), "vm-host-prep-"));
  t.teardown(() => rm(work, { recursive: true, force: true }));
  const dist = path.join(work, "dist");
  const [image] = await Promise.all([vmImage({ log: (l) => t.comment(l) }), buildDist(dist)]);
  const vm = await vmForTest(t, { image, parentDir: work });
  t.comment(`VM booted in ${vm.bootSeconds[0]} s`);
  await vm.copyIn(dist, PATHS.agentDir);
  await vm.writeFile(PATHS.agentLauncher, LAUNCHER_CONTENT, 0o755);
  const sh = async (s: string) => (await vm.mustExec(["sh", "-ec", s], { timeoutMs: 600_000 })).stdout;
  const sysctl = async (...keys: string[]) => (await sh(`sysctl -n ${keys.join(" ")}`)).trim().split("\n");
  const converge = async (steps: Awaited<ReturnType<typeof hostPrepSteps>>) => {
    await vm.writeFile("/root/bundle.json", JSON.stringify(makeBundle(steps)));
    const r = await vm.exec(
      [PATHS.agentLauncher, "once", "--bundle", "/root/bundle.json", "--node-name", vm.name, "--max-retries", "1"],
      { timeoutMs: 1_200_000 },
    );
    const status = JSON.parse(await sh(`cat ${PATHS.status}`));
    return { ...r, status };
  };
  const forcedRerun = async (t: Test, steps: Awaited<ReturnType<typeof hostPrepSteps>>) => {
    await sh(`rm -f ${PATHS.configurationChecksum}`);
    const again = await converge(steps);
    t.equal(again.exitCode, 0, again.stderr.slice(-2000));
    t.same(
      again.status.steps
        .filter((s: { outcome: string }) => s.outcome !== "unchanged")
        .map((s: { name: string }) => s.name),
      [],
      "a forced re-run changes nothing",
    );
  };

  const fenced = (await hostPrepSteps({ fencing: true })).filter((s) => KINDS.includes(s.kind));
  // Rendered before the subtests: between two of them nothing may hold the event loop (the VM's
  // processes are not waited on), and tap ends the root test when the loop runs dry.
  const limited = (
    await hostPrepSteps({ memorySwap: { swapBehavior: "LimitedSwap", limitedSwap: { size: "1G" }, swappiness: 30 } })
  ).filter((s) => KINDS.includes(s.kind));

  await t.test(
    "swap on before the join, off after; modules loaded; kernel parameters set, kernel.panic 0",
    async (t) => {
      await sh(
        "fallocate -l 64M /swap.img && chmod 600 /swap.img && mkswap /swap.img >/dev/null && swapon /swap.img && printf '/swap.img none swap sw 0 0\\n' >>/etc/fstab",
      );
      t.match(await sh("cat /proc/swaps"), "/swap.img", "swap is on, as Ubuntu's installer leaves it");
      t.notMatch(await sh("lsmod"), /^br_netfilter\s/m);
      const r = await converge(fenced);
      t.equal(r.exitCode, 0, `${r.stdout.slice(-2000)}\n${r.stderr.slice(-2000)}`);
      t.equal((await sh("cat /proc/swaps")).trim().split("\n").length, 1, "no swap is on (only the header)");
      t.notMatch(await sh("cat /etc/fstab"), "swap.img", "and none comes back at boot");
      const lsmod = await sh("lsmod");
      t.match(lsmod, /^br_netfilter\s/m, "br_netfilter loaded");
      t.match(lsmod, /^overlay\s/m, "overlay loaded");
      t.same(await sysctl("kernel.panic", "kernel.panic_on_oops", "vm.swappiness", "vm.overcommit_memory"), [
        "0",
        "1",
        "0",
        "1",
      ]);
      t.same(
        await sysctl(
          "net.bridge.bridge-nf-call-iptables",
          "net.ipv4.conf.all.forwarding",
          "fs.inotify.max_user_watches",
          "vm.dirty_ratio",
          "kernel.pid_max",
        ),
        ["1", "1", "524288", "80", "2000000"],
        "bridge-nf-call once br_netfilter is there, forwarding, inotify, vm and kernel values",
      );
      t.same(
        r.status.steps.flatMap((s: { problems?: unknown[] }) => s.problems ?? []),
        [],
        "a machine of its own: no problems",
      );
      t.equal((await sh("systemctl is-active sysctl-tuner.timer")).trim(), "active");
      await forcedRerun(t, fenced);
    },
  );

  await t.test("the tuner puts back what the kubelet sets at its start (kernel.panic=10)", async (t) => {
    await sh("sysctl -q -w kernel.panic=10 net.core.somaxconn=128");
    // What sysctl-tuner.timer starts every 10 minutes.
    await sh("systemctl start sysctl-tuner.service");
    t.same(await sysctl("kernel.panic", "net.core.somaxconn"), ["0", "1000"]);
    t.equal((await sh("systemctl show -p Result --value sysctl-tuner.service")).trim(), "success");
  });

  await t.test("LimitedSwap: the swap file of the size asked, on, with the group's swappiness", async (t) => {
    const r = await converge(limited);
    t.equal(r.exitCode, 0, r.stderr.slice(-2000));
    t.match(
      await sh("cat /proc/swaps"),
      new RegExp(`^${HOST_PREP.swapFile}\\s+file\\s+1048572\\s`, "m"),
      "1 GiB of swap on",
    );
    t.equal((await sh(`stat -c '%s %a' ${HOST_PREP.swapFile}`)).trim(), `${1024 ** 3} 600`);
    t.match(await sh("cat /etc/fstab"), `${HOST_PREP.swapFile} none swap sw 0 0`);
    t.same(await sysctl("vm.swappiness", "kernel.panic"), ["30", "10"], "swappiness 30; no fencing: kernel.panic 10");
    await forcedRerun(t, limited);
  });

  await t.test("after a reboot: the modules and kernel parameters are back, and the swap file is on", async (t) => {
    await vm.reboot();
    t.comment(`rebooted in ${vm.bootSeconds[1]} s`);
    t.match(await sh("lsmod"), /^br_netfilter\s/m, "modules-load.d loaded br_netfilter at boot");
    t.same(
      await sysctl("vm.swappiness", "fs.inotify.max_user_watches"),
      ["30", "524288"],
      "systemd-sysctl set the file at boot",
    );
    t.match(await sh("cat /proc/swaps"), HOST_PREP.swapFile, "fstab turned the swap file on");
    await forcedRerun(t, limited);
  });
}
