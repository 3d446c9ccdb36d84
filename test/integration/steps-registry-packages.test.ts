// RegistryPackages against a real docker-registry behind the real registry-packages proxy,
// in sandbox trees (Debian and a RHEL-family layout): install in list order, skip what is
// installed, upgrade, remove with uninstall, and refuse tampered, truncated and lying downloads
// while the installed version stays.
import t, { type Test } from "tap";
import { execFile } from "node:child_process";
import { mkdir, open, readdir, readFile, writeFile } from "node:fs/promises";
import https from "node:https";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { promisify } from "node:util";
import { withProxy } from "../fixtures/packages-proxy.ts";
import { binaryPackage, buildLayer } from "../fixtures/registry.ts";
import { OS_RELEASE, stepEnv, type StepEnv } from "../fixtures/steps.ts";
import { treeHash } from "../fixtures/bundle.ts";
import step, {
  DOWNLOADS,
  fetchPolicy,
  PackageFetchError,
  STORE,
  PackageInstallError,
} from "../../steps/registry-packages.ts";
import type { BundleStep, RegistryPackageRef } from "../../bundles/types.ts";
import type { PackageChange } from "../../steps/types.ts";
import { freePort } from "../lib/control-plane.ts";

const execFileP = promisify(execFile);
Object.assign(fetchPolicy, { attempts: 2, baseDelayMs: 20, maxDelayMs: 50, idleTimeoutMs: 5000 });

const f = await withProxy(t);
const REPO = "deckhouse/packages";

async function pkg(name: string, version: string, extra = 0): Promise<RegistryPackageRef> {
  const layer = await buildLayer(binaryPackage(name, version, extra));
  const { digest } = await f.registry.pushPackage(`${REPO}/${name}`, version, layer);
  return { name, digest, repository: `${REPO}/${name}` };
}

const bundleStep = (packages: RegistryPackageRef[]): BundleStep & { kind: "RegistryPackages" } => ({
  name: "007_registry_packages",
  kind: "RegistryPackages",
  spec: { packages },
});

function ctxFor(env: StepEnv, packages: RegistryPackageRef[], endpoints = [f.endpoint], over = {}) {
  return env.ctx(bundleStep(packages), {
    context: { clusterCA: f.clusterCA, packagesProxy: { endpoints, token: f.token }, ...over },
  });
}

async function converge(env: StepEnv, packages: RegistryPackageRef[], endpoints = [f.endpoint]) {
  const spec = { packages };
  const ctx = ctxFor(env, packages, endpoints);
  const changes = await step.plan(spec, env.host, ctx);
  const result = await step.apply(changes, spec, env.host, ctx);
  return { changes, result };
}

async function run(env: StepEnv, name: string): Promise<string> {
  const { stdout } = await execFileP(path.join(env.root, "opt/deckhouse/bin", name));
  return stdout.trim();
}

const events = async (env: StepEnv) =>
  (await readFile(path.join(env.root, "var/log/pkg-events.log"), "utf8").catch(() => "")).trim().split("\n");

t.test("installs listed packages in list order, and a second run plans nothing (Debian)", async (t) => {
  const env = await stepEnv(t);
  const [jq, yq, curl] = await Promise.all([pkg("jq", "1"), pkg("yq", "1"), pkg("curl", "1")]);
  const list = [yq as RegistryPackageRef, jq as RegistryPackageRef, curl as RegistryPackageRef];
  const before = await treeHash(env.root);
  const changes = await step.plan({ packages: list }, env.host, ctxFor(env, list));
  t.equal(await treeHash(env.root), before, "plan changes nothing on disk");
  t.same(
    changes.map((c) => [(c as PackageChange).action, (c as PackageChange).name, (c as PackageChange).digest]),
    list.map((p) => ["install", p.name, p.digest]),
  );
  t.match(changes[0]?.summary, /^install package yq sha256:[0-9a-f]{12} from deckhouse\/packages\/yq$/);
  const result = await step.apply(changes, { packages: list }, env.host, ctxFor(env, list));
  t.same(result?.outputs, { installed: ["yq", "jq", "curl"], skipped: [], removed: [] });
  t.same(await events(env), ["yq 1", "jq 1", "curl 1"], "install ran in list order");
  t.equal(await run(env, "jq"), "1");
  for (const p of list) {
    t.equal((await readFile(path.join(env.root, STORE, p.name, "digest"), "utf8")).trim(), p.digest);
    t.ok(await readFile(path.join(env.root, STORE, p.name, "uninstall"), "utf8"));
  }
  t.same(
    (await readdir(path.join(env.root, DOWNLOADS), { recursive: true }).catch(() => [])).filter((n) => n.includes(".")),
    [],
    "downloads are cleaned up",
  );
  const again = await step.plan({ packages: list }, env.host, ctxFor(env, list));
  t.same(again, [], "a second run plans nothing");
  const fetchesBefore = f.proxy.stats.requests;
  const r2 = await step.apply(again, { packages: list }, env.host, ctxFor(env, list));
  t.same(r2?.outputs, { installed: [], skipped: ["yq", "jq", "curl"], removed: [] });
  t.equal(f.proxy.stats.requests, fetchesBefore, "a package whose digest matches is not downloaded");
});

