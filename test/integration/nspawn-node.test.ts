// The node tooling itself (scripts/lib/nspawn-node.ts): a Debian node booted with systemd as PID 1
// from the cached debootstrap root runs the built agent (no Node.js on the node), reaches a
// service on the host through its veth and nothing else of the host's network, leaves an upper
// dir holding only what systemd writes when nothing else happened, boots side by side with
// another node, and leaves nothing behind when its test process exits or is killed.
import t, { type Test } from "tap";
import { spawn, spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:net";
import os from "node:os";
import path from "node:path";
import { buildDist } from "../../scripts/build.ts";
import { bootNode, nodeForTest, reapStaleNodes, type NspawnNode } from "../../scripts/lib/nspawn-node.ts";
import { debianRoot } from "../../scripts/lib/debian-root.ts";

const root = process.getuid?.() === 0;
if (!root) {
  t.plan(0, "needs root (debootstrap, overlayfs mounts, network namespaces, systemd-nspawn)");
} else {
  // What a Debian node's systemd writes on a boot and a clean poweroff when nothing else
  // happens, plus the two files the tooling writes before boot (hostname, machine id).
  const SYSTEMD_WRITES: [RegExp, string][] = [
    [/^\/etc\/hostname$/, "nspawn-node: the node's name"],
    [/^\/etc\/machine-id$/, "nspawn-node: a machine id per node"],
    [/^\/etc\/\.pwd\.lock$/, "systemd-sysusers takes the shadow lock"],
    [/^\/var\/lib\/systemd\/linger$/, "systemd-logind"],
    [/^\/var\/lib\/systemd\/timers(\/stamp-[\w.-]+\.timer)?$/, "persistent timers' stamps"],
    [/^\/var\/log\/journal\/[0-9a-f]{32}(\/system\.journal)?$/, "journald, persistent storage"],
    [/^\/var\/log\/wtmp$/, "systemd-update-utmp"],
  ];
  const fromSystemd = (p: string) => SYSTEMD_WRITES.some(([re]) => re.test(p));

  /** A TCP server on the host answering every connection with `greeting`. */
  async function greeter(address: string, greeting: string): Promise<{ server: Server; port: number }> {
    const server = createServer((sock) => sock.end(`${greeting}\n`));
    await new Promise<void>((r) => server.listen(0, address, r));
    t.teardown(() => new Promise<void>((r) => server.close(() => r())));
    const a = server.address();
    if (!a || typeof a === "string") throw new Error("no address");
    return { server, port: a.port };
  }

  /** Reads one line from host:port inside the node with bash's /dev/tcp (no curl in the root). */
  const dial = (node: NspawnNode, host: string, port: number) =>
    node.exec(["bash", "-c", `exec 3<>/dev/tcp/${host}/${port} && head -n1 <&3`], { timeoutMs: 20_000 });

  const { dir: lower, built, buildSeconds } = await debianRoot({ log: (l) => t.comment(l) });
  if (built) t.comment(`built the node root in ${buildSeconds} s`);

  const dist = await mkdtemp(path.join(os.tmpdir(), "bashible-dist-"));
  t.teardown(() => rm(dist, { recursive: true, force: true }));
  await buildDist(dist);

  t.test("a booted node runs the agent, reaches the host's service and changes nothing else", async (t) => {
    // The agent is bound read-only over the root's empty /mnt, so it adds nothing to the upper dir.
    const node = await nodeForTest(t, { root: lower, nspawnArgs: [`--bind-ro=${dist}:/mnt`] });
    t.match(node.state, /^(running|degraded)$/);
    t.same(node.failedUnits, [], "no unit fails to start in the node");
    t.equal((await node.exec(["systemctl", "is-system-running"])).stdout.trim(), node.state);
    t.equal((await node.exec(["cat", "/proc/1/comm"])).stdout.trim(), "systemd", "systemd is PID 1");
    t.not((await node.exec(["sh", "-c", "command -v node"])).exitCode, 0, "no Node.js on the node");

    const version = await node.mustExec(["/mnt/bashible", "version"]);
    t.match(version.stdout, /^bashible \d+\.\d+\.\d+ \(node v24\./);
    const facts = JSON.parse((await node.mustExec(["/mnt/bashible", "facts"])).stdout);
    t.equal(facts.hostname, node.name, "facts see the node's hostname");
    t.equal(facts.os.id, "debian");
    t.equal(facts.os.versionId, "12");
    t.ok(
      facts.addresses.some((a: { interface: string; address: string }) => a.address === node.address),
      "facts see the node's veth address",
    );

    const onVeth = await greeter(node.hostAddress, "hello from the host");
    const r = await dial(node, node.hostAddress, onVeth.port);
    t.equal(r.stdout.trim(), "hello from the host", r.stderr);
    // The node has its own network namespace: the host's loopback is not the node's.
    const onLoopback = await greeter("127.0.0.1", "host loopback");
    t.not((await dial(node, "127.0.0.1", onLoopback.port)).exitCode, 0, "the host's loopback is not reachable");

    await node.stop();
    t.notOk(node.running());
    const diff = await node.diff();
    const unexpected = diff.entries.filter((e) => !fromSystemd(e.path));
    t.same(unexpected, [], "the upper dir holds only what systemd writes");
    t.same(diff.users, { added: [], removed: [], changed: [] });
    t.same(diff.groups, { added: [], removed: [], changed: [] });
    t.same(diff.units, []);
    t.comment(`systemd wrote: ${diff.entries.map((e) => e.path).join(" ")}`);
  });

  t.test("the diff reports files, users, groups and units a node changed", async (t) => {
    const node = await nodeForTest(t, { root: lower });
    await node.mustExec(["groupadd", "--system", "testgroup"]);
    await node.mustExec(["useradd", "--create-home", "--uid", "1500", "tester"]);
    await node.writeFile(
      "/etc/systemd/system/hello.service",
      "[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n",
    );
    await node.mustExec(["systemctl", "enable", "hello.service"]);
    await node.mustExec(["rm", "/etc/issue"]);
    await node.stop();
    const diff = await node.diff();
    t.same(diff.users.added, ["tester"]);
    t.same(diff.groups.added.sort(), ["tester", "testgroup"]);
    t.ok(diff.entries.some((e) => e.path === "/home/tester" && e.kind === "added" && e.type === "dir"));
    t.ok(diff.entries.some((e) => e.path === "/etc/issue" && e.kind === "deleted"));
    t.same(
      diff.units.map((u) => `${u.kind} ${u.path}`),
      ["added /etc/systemd/system/hello.service", "added /etc/systemd/system/multi-user.target.wants/hello.service"],
    );
  });

  t.test("writableCgroups: the node's cgroup v1 controllers take a new group (what containerd needs)", async (t) => {
    const plain = await nodeForTest(t, { root: lower });
    const denied = await plain.exec(["mkdir", "/sys/fs/cgroup/memory/bashible-probe"]);
    t.not(denied.exitCode, 0, "nspawn mounts them read-only");
    t.match(denied.stderr, /Read-only file system/);
    const node = await nodeForTest(t, { root: lower, writableCgroups: true });
    for (const c of ["memory", "cpu", "pids"]) {
      await node.mustExec(["mkdir", `/sys/fs/cgroup/${c}/bashible-probe`]);
      await node.mustExec(["rmdir", `/sys/fs/cgroup/${c}/bashible-probe`]);
    }
    t.pass("mkdir and rmdir in memory, cpu and pids");
    // The node's cgroup namespace is rooted at a cgroup of its own: what it creates (containerd's
    // groups) lands below the node's directory on the host, apart from the host's and other nodes'.
    const own = (await node.mustExec(["cat", "/proc/self/cgroup"])).stdout;
    t.match(own, /^\d+:memory:\/$/m, "commands run in the node's own cgroup");
    const hostView = await readFile(`/proc/${node.pid}/cgroup`, "utf8");
    t.match(hostView, new RegExp(`:memory:.*/bashible-nodes/${node.name}$`, "m"), "on the host: bashible-nodes/<name>");
  });

  t.test(
    "kubeletSysctls: the node's network sysctls are writable, the kernel-wide ones it writes stay in the node",
    async (t) => {
      const plain = await nodeForTest(t, { root: lower });
      t.not(
        (await plain.exec(["sh", "-c", "echo 1 >/proc/sys/net/ipv4/ip_forward"])).exitCode,
        0,
        "read-only without it",
      );
      const hostPanic = (await readFile("/proc/sys/kernel/panic", "utf8")).trim();
      const node = await nodeForTest(t, { root: lower, kubeletSysctls: true });
      await node.mustExec(["sh", "-c", "echo 1 >/proc/sys/net/ipv4/ip_forward"]);
      t.equal(
        (await node.mustExec(["cat", "/proc/sys/net/ipv4/ip_forward"])).stdout.trim(),
        "1",
        "net.* is the node's own",
      );
      t.equal(
        (await node.mustExec(["cat", "/proc/sys/kernel/panic"])).stdout.trim(),
        hostPanic,
        "a stand-in starts with the host's value",
      );
      const other = hostPanic === "10" ? "11" : "10";
      await node.mustExec(["sh", "-c", `echo ${other} >/proc/sys/kernel/panic`]);
      t.equal(
        (await node.mustExec(["cat", "/proc/sys/kernel/panic"])).stdout.trim(),
        other,
        "the node reads what it wrote",
      );
      t.equal(
        (await readFile("/proc/sys/kernel/panic", "utf8")).trim(),
        hostPanic,
        "the host's kernel.panic is untouched",
      );
    },
  );

  t.test("copyRoot and restartOnReboot: a node on a disk of its own comes back after a reboot", async (t) => {
    const node = await nodeForTest(t, { root: lower, copyRoot: true, restartOnReboot: true, kubeletSysctls: true });
    t.notOk((await node.mustExec(["findmnt", "-n", "-o", "FSTYPE", "/"])).stdout.includes("overlay"), "not an overlay");
    await node.writeFile("/etc/probe.conf", "kept\n");
    await node.writeFile("/run/probe", "gone after a reboot\n");
    await node.mustExec(["useradd", "--uid", "1501", "copier"]);
    const firstPid = node.pid;
    await node.mustExec(["systemctl", "reboot"]).catch(() => undefined);
    t.equal(await node.waitBoot(2, 120_000).then(() => node.boots), 2, "booted a second time");
    t.not(node.pid, firstPid, "with a new PID 1");
    t.equal((await node.mustExec(["cat", "/etc/probe.conf"])).stdout, "kept\n", "the disk kept its files");
    t.not((await node.exec(["test", "-e", "/run/probe"])).exitCode, 0, "/run is new");
    await node.mustExec(["sh", "-c", "echo 1 >/proc/sys/net/ipv4/ip_forward"]);
    t.pass("the options are applied again after the reboot");
    await node.mustExec(["sh", "-c", "cp /etc/issue /tmp/issue && cat /tmp/issue >/etc/issue && touch /etc/issue"]);
    await node.stop();
    const diff = await node.diff();
    const paths = diff.entries.map((e) => `${e.kind} ${e.path}`);
    t.ok(paths.includes("added /etc/probe.conf"), "the diff walks the copy");
    t.notOk(
      paths.some((p) => p.startsWith("added /run")),
      "nothing of the node's tmpfs /run",
    );
    t.same(diff.users.added, ["copier"]);
    t.notOk(paths.includes("changed /etc/issue"), "a file rewritten with the same bytes is not a change");
  });

  t.test("two nodes boot side by side, each with its own address, both reach the host", async (t) => {
    const [a, b] = await Promise.all([nodeForTest(t, { root: lower }), nodeForTest(t, { root: lower })]);
    t.not(a.name, b.name);
    t.not(a.address, b.address);
    t.not(a.upper, b.upper);
    for (const node of [a, b]) {
      const { port } = await greeter(node.hostAddress, node.name);
      t.equal((await dial(node, node.hostAddress, port)).stdout.trim(), node.name);
    }
    // Files copied into one node are not in the other.
    const tmp = await mkdtemp(path.join(os.tmpdir(), "bashible-copy-"));
    t.teardown(() => rm(tmp, { recursive: true, force: true }));
    const file = path.join(tmp, "note");
    await writeFile(file, "only in a\n", { mode: 0o640 });
    await a.copyIn(file, "/root/note");
    await a.copyIn(file, "/tmp/note"); // the node's own /tmp, not the host-visible rootfs
    t.equal((await a.mustExec(["stat", "-c", "%a %s", "/root/note"])).stdout.trim(), "640 10");
    t.equal((await a.mustExec(["cat", "/tmp/note"])).stdout, "only in a\n");
    t.not((await b.exec(["test", "-e", "/root/note"])).exitCode, 0);
  });

  /** A process that boots a node, prints it, then ends as `how` says. */
  function ownerProcess(how: "exit" | "hang"): Promise<{ child: ReturnType<typeof spawn>; node: NspawnNode }> {
    const lib = path.resolve(import.meta.dirname, "../../scripts/lib/nspawn-node.ts");
    const code = `
      import { bootNode } from ${JSON.stringify(lib)};
      const n = await bootNode({ root: ${JSON.stringify(lower)} });
      console.log(JSON.stringify(n));
      ${how === "exit" ? "process.exit(3);" : "setInterval(() => {}, 1000);"}
    `;
    const child = spawn(process.execPath, ["--input-type=module", "-e", code], {
      stdio: ["ignore", "pipe", "inherit"],
    });
    return new Promise((resolve, reject) => {
      let out = "";
      child.stdout?.on("data", (d: Buffer) => {
        out += d;
        if (out.includes("\n")) resolve({ child, node: JSON.parse(out) as NspawnNode });
      });
      child.once("exit", (code) => (out.includes("\n") ? undefined : reject(new Error(`owner exited ${code}`))));
    });
  }

  function gone(t: Test, node: NspawnNode): void {
    const netns = spawnSync("ip", ["netns", "list"], { encoding: "utf8" }).stdout;
    t.notMatch(netns, `bashible-${node.name}`, "network namespace removed");
    t.not(spawnSync("ip", ["link", "show", node.hostInterface]).status, 0, "host veth removed");
    t.notOk(existsSync(node.dir), "temp dir removed");
    const cgroups = spawnSync("find", ["/sys/fs/cgroup", "-maxdepth", "6", "-type", "d", "-name", node.name], {
      encoding: "utf8",
    }).stdout;
    t.equal(cgroups, "", "the node's cgroups removed");
    // Gone, or a zombie its new parent has not reaped yet: either way nothing runs.
    const stat = spawnSync("cat", [`/proc/${node.pid}/stat`], { encoding: "utf8" }).stdout;
    t.ok(stat === "" || / Z /.test(stat), "the node's systemd is gone");
  }

  t.test("a test process that exits without disposing its node leaves nothing behind", async (t) => {
    const { child, node } = await ownerProcess("exit");
    await new Promise((r) => (child.exitCode !== null ? r(undefined) : child.once("exit", r)));
    t.equal(child.exitCode, 3);
    gone(t, node);
  });

  t.test("a node whose test process was killed is reaped (every boot reaps first)", async (t) => {
    const { child, node } = await ownerProcess("hang");
    child.kill("SIGKILL");
    await new Promise((r) => child.once("exit", r));
    t.ok(existsSync(`/proc/${node.pid}`), "the orphaned node still runs");
    t.ok((await reapStaleNodes()).includes(node.name));
    gone(t, node);
  });

  t.test("a node that cannot boot fails with its boot log and cleans up", async (t) => {
    const empty = await mkdtemp(path.join(os.tmpdir(), "bashible-empty-root-"));
    t.teardown(() => rm(empty, { recursive: true, force: true }));
    await mkdir(path.join(empty, "etc")); // a tree with no OS in it: nspawn refuses to boot it
    const name = `bn-fail${process.pid % 1000}`;
    await t.rejects(bootNode({ root: empty, name, bootTimeoutMs: 20_000 }), /nspawn exited during boot/);
    const leftovers = spawnSync("ip", ["netns", "list"], { encoding: "utf8" }).stdout;
    t.notMatch(leftovers, `bashible-${name}`, "no network namespace left");
    t.notMatch((await readdir(os.tmpdir())).join(" "), `bashible-node-${name}-`, "no temp dir left");
  });
}
