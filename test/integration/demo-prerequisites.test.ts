// `npm run demo` on a fresh Debian machine: in a fresh `debootstrap --variant=minbase` root
// (nothing installed beyond minbase), the demo's prerequisite check names exactly the Debian
// packages the machine lacks, as a non-root user it says what to install, as root it installs
// them, and then the whole demo passes there.
import t from "tap";
import { realpathSync } from "node:fs";
import path from "node:path";
import { DEMO_PREREQUISITES } from "../../scripts/demo-prerequisites.ts";
import { debianRoot, MINIMAL_PACKAGES } from "../../scripts/lib/debian-root.ts";
import { rootSandbox } from "../../scripts/lib/nspawn-node.ts";

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

  t.test("npm run demo passes on that machine", async (t) => {
    const r = await run([node, path.join(REPO, "scripts/demo.ts")]);
    t.equal(r.exitCode, 0, (r.stderr || r.stdout).slice(-3000));
    t.match(r.stdout, /demo finished: plan exit 2, once exit 0, second plan exit 0/);
  });
}