t.test("upgrades a package whose digest changed and removes one no longer listed (RHEL layout)", async (t) => {
  const env = await stepEnv(t, OS_RELEASE.rocky);
  t.equal(env.host.os.family, "rhel");
  const [a1, b1, a2] = await Promise.all([pkg("alpha", "1"), pkg("beta", "1"), pkg("alpha", "2")]);
  await converge(env, [a1 as RegistryPackageRef, b1 as RegistryPackageRef]);
  t.equal(await run(env, "alpha"), "1");
  const { changes, result } = await converge(env, [a2 as RegistryPackageRef]);
  t.same(
    changes.map((c) => `${(c as PackageChange).action} ${(c as PackageChange).name}`),
    ["remove beta", "upgrade alpha"],
  );
  t.match(changes[1]?.summary, /upgrade package alpha sha256:[0-9a-f]{12} → sha256:[0-9a-f]{12}/);
  t.same(result?.outputs, { installed: ["alpha"], skipped: [], removed: ["beta"] });
  t.equal(await run(env, "alpha"), "2");
  t.notOk(await open(path.join(env.root, "opt/deckhouse/bin/beta")).catch(() => undefined), "beta's uninstall ran");
  t.same(await readdir(path.join(env.root, STORE)), ["alpha"]);
  t.match(await events(env), ["alpha 1", "beta 1", "uninstalled beta", "alpha 2"]);
  t.same(await step.plan({ packages: [a2 as RegistryPackageRef] }, env.host, ctxFor(env, [])), []);
});

t.test("a tampered package is refused and the installed version stays", async (t) => {
  const env = await stepEnv(t);
  const v1 = await pkg("tamperme", "1");
  await converge(env, [v1]);
  const v2 = await pkg("tamperme", "2", 32 << 10);
  const fh = await open(f.registry.blobPath(v2.digest), "r+");
  await fh.write(Buffer.from("evil bytes here!"), 0, 16, 2000);
  await fh.close();
  const err = await converge(env, [v2]).catch((e) => e);
  t.type(err, PackageFetchError);
  t.match(err.message, /package tamperme .*could not be fetched.*HTTP 502.*failed verification/s);
  t.notMatch(err.message, f.token, "the token is not in the error");
  t.equal(await run(env, "tamperme"), "1", "the installed version stays");
  t.equal((await readFile(path.join(env.root, STORE, "tamperme/digest"), "utf8")).trim(), v1.digest);
  t.same(await readdir(path.join(env.root, DOWNLOADS, "tamperme")).catch(() => []), [], "nothing half-downloaded");
});

/** An HTTPS endpoint with the proxy's certificate that misbehaves in a given way. */
async function liar(t: Test, mode: "truncate" | "wrong-bytes" | "stall", body: Buffer): Promise<string> {
  const srv = https.createServer(f.tls, (_req, res) => {
    res.writeHead(200, { "Content-Length": String(body.length), "Content-Type": "application/octet-stream" });
    if (mode === "stall") {
      res.write(body.subarray(0, body.length >> 1)); // and then nothing
    } else if (mode === "truncate") {
      res.write(body.subarray(0, body.length >> 1));
      setTimeout(() => res.socket?.destroy(), 20);
    } else {
      const copy = Buffer.from(body);
      copy[copy.length >> 1] = (copy[copy.length >> 1] ?? 0) ^ 0xff;
      res.end(copy);
    }
  });
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  t.teardown(
    () =>
      new Promise<void>((r) => {
        srv.close(() => r());
        srv.closeAllConnections();
      }),
  );
  return `127.0.0.1:${(srv.address() as AddressInfo).port}`;
}

