// `npm run demo` on a fresh Debian machine: in a fresh `debootstrap --variant=minbase` root
// (nothing installed beyond minbase), the demo's prerequisite check names exactly the Debian
// packages the machine lacks, as a non-root user it says what to install, as root it installs
// them, and then the whole demo passes there. Installing changes the machine no more than that:
// docker-registry's own service (Debian enables and starts it, serving :5000 on every
// interface) is not started and left disabled, on that machine without an init and on a booted
// one with systemd; one the machine already had keeps its state.
import t from "tap";
import { realpathSync } from "node:fs";
import path from "node:path";
import { DEMO_PREREQUISITES } from "../../scripts/demo-prerequisites.ts";
import { debianRoot, MINIMAL_PACKAGES } from "../../scripts/lib/debian-root.ts";
import { localDebianRepo, serveRepo } from "../../scripts/lib/debian-mirror.ts";
import { nodeForTest, rootSandbox } from "../../scripts/lib/nspawn-node.ts";

if (process.getuid?.() !== 0) {
  t.plan(0, "needs root (debootstrap, overlayfs, systemd-nspawn)");
} else {
  const REPO = path.resolve(import.meta.dirname, "../..");
  const node = realpathSync(process.execPath);
  // The repository, its dependencies and the Node runtime at the same paths inside, read-only.
  const binds = [...new Set([REPO, realpathSync(path.join(REPO, "node_modules")), path.dirname(node)])].map(
    (p) => `${p}:${p}`,
  );
  const check = path.join(REPO, "scripts/demo-prerequisites.ts");

  const fresh = await debianRoot({ packages: MINIMAL_PACKAGES, log: (l) => t.comment(l) });
  const sb = await rootSandbox(fresh.dir);
  t.teardown(() => sb.dispose());
  const run = (argv: string[], user?: string) => sb.run(argv, { binds, timeoutMs: 300_000, ...(user ? { user } : {}) });
  const installed = async (pkg: string) =>
    // biome-ignore lint/suspicious/noTemplateCurlyInString: dpkg-query's format syntax, not a template
    (await run(["dpkg-query", "-W", "-f=${Status}", pkg])).stdout.includes("install ok installed");

  const prerequisitePackages = [...new Set(DEMO_PREREQUISITES.map((p) => p.pkg))].sort();
  const absent: string[] = [];
  for (const pkg of prerequisitePackages) if (!(await installed(pkg))) absent.push(pkg);

  t.test("the check names exactly the packages a fresh machine lacks", async (t) => {
    t.ok(absent.length > 0, `a minbase root lacks some (${absent.join(", ")})`);
    t.ok(absent.includes("sudo"), "visudo's package is among them (the failure issue 8 found)");
    const r = await run([node, check, "--check"], "nobody");
    t.equal(r.exitCode, 1, r.stderr);
    t.match(r.stderr, `install them as root: apt-get install -y --no-install-recommends ${absent.join(" ")}\n`);
    for (const p of DEMO_PREREQUISITES) {
      const named = r.stderr.includes(`  ${p.program} (Debian package ${p.pkg})`);
      t.equal(named, absent.includes(p.pkg), `${p.program} named iff ${p.pkg} is not installed`);
    }
  });

  t.test("without root it installs nothing and says what to install", async (t) => {
    const r = await run([node, check], "nobody");
    t.equal(r.exitCode, 1);
    t.match(r.stderr, `apt-get install -y --no-install-recommends ${absent.join(" ")}`);
    for (const pkg of absent) t.notOk(await installed(pkg), `${pkg} still absent`);
  });

  t.test("as root it installs them, and then every program is there", async (t) => {
    const r = await run([node, check]);
    t.equal(r.exitCode, 0, r.stderr.slice(-2000));
    t.match(r.stdout, `installed ${absent.join(", ")}; all present`);
    for (const pkg of prerequisitePackages) t.ok(await installed(pkg), `${pkg} installed`);
    for (const p of DEMO_PREREQUISITES) {
      const found = await run(["sh", "-c", `PATH=/usr/sbin:/usr/bin:/sbin:/bin command -v ${p.program}`]);
      t.equal(found.exitCode, 0, `${p.program} on PATH`);
    }
    const again = await run([node, check, "--check"], "nobody");
    t.equal(again.exitCode, 0);
    t.match(again.stdout, /all present/);
    const second = await run([node, check]);
    t.notMatch(second.stdout, /installed/, "a second run as root installs nothing");
  });

  t.test("on that machine (no init) docker-registry's service was not started and is not enabled", async (t) => {
    // The install above ran in an earlier container; its state is in the root's files.
    const r = await run(["sh", "-c", "ls /etc/rc2.d; systemctl is-enabled docker-registry.service; ls /usr/sbin"]);
    t.match(r.stdout, /^K\d\ddocker-registry$/m, "its sysv link is a stop link");
    t.notMatch(r.stdout, /^S\d\ddocker-registry$/m);
    t.match(r.stdout, /^disabled$/m, "its unit is disabled");
    t.notMatch(r.stdout, /^policy-rc\.d$/m, "no policy-rc.d left behind");
  });

  t.test("on a booted machine (systemd) the install leaves docker-registry's service off", async (t) => {
    // A node: systemd as PID 1, installing from a local mirror of what docker-registry needs
    // (and logrotate, which the node's root lacks too).
    const repo = await localDebianRepo({ packages: ["docker-registry", "logrotate"], log: (l) => t.comment(l) });
    const machine = await nodeForTest(t, { nspawnArgs: binds.map((b) => `--bind-ro=${b}`) });
    const server = await serveRepo(repo.dir, machine.hostAddress);
    t.teardown(() => server.close());
    await machine.writeFile("/etc/apt/sources.list", `${server.sourcesLine}\n`);
    await machine.mustExec(["apt-get", "update", "-q"]);
    const state = async () =>
      (
        await machine.exec([
          "sh",
          "-c",
          "echo enabled=$(systemctl is-enabled docker-registry.service) active=$(systemctl is-active docker-registry.service) policy=$(test -e /usr/sbin/policy-rc.d && echo present || echo absent)",
        ])
      ).stdout.trim();
    const r = await machine.exec([node, check], { timeoutMs: 600_000 });
    t.equal(r.exitCode, 0, r.stderr.slice(-2000));
    t.match(r.stdout, /installed docker-registry(, logrotate)?; all present/);
    t.match(r.stdout, "demo: left docker-registry's own service disabled and stopped");
    t.equal(await state(), "enabled=disabled active=inactive policy=absent");
    const ss = await machine.exec(["sh", "-c", "grep -ci ':1388 [0-9A-F:]* 0A' /proc/net/tcp /proc/net/tcp6 || true"]);
    t.match(ss.stdout, /tcp:0\n.*tcp6:0/s, "nothing listens on :5000");

    // A machine that had the package and runs its service keeps it as it was.
    await machine.mustExec(["systemctl", "enable", "--now", "docker-registry.service"]);
    t.equal(await state(), "enabled=enabled active=active policy=absent");
    const again = await machine.exec([node, check]);
    t.equal(again.exitCode, 0, again.stderr);
    t.equal(await state(), "enabled=enabled active=active policy=absent", "the machine's own service is left alone");
  });

  t.test("npm run demo passes on that machine", async (t) => {
    const r = await run([node, path.join(REPO, "scripts/demo.ts")]);
    t.equal(r.exitCode, 0, (r.stderr || r.stdout).slice(-3000));
    t.match(r.stdout, /demo finished: plan exit 2, once exit 0, second plan exit 0/);
  });
}
