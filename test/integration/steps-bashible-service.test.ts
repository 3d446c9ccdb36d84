// The agent's own step in a sandbox tree, with real agent builds served by a real registry and
// the registry-packages proxy: a new agent is run in check mode (`bashible version`, `bashible
// plan` against the bundle) before /opt/deckhouse/lib/bashible flips to it, the previous release
// stays, the service is reloaded (which restarts it after the converge); a new agent that fails
// its check is refused and reported, and the running one stays. The units pass systemd-analyze
// verify, and the cleanup script is rewritten on every run.
import t, { type Test } from "tap";
import { cp, lstat, mkdir, mkdtemp, readdir, readFile, readlink, rm, writeFile } from "node:fs/promises";
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { buildDist } from "../../scripts/build.ts";
import { writePackage } from "../../scripts/package.ts";
import { withProxy, type ProxyFixture } from "../../scripts/lib/packages-proxy.ts";
import { stepEnv, type StepEnv } from "../fixtures/steps.ts";
import { makeBundle } from "../../scripts/lib/bundle.ts";
import { PATHS } from "../../bundles/paths.ts";
import type { BundleStep, RegistryPackageRef } from "../../bundles/types.ts";
import { LAUNCHER_CONTENT, linkTarget } from "../../steps/bashible-service.ts";

const skip =
  process.getuid?.() !== 0
    ? "needs root (files are written root-owned)"
    : !existsSync("/usr/bin/systemd-analyze")
      ? "needs systemd-analyze (apt-get install systemd)"
      : false;

const CLEANUP = "#!/bin/bash\necho cleanup for worker\n";

interface Built {
  dir: string;
  /** An agent tree (dist) whose launcher works. */
  good: string;
}

async function agentPackage(f: ProxyFixture, out: string, dist: string, version: string): Promise<RegistryPackageRef> {
  const pkg = await writePackage(
    {
      name: "bashible",
      version,
      description: `the bashible agent ${version} (test)`,
      trees: [{ src: dist, dest: "/opt/deckhouse/lib/bashible" }],
      generated: [{ dest: "/opt/deckhouse/bin/bashible", content: LAUNCHER_CONTENT, mode: 0o755 }],
    },
    out,
  );
  const pushed = await f.registry.pushOciLayout("deckhouse/packages", pkg.dir);
  return { name: "bashible", digest: pushed.digest, repository: "deckhouse/packages" };
}

const agentStep = (agent: RegistryPackageRef, cleanupScript = CLEANUP): BundleStep => ({
  name: "080_setup_bashible_service",
  kind: "BashibleService",
  spec: { agent, cleanupScript },
});

const actions = async (env: StepEnv) =>
  (await readFile(path.join(env.root, PATHS.sandboxActions), "utf8").catch(() => ""))
    .split("\n")
    .filter(Boolean)
    .map((l) => l.replace(/^\S+ /, ""));

/** What bootstrap phase 2 does: the package's install on the tree, its digest recorded. */
function bootstrapInstall(root: string, layout: string, digest: string): void {
  const work = execFileSync("mktemp", ["-d"], { encoding: "utf8" }).trim();
  try {
    const index = JSON.parse(execFileSync("cat", [path.join(layout, "index.json")], { encoding: "utf8" }));
    const manifest = JSON.parse(
      execFileSync("cat", [path.join(layout, "blobs/sha256", index.manifests[0].digest.slice(7))], {
        encoding: "utf8",
      }),
    );
    const layer = path.join(layout, "blobs/sha256", manifest.layers[0].digest.slice(7));
    execFileSync("tar", ["-xzf", layer, "-C", work]);
    execFileSync("bash", ["./install"], { cwd: work, env: { ...process.env, D8_ROOT: root } });
    execFileSync("mkdir", ["-p", path.join(root, PATHS.packageStore, "bashible")]);
    execFileSync("sh", ["-c", `echo ${digest} > ${path.join(root, PATHS.packageStore, "bashible/digest")}`]);
  } finally {
    execFileSync("rm", ["-rf", work]);
  }
}

async function build(t: Test): Promise<Built> {
  const dir = await mkdtemp(path.join(os.tmpdir(), "agent-update-"));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const good = path.join(dir, "dist");
  await buildDist(good);
  return { dir, good };
}

