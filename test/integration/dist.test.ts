// dist/bashible is self-contained: it runs with an empty PATH (no node to find), prints help
// and its version, and keeps the exit-code contract.
import t from "tap";
import { spawnSync } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { buildDist, bundleAgent, nodeBinary } from "../../scripts/build.ts";
import pkg from "../../package.json" with { type: "json" };

const dist = await mkdtemp(path.join(os.tmpdir(), "bashible-dist-"));
t.teardown(() => rm(dist, { recursive: true, force: true }));
await buildDist(dist);
const bin = path.join(dist, "bashible");

// env -i: nothing inherited, PATH empty, so no node could be found even if one existed.
const run = (...args: string[]) => spawnSync(bin, args, { env: { PATH: "" }, encoding: "utf8" });

t.test("runs with an empty PATH on its own Node 24 runtime", async (t) => {
  const r = run("version", "--json");
  t.equal(r.status, 0, r.stderr);
  const info = JSON.parse(r.stdout);
  t.match(info.node, /^v24\./);
  t.equal(info.version, pkg.version, "an unstamped build says package.json's version");
});

t.test("a build stamped with its own version says it", async (t) => {
  const app = await mkdtemp(path.join(os.tmpdir(), "bashible-stamped-"));
  t.teardown(() => rm(app, { recursive: true, force: true }));
  await bundleAgent(app, "9.9.9-stamped.1");
  const r = spawnSync(nodeBinary(), [path.join(app, "main.mjs"), "version", "--json"], { encoding: "utf8" });
  t.equal(r.status, 0, r.stderr);
  t.equal(JSON.parse(r.stdout).version, "9.9.9-stamped.1");
  const bad = spawnSync(
    nodeBinary(),
    [path.resolve(import.meta.dirname, "../../scripts/build.ts"), "--version", "1.0 rc"],
    {
      encoding: "utf8",
    },
  );
  t.equal(bad.status, 2, "a version with a space is refused before anything is built");
  t.match(bad.stderr, /--version '1\.0 rc' is not a version/);
});

t.test("--help lists the commands and every command has --help", async (t) => {
  const r = run("--help");
  t.equal(r.status, 0);
  t.match(r.stdout, /facts/);
  t.match(r.stdout, /Exit codes: 0 ok, 1 error, 2 changes pending/);
  for (const cmd of ["facts", "version"]) {
    const h = run(cmd, "--help");
    t.equal(h.status, 0, `${cmd} --help`);
    t.match(h.stdout, new RegExp(`usage: bashible ${cmd}`));
  }
});

t.test("facts prints JSON with the bundle family", async (t) => {
  const r = run("facts");
  const f = JSON.parse(r.stdout);
  t.ok(f.bootId, "boot id");
  t.ok(["debian", "rhel", "altlinux", null].includes(f.os.family));
  t.ok([1, 2].includes(f.cgroup.version));
});

t.test("bad usage exits 1 with a hint, not a stack trace", async (t) => {
  const unknown = run("frobnicate");
  t.equal(unknown.status, 1);
  t.match(unknown.stderr, /unknown command 'frobnicate'/);
  const badFlag = run("facts", "--nope");
  t.equal(badFlag.status, 1);
  t.match(badFlag.stderr, /bashible facts --help/);
  t.notMatch(badFlag.stderr, /at .*\.mjs/);
});

t.test("the bundled agent reads kubeconfigs and reports an unreachable API server by name", async (t) => {
  const root = await mkdtemp(path.join(os.tmpdir(), "bashible-dist-root-"));
  t.teardown(() => rm(root, { recursive: true, force: true }));
  const { mkdir, writeFile } = await import("node:fs/promises");
  await mkdir(path.join(root, "etc"));
  await writeFile(path.join(root, "etc/os-release"), "ID=debian\n");
  const kubeconfig = path.join(root, "kubeconfig");
  await writeFile(
    kubeconfig,
    `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", certificate-authority-data: "YWJj"}}]
users: [{name: u, user: {token: not-a-secret-for-logs}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`,
  );
  const r = run("once", "--root", root, "--kubeconfig", kubeconfig);
  t.equal(r.status, 1);
  t.match(r.stdout, /connection refused by https:\/\/127\.0\.0\.1:1/);
  t.match(r.stdout, /pass --node-group/);
  t.notMatch(r.stdout + r.stderr, /not-a-secret-for-logs/);
  t.notMatch(r.stdout, /"stack"/, "no stack traces for errors users can act on");
});

t.test("the launcher refuses clearly when its runtime is missing", async (t) => {
  const lonely = await mkdtemp(path.join(os.tmpdir(), "bashible-lonely-"));
  t.teardown(() => rm(lonely, { recursive: true, force: true }));
  const { copyFile } = await import("node:fs/promises");
  await copyFile(bin, path.join(lonely, "bashible"));
  const r = spawnSync(path.join(lonely, "bashible"), ["version"], { env: { PATH: "" }, encoding: "utf8" });
  t.equal(r.status, 1);
  t.match(r.stderr, /runtime not found/);
});