t.test("a truncated download is refused and the installed version stays", async (t) => {
  const env = await stepEnv(t);
  const v1 = await pkg("cut", "1");
  await converge(env, [v1]);
  const v2 = await pkg("cut", "2", 256 << 10);
  const layer = await buildLayer(binaryPackage("cut", "2", 256 << 10));
  const endpoint = await liar(t, "truncate", layer);
  const err = await converge(env, [v2], [endpoint]).catch((e) => e);
  t.type(err, PackageFetchError);
  t.match(err.message, /cut .*could not be fetched/s);
  t.equal(await run(env, "cut"), "1");
  t.equal((await readFile(path.join(env.root, STORE, "cut/digest"), "utf8")).trim(), v1.digest);
  t.same(await readdir(path.join(env.root, DOWNLOADS, "cut")).catch(() => []), [], "no partial file left");
});

t.test("bytes that do not hash to the digest are refused even from a proxy that claims success", async (t) => {
  const env = await stepEnv(t);
  const v1 = await pkg("lied", "1");
  await converge(env, [v1]);
  const v2 = await pkg("lied", "2");
  const layer = await buildLayer(binaryPackage("lied", "2"));
  const endpoint = await liar(t, "wrong-bytes", layer);
  const err = await converge(env, [v2], [endpoint]).catch((e) => e);
  t.type(err, PackageFetchError);
  t.match(err.message, /bytes received hash to sha256:[0-9a-f]{64}, not sha256:/);
  t.equal(await run(env, "lied"), "1");
});

t.test("endpoints are tried in turn: a dead proxy does not stop the install", async (t) => {
  const env = await stepEnv(t);
  const p = await pkg("failover", "1");
  const dead = `127.0.0.1:${await freePort()}`;
  const { result } = await converge(env, [p], [dead, f.endpoint]);
  t.same(result?.outputs, { installed: ["failover"], skipped: [], removed: [] });
});

t.test("TLS is verified against the cluster CA and a wrong token is refused without retries", async (t) => {
  const env = await stepEnv(t);
  const p = await pkg("tls", "1");
  const otherCA = (await readFile(path.join(f.dir, "cluster-ca.crt"), "utf8")).replace(/[A-Za-z]{10}/, "AAAAAAAAAA");
  const bad = env.ctx(bundleStep([p]), {
    context: { clusterCA: otherCA, packagesProxy: { endpoints: [f.endpoint], token: f.token } },
  });
  const e1 = await step
    .apply(await step.plan({ packages: [p] }, env.host, bad), { packages: [p] }, env.host, bad)
    .catch((e) => e);
  t.type(e1, PackageFetchError);
  const wrongToken = env.ctx(bundleStep([p]), {
    context: { clusterCA: f.clusterCA, packagesProxy: { endpoints: [f.endpoint], token: "not-the-token" } },
  });
  const started = f.proxy.stats.refused;
  const e2 = await step
    .apply(await step.plan({ packages: [p] }, env.host, wrongToken), { packages: [p] }, env.host, wrongToken)
    .catch((e) => e);
  t.type(e2, PackageFetchError);
  t.match(e2.message, /HTTP 401 \(the packages-proxy token in the bundle was refused\)/);
  t.notMatch(e2.message, "not-the-token");
  t.equal(f.proxy.stats.refused - started, 1, "a 401 is not retried");
  const noCA = env.ctx(bundleStep([p]), {
    context: { clusterCA: "", packagesProxy: { endpoints: [f.endpoint], token: f.token } },
  });
  const e3 = await step
    .apply(await step.plan({ packages: [p] }, env.host, noCA), { packages: [p] }, env.host, noCA)
    .catch((e) => e);
  t.match(e3.message, /no cluster CA to verify the registry-packages proxy with/);
  t.notOk(await open(path.join(env.root, STORE, "tls")).catch(() => undefined), "nothing installed");
});