t.test("the agent updates itself only to a release that passes its check", { skip }, async (t) => {
  const f = await withProxy(t);
  const { dir, good } = await build(t);
  const layouts = path.join(dir, "layouts");
  const a = await agentPackage(f, path.join(layouts, "a"), good, "1.0.0-a");
  const b = await agentPackage(f, path.join(layouts, "b"), good, "1.0.0-b");
  // c: its launcher does not run at all.
  const brokenLauncher = path.join(dir, "dist-c");
  await cp(good, brokenLauncher, { recursive: true });
  await writeFile(path.join(brokenLauncher, "bashible"), "#!/bin/sh\necho 'exec format error (test)' >&2\nexit 126\n");
  const c = await agentPackage(f, path.join(layouts, "c"), brokenLauncher, "1.0.0-c");
  // d: answers `version`, cannot plan.
  const cannotPlan = path.join(dir, "dist-d");
  await cp(good, cannotPlan, { recursive: true });
  const launcher = path.join(cannotPlan, "bashible");
  await writeFile(
    launcher,
    (await readFile(launcher, "utf8")).replace(
      /^case "\$1" in/m,
      'for a in "$@"; do [ "$a" = plan ] && { echo "plan: cannot read this bundle (test)" >&2; exit 1; }; done\ncase "$1" in',
    ),
  );
  const d = await agentPackage(f, path.join(layouts, "d"), cannotPlan, "1.0.0-d");

  const env = await stepEnv(t);
  const o = { context: { packagesProxy: { endpoints: [f.endpoint], token: f.token }, clusterCA: f.clusterCA } };
  bootstrapInstall(env.root, path.join(layouts, "a/bashible"), a.digest);
  const agentDir = path.join(env.root, PATHS.agentDir);
  t.ok((await lstat(agentDir)).isDirectory(), "the bootstrap installed a tree");

  // a → b: checked, flipped, a kept.
  const toB = agentStep(b);
  const plan = (await env.planRun([toB], o))[0]!;
  t.notOk(plan.error, plan.error ?? "planned");
  t.match(
    plan.changes.map((c) => c.summary).join("\n"),
    /update the agent sha256:.{12} → sha256:.{12} .* checked with 'bashible version' and 'bashible plan'/,
  );
  const applied = await env.apply(toB, o);
  t.equal(applied.outcome, "changed", applied.error ?? "");
  t.same(applied.problems ?? [], []);
  t.ok((await lstat(agentDir)).isSymbolicLink(), "the agent's directory is a link now");
  t.equal(await readlink(agentDir), linkTarget(b.digest));
  t.equal(
    execFileSync(path.join(agentDir, "bashible"), ["version"], { encoding: "utf8" }).length > 0,
    true,
    "and the agent behind it runs",
  );
  const releases = (await readdir(path.join(env.root, PATHS.agentReleases))).sort();
  t.same(releases, [a.digest.slice(7), b.digest.slice(7)].sort(), "the previous release is kept");
  t.equal(await readFile(path.join(env.root, PATHS.agentLauncher), "utf8"), LAUNCHER_CONTENT);
  t.equal((await readFile(path.join(env.root, PATHS.packageStore, "bashible/digest"), "utf8")).trim(), b.digest);
  t.equal(await readFile(path.join(env.root, PATHS.cleanupScript), "utf8"), CLEANUP);
  t.ok(existsSync(path.join(env.root, "etc/systemd/system/bashible.service")));
  t.ok(existsSync(path.join(env.root, "etc/systemd/system/bashible-restart.service")));
  t.same(await actions(env), [
    "systemctl daemon-reload",
    "systemctl start bashible.service",
    "systemctl reload bashible.service",
  ]);
  t.same((await env.plan(toB, o)).changes, [], "a second run plans nothing");
  t.equal((await env.apply(toB, o)).outcome, "unchanged");
  t.equal((await actions(env)).length, 3, "and reloads nothing");

  // b → c: c's launcher fails `bashible version`: refused, b stays.
  for (const [ref, why] of [
    [c, /'bashible version' of the new agent exited 126: exec format error \(test\)/],
    [d, /'bashible plan' of the new agent against this bundle exited 1: .*plan: cannot read this bundle \(test\)/],
  ] as const) {
    const r = await env.apply(agentStep(ref), o);
    t.equal(r.outcome, "unchanged", "the step goes on; the update is a problem of its own");
    t.match(r.problems?.[0], { subject: "agent update", message: why });
    t.equal(await readlink(agentDir), linkTarget(b.digest), "the running agent stays");
    t.notOk(existsSync(path.join(env.root, PATHS.agentReleases, ref.digest.slice(7))), "nothing of it is left");
    const again = await env.plan(agentStep(ref), o);
    t.same(again.changes, [], "the same bundle does not try it again");
    t.match(again.problems[0]?.message, /was refused at .*: .*; the running agent sha256:[0-9a-f]{12} stays/);
    t.equal((await actions(env)).length, 3, "nothing reloaded");
  }

  // The cleanup script is put back on every run.
  await writeFile(path.join(env.root, PATHS.cleanupScript), "#!/bin/bash\nedited\n");
  const back = await env.plan(toB, o);
  t.same(
    back.changes.map((c) => c.summary),
    [`update ${PATHS.cleanupScript}: content`],
  );
});

t.test("no agent installed and nothing to install: a problem, no unit", { skip }, async (t) => {
  const env = await stepEnv(t);
  const ref = { name: "bashible", digest: `sha256:${"e".repeat(64)}`, repository: "deckhouse/packages" };
  const dir = path.join(env.root, PATHS.agentReleases);
  // A refusal recorded for this bundle: nothing is tried.
  const bundle = makeBundle([agentStep(ref)]);
  await mkdir(dir, { recursive: true });
  await writeFile(
    path.join(dir, `${"e".repeat(64)}.refused`),
    JSON.stringify({ bundle: bundle.checksum, reason: "test", at: "2026-01-01T00:00:00Z" }),
  );
  const plan = await env.plan(agentStep(ref));
  t.match(
    plan.problems.map((p) => p.message).join("\n"),
    /no agent is installed at \/opt\/deckhouse\/lib\/bashible; bashible.service is not set up/,
  );
  t.notOk(plan.changes.some((c) => c.kind === "file" && c.path.endsWith("bashible.service")));
});
