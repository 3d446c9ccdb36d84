// The VM harness (scripts/lib/vm-node.ts) and the local Debian mirror (scripts/lib/debian-mirror.ts):
// one QEMU guest, booted twice, shows what a container node cannot: a cgroup v2 tree with
// pressure (PSI) per cgroup, kernel modules it loads itself (br_netfilter's sysctls appear), a
// swap file on and off, kernel.* sysctls of its own, a reboot with a new kernel instance, and a
// softdog that panics the guest, which stays down. Both a VM and an nspawn node install a package
// with their own apt-get from the local mirror, and each one's diff shows the installed files.
//
// Root only; skipped without qemu-system-x86_64. The first run builds the cached image (a
// debootstrap, the kernel) and fetches the mirror's packages; later runs reuse them.
import t from "tap";
import { spawn, spawnSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { randomBytes } from "node:crypto";
import { localDebianRepo, MANDATORY_PACKAGES, serveRepo } from "../../scripts/lib/debian-mirror.ts";
import { nodeForTest } from "../../scripts/lib/nspawn-node.ts";
import { until } from "../../scripts/lib/until.ts";
import { vmImage } from "../../scripts/lib/vm-image.ts";
import { reapStaleVms, vmForTest } from "../../scripts/lib/vm-node.ts";

const isRoot = process.getuid?.() === 0;
const hasQemu = spawnSync("sh", ["-c", "command -v qemu-system-x86_64 && command -v qemu-img"]).status === 0;

if (!isRoot) {
  t.plan(0, "needs root (tap devices, loop mounts, debootstrap, systemd-nspawn)");
} else if (!hasQemu) {
  t.plan(0, "needs qemu-system-x86_64 and qemu-img: apt-get install qemu-system-x86 qemu-utils busybox-static");
} else {
  // A cold cache debootstraps a root and fetches a kernel and ~130 packages first; the boots
  // themselves are emulated (no usable KVM here) and slow on a loaded machine.
  t.setTimeout(45 * 60_000);
  const started = Date.now();
  const log = (line: string) => t.comment(line);
  const image = await vmImage({ log });
  const s = image.seconds;
  t.comment(
    image.built
      ? `VM image built in ${s.total} s (debootstrap ${s.root} s, kernel ${s.kernel} s, initramfs + disk ${s.image} s)`
      : `VM image ${image.key} cached (${s.total} s to find)`,
  );
  const repo = await localDebianRepo({ log });
  t.comment(
    `local mirror: ${repo.packages.length} packages for ${repo.requested.length} requested (${repo.downloaded} fetched) in ${repo.seconds} s`,
  );
  t.same(repo.requested, [...MANDATORY_PACKAGES].sort(), "the default list is Deckhouse's mandatory packages");

  const mib = (bytes: number) => `${Math.round(bytes / 1048576)} MiB`;
  /** apt-get install jq in a node (VM or nspawn) whose only source is the local mirror. */
  const installJq = async (
    node: {
      writeFile(p: string, c: string): Promise<void>;
      exec(argv: string[], o?: { timeoutMs?: number }): Promise<{ exitCode: number; stdout: string; stderr: string }>;
    },
    sourcesLine: string,
  ) => {
    // Nothing but the local mirror: the node's own sources point at the distribution.
    await node.writeFile("/etc/apt/sources.list", "");
    const r = await node.exec(
      [
        "sh",
        "-ec",
        'echo "$1" >/etc/apt/sources.list.d/local-mirror.list\napt-get update -q\nDEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends jq\njq --version',
        "sh",
        sourcesLine,
      ],
      { timeoutMs: 600_000 },
    );
    return r;
  };

  /** Running, not a zombie (a killed process's orphans are reaped by whoever adopted them). */
  const runs = (pid: number) => {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
      return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
    } catch {
      return false;
    }
  };

  await t.test("a killed test's QEMU and tap are reaped by the next run", async (t) => {
    const name = `bv-reap-${randomBytes(2).toString("hex")}`;
    const stateFile = `/run/bashible-test-vms/${name}.json`;
    // Another test process, killed once its QEMU runs: nothing of it gets to clean up.
    const code = `const { bootVm } = await import(${JSON.stringify(new URL("../../scripts/lib/vm-node.ts", import.meta.url).href)});
await bootVm({ image: JSON.parse(process.env.VM_IMAGE), name: process.env.VM_NAME });`;
    const child = spawn(process.execPath, ["--input-type=module", "-e", code], {
      env: { ...process.env, VM_IMAGE: JSON.stringify(image), VM_NAME: name },
      stdio: ["ignore", "ignore", "pipe"],
    });
    let stderr = "";
    child.stderr.on("data", (d: Buffer) => (stderr += d));
    const exited = new Promise((r) => child.once("exit", r));
    const state = await until(
      "the other test's QEMU to start",
      () => {
        if (child.exitCode !== null) throw new Error(`the child exited: ${stderr}`);
        const st = JSON.parse(readFileSync(stateFile, "utf8")) as { qemuPid?: number; tap: string; dir: string };
        return st.qemuPid ? st : undefined;
      },
      300_000,
    );
    child.kill("SIGKILL");
    await exited;
    t.ok(runs(state.qemuPid as number), "its QEMU outlives it");
    t.equal(spawnSync("ip", ["link", "show", state.tap]).status, 0, "and so does its tap");
    t.ok((await reapStaleVms()).includes(name), "the next run reaps it");
    t.notOk(runs(state.qemuPid as number), "QEMU is gone");
    t.not(spawnSync("ip", ["link", "show", state.tap]).status, 0, "the tap is gone");
    t.notOk(existsSync(state.dir), "its temp dir is gone");
    t.notOk(existsSync(stateFile), "its record is gone");
  });

  await t.test("a VM: its own kernel, cgroup v2, modules, swap, sysctls, a reboot and a softdog panic", async (t) => {
    const vm = await vmForTest(t, { image });
    t.comment(`booted to ${vm.state} in ${vm.bootSeconds[0]} s; QEMU RSS ${mib(vm.rssBytes())}`);
    t.same(vm.failedUnits, [], "no unit fails in the guest");
    t.equal((await vm.mustExec(["uname", "-r"])).stdout.trim(), image.kernelRelease, "the guest runs the cloud kernel");
    t.equal((await vm.mustExec(["hostname"])).stdout.trim(), vm.name, "the hostname is the VM's name");
    t.match((await vm.mustExec(["ip", "-br", "addr", "show", "eth0"])).stdout, vm.address, "eth0 has its address");

    await t.test("cgroup v2 with pressure per cgroup", async (t) => {
      t.equal((await vm.mustExec(["stat", "-fc", "%T", "/sys/fs/cgroup"])).stdout.trim(), "cgroup2fs");
      const controllers = (await vm.mustExec(["cat", "/sys/fs/cgroup/cgroup.controllers"])).stdout.split(/\s+/);
      for (const c of ["cpu", "io", "memory", "pids"]) t.ok(controllers.includes(c), `controller ${c}`);
      const r = await vm.mustExec([
        "sh",
        "-ec",
        "mkdir /sys/fs/cgroup/bashible-test\necho 64M >/sys/fs/cgroup/bashible-test/memory.high\necho $$ >/sys/fs/cgroup/bashible-test/cgroup.procs\ncat /proc/self/cgroup /sys/fs/cgroup/bashible-test/memory.pressure /sys/fs/cgroup/bashible-test/memory.high",
      ]);
      t.match(r.stdout, /^0::\/bashible-test$/m, "a process moved into the new cgroup");
      t.match(r.stdout, /^some avg10=\d+\.\d+ avg60=\d+\.\d+ avg300=\d+\.\d+ total=\d+$/m, "memory.pressure: some");
      t.match(r.stdout, /^full avg10=\d+\.\d+ avg60=\d+\.\d+ avg300=\d+\.\d+ total=\d+$/m, "memory.pressure: full");
      t.match(r.stdout, /^67108864$/m, "memory.high set");
    });

    await t.test("modprobe br_netfilter overlay: the bridge sysctls appear", async (t) => {
      t.not((await vm.exec(["sysctl", "-n", "net.bridge.bridge-nf-call-iptables"])).exitCode, 0, "absent before");
      await vm.mustExec(["modprobe", "br_netfilter"]);
      await vm.mustExec(["modprobe", "overlay"]);
      const lsmod = (await vm.mustExec(["lsmod"])).stdout;
      t.match(lsmod, /^br_netfilter\s/m);
      t.match(lsmod, /^overlay\s/m);
      t.equal((await vm.mustExec(["sysctl", "-n", "net.bridge.bridge-nf-call-iptables"])).stdout.trim(), "1");
      t.match((await vm.mustExec(["grep", "overlay", "/proc/filesystems"])).stdout, /nodev\toverlay/);
    });

    await t.test("a swap file on, then off", async (t) => {
      await vm.mustExec([
        "sh",
        "-ec",
        "fallocate -l 64M /swapfile\nchmod 600 /swapfile\nmkswap /swapfile >/dev/null\nswapon /swapfile",
      ]);
      t.match((await vm.mustExec(["cat", "/proc/swaps"])).stdout, /^\/swapfile\s+file\s+65532\s/m, "in /proc/swaps");
      t.match((await vm.mustExec(["grep", "SwapTotal", "/proc/meminfo"])).stdout, /SwapTotal:\s+65532 kB/);
      await vm.mustExec(["sh", "-ec", "swapoff /swapfile\nrm /swapfile"]);
      t.notMatch((await vm.mustExec(["cat", "/proc/swaps"])).stdout, /swapfile/, "gone from /proc/swaps");
      t.match((await vm.mustExec(["grep", "SwapTotal", "/proc/meminfo"])).stdout, /SwapTotal:\s+0 kB/);
    });

    await t.test("kernel.* and vm.* sysctls are the guest's own", async (t) => {
      await vm.mustExec(["sysctl", "-w", "kernel.panic=5", "vm.swappiness=7"]);
      t.equal((await vm.mustExec(["sysctl", "-n", "kernel.panic", "vm.swappiness"])).stdout, "5\n7\n");
      await vm.mustExec(["sysctl", "-w", "kernel.panic=0"]);
      t.equal((await vm.mustExec(["cat", "/proc/sys/kernel/panic"])).stdout.trim(), "0");
    });

    await t.test("apt-get install from the local mirror on the host", async (t) => {
      const server = await serveRepo(repo.dir, vm.hostAddress);
      t.teardown(() => server.close());
      const r = await installJq(vm, server.sourcesLine);
      t.equal(r.exitCode, 0, r.exitCode ? r.stderr : "apt-get install jq");
      t.match(r.stdout, /^jq-1\.6/m, "jq runs");
      t.ok(
        server.served.some((p) => /^\/jq_[^/]+\.deb$/.test(p)),
        "the guest fetched jq from the mirror",
      );
    });

    await t.test("a reboot: a new boot of the kernel, the disk kept", async (t) => {
      const bootId = (await vm.mustExec(["cat", "/proc/sys/kernel/random/boot_id"])).stdout.trim();
      await vm.reboot();
      t.equal(vm.boots, 2);
      t.equal(vm.lastExit, "reset", "the guest reset (QEMU runs with -no-reboot and was started again)");
      t.comment(`rebooted: ready ${vm.bootSeconds[1]} s after QEMU's start`);
      t.not((await vm.mustExec(["cat", "/proc/sys/kernel/random/boot_id"])).stdout.trim(), bootId, "a new boot id");
      t.notMatch((await vm.mustExec(["lsmod"])).stdout, /^br_netfilter\s/m, "modules are gone with the old kernel");
      t.equal((await vm.mustExec(["sysctl", "-n", "vm.swappiness"])).stdout.trim(), "60", "sysctls back to defaults");
      t.match((await vm.mustExec(["jq", "--version"])).stdout, /^jq-1\.6/, "the installed package is still there");
    });

    await t.test("softdog with soft_panic=1 and kernel.panic=0: the guest panics and stays down", async (t) => {
      t.comment(`QEMU RSS before the panic: ${mib(vm.rssBytes())}`);
      await vm.mustExec(["sysctl", "-w", "kernel.panic=0"]);
      await vm.mustExec(["modprobe", "softdog", "soft_margin=10", "soft_panic=1"]);
      // One write, then the device is closed without the magic 'V': the timer keeps running.
      await vm.mustExec(["sh", "-c", "echo 1 >/dev/watchdog"]);
      const line = await vm.waitForConsole(/Software Watchdog Timer expired/, { timeoutMs: 180_000 });
      t.match(line, /Kernel panic - not syncing: Software Watchdog Timer expired/, "the console shows the panic");
      await until("the harness to kill the panicked guest", () => !vm.running(), 60_000);
      t.equal(vm.lastExit, "panic", "QEMU was killed after the panic, not reset by the guest");
      t.match(vm.panic ?? "", /---\[ end Kernel panic - not syncing: Software Watchdog Timer expired/);
      t.notMatch(vm.panic ?? "", /Rebooting in \d+ seconds/, "with kernel.panic=0 the kernel schedules no reboot");
      t.equal(vm.boots, 2, "no third boot");
    });

    await t.test("diff(): the installed package's files, nothing of the swap file", async (t) => {
      await vm.stop();
      const diff = await vm.diff();
      const added = new Set(diff.entries.filter((e) => e.kind === "added").map((e) => e.path));
      const changed = new Set(diff.entries.filter((e) => e.kind === "changed").map((e) => e.path));
      for (const p of ["/usr/bin/jq", "/var/lib/dpkg/info/jq.list", "/etc/apt/sources.list.d/local-mirror.list"]) {
        t.ok(added.has(p), `added ${p}`);
      }
      t.ok(
        [...added].some((p) => /^\/usr\/lib\/x86_64-linux-gnu\/libjq\.so\./.test(p)),
        "added libjq",
      );
      t.ok(changed.has("/var/lib/dpkg/status"), "dpkg's status changed");
      t.notOk(added.has("/swapfile"), "the swap file was removed");
      t.comment(`the VM's disk differs from the image in ${diff.entries.length} paths`);
    });
  });

  await t.test("an nspawn node installs from the same local mirror", async (t) => {
    const node = await nodeForTest(t);
    const server = await serveRepo(repo.dir, node.hostAddress);
    t.teardown(() => server.close());
    const r = await installJq(node, server.sourcesLine);
    t.equal(r.exitCode, 0, r.exitCode ? r.stderr : "apt-get install jq");
    t.match(r.stdout, /^jq-1\.6/m, "jq runs");
    t.ok(
      server.served.some((p) => /^\/jq_[^/]+\.deb$/.test(p)),
      "the node fetched jq from the mirror",
    );
    await node.stop();
    const added = new Set((await node.diff()).entries.filter((e) => e.kind === "added").map((e) => e.path));
    t.ok(added.has("/usr/bin/jq"), "the diff shows /usr/bin/jq");
    t.ok(added.has("/var/lib/dpkg/info/jq.list"), "and dpkg's file list");
  });

  t.comment(`wall time ${Math.round((Date.now() - started) / 1000)} s`);
}