t.test("a layer without install/uninstall is refused before anything runs", async (t) => {
  const env = await stepEnv(t);
  const dir = path.join(f.dir, "noscripts");
  await mkdir(dir, { recursive: true });
  await writeFile(path.join(dir, "readme"), "hi\n");
  await execFileP("tar", ["-czf", `${dir}.tgz`, "-C", dir, "."]);
  const { digest } = await f.registry.pushPackage(`${REPO}/noscripts`, "1", await readFile(`${dir}.tgz`));
  const err = await converge(env, [{ name: "noscripts", digest, repository: `${REPO}/noscripts` }]).catch((e) => e);
  t.type(err, PackageInstallError);
  t.match(err.message, /not a registry package: its layer has no 'install' script/);
  t.notOk(await open(path.join(env.root, STORE, "noscripts")).catch(() => undefined));
});

t.test("invalid specs are refused at plan time", async (t) => {
  const env = await stepEnv(t);
  await t.rejects(
    step.plan({ packages: [{ name: "x", digest: "sha256:zz", repository: "r" }] }, env.host, ctxFor(env, [])),
    /digest must be sha256/,
  );
  const ok = { name: "x", digest: `sha256:${"a".repeat(64)}`, repository: "r" };
  await t.rejects(step.plan({ packages: [ok, ok] }, env.host, ctxFor(env, [])), /listed twice/);
});

t.test("a download killed midway leaves nothing that could pass for the package", async (t) => {
  const env = await stepEnv(t);
  const v1 = await pkg("killed", "1");
  await converge(env, [v1]);
  const v2 = await pkg("killed", "2", 256 << 10);
  const endpoint = await liar(t, "stall", await buildLayer(binaryPackage("killed", "2", 256 << 10)));
  const abort = new AbortController();
  const ctx = { ...ctxFor(env, [v2], [endpoint]), signal: abort.signal };
  const changes = await step.plan({ packages: [v2] }, env.host, ctx);
  setTimeout(() => abort.abort(), 300);
  await t.rejects(step.apply(changes, { packages: [v2] }, env.host, ctx));
  t.same(await readdir(path.join(env.root, DOWNLOADS, "killed")).catch(() => []), [], "no partial file left");
  t.equal(await run(env, "killed"), "1", "the installed version stays");
  // A process killed outright leaves its temp file (dot-name) behind, and a corrupt archive
  // under the real name can only come from outside: both are cleaned and the package refetched.
  await mkdir(path.join(env.root, DOWNLOADS, "killed"), { recursive: true });
  await writeFile(path.join(env.root, DOWNLOADS, "killed", `.${v2.digest.slice(7)}.tar.gz.bashible-dead`), "partial");
  await writeFile(path.join(env.root, DOWNLOADS, "killed", `${v2.digest.slice(7)}.tar.gz`), "not the package");
  const { result } = await converge(env, [v2]);
  t.same(result?.outputs, { installed: ["killed"], skipped: [], removed: [] });
  t.equal(await run(env, "killed"), "2");
  t.same(await readdir(path.join(env.root, DOWNLOADS, "killed")).catch(() => []), []);
});

t.test("a failing install script fails the step and leaves the recorded version", async (t) => {
  const env = await stepEnv(t);
  const v1 = await pkg("brittle", "1");
  await converge(env, [v1]);
  const layer = await buildLayer({ install: 'echo "disk full" >&2; exit 3', uninstall: "true" });
  const { digest } = await f.registry.pushPackage(`${REPO}/brittle`, "2", layer);
  const v2 = { name: "brittle", digest, repository: `${REPO}/brittle` };
  const err = await converge(env, [v2]).catch((e) => e);
  t.type(err, PackageInstallError);
  t.match(err.message, /package brittle \(sha256:[0-9a-f]{64}\): install exited 3:\ndisk full/);
  t.equal((await readFile(path.join(env.root, STORE, "brittle/digest"), "utf8")).trim(), v1.digest);
  t.equal(await run(env, "brittle"), "1");
  t.match(
    await readFile(path.join(env.root, "var/log/d8/bashible/step.007_registry_packages.log"), "utf8"),
    /disk full/,
  );
});
