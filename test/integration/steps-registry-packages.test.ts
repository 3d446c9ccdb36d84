// RegistryPackages against a real docker-registry behind the real registry-packages proxy,
// in sandbox trees (Debian and a RHEL-family layout): install in list order, skip what is
// installed, upgrade, remove with uninstall (only what this agent installed), and refuse
// tampered, truncated and lying downloads (manifest and layer) while the installed version stays.
import t, { type Test } from "tap";
import { execFile } from "node:child_process";
import { chmod, chown, mkdir, open, readdir, readFile, writeFile } from "node:fs/promises";
import https from "node:https";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { promisify } from "node:util";
import { withProxy } from "../../scripts/lib/packages-proxy.ts";
import { binaryPackage, buildLayer } from "../../scripts/lib/registry.ts";
import { OS_RELEASE, stepEnv, type StepEnv } from "../fixtures/steps.ts";
import { treeHash } from "../../scripts/lib/bundle.ts";
import { DOWNLOADS, fetchPolicy } from "../../steps/lib/package-fetch.ts";
import { OWNER_FILE, STORE } from "../../steps/lib/package-store.ts";
import type { BundleStep, RegistryPackageRef } from "../../bundles/types.ts";
import type { PackageChange } from "../../steps/types.ts";
import { freePort } from "../../scripts/lib/control-plane.ts";
import { requireRoot } from "../fixtures/root.ts";

await requireRoot("the agent sets root ownership on what it writes");

const execFileP = promisify(execFile);
Object.assign(fetchPolicy, { idleTimeoutMs: 5000 });

const f = await withProxy(t);
const REPO = "deckhouse/packages";

interface Pkg extends RegistryPackageRef {
  manifest: Buffer;
  blob: Buffer;
  /** The layer's digest, as the manifest names it. */
  layerDigest: string;
}

async function pkg(name: string, version: string, extra = 0): Promise<Pkg> {
  const layer = await buildLayer(binaryPackage(name, version, extra));
  const pushed = await f.registry.pushPackage(`${REPO}/${name}`, version, layer);
  const { digest, manifest } = pushed;
  return { name, digest, repository: `${REPO}/${name}`, manifest, blob: layer, layerDigest: pushed.layer };
}

const ref = (p: RegistryPackageRef): RegistryPackageRef => ({
  name: p.name,
  digest: p.digest,
  repository: p.repository,
  ...(p.layer ? { layer: p.layer } : {}),
});

const bundleStep = (packages: RegistryPackageRef[]): BundleStep => ({
  name: "007_fetch_registry_packages",
  kind: "RegistryPackages",
  spec: { packages: packages.map(ref) },
});

const context = (endpoints = [f.endpoint], over: { clusterCA?: string; token?: string } = {}) => ({
  context: {
    clusterCA: over.clusterCA ?? f.clusterCA,
    packagesProxy: { endpoints, token: over.token ?? f.token },
  },
});

async function converge(env: StepEnv, packages: RegistryPackageRef[], endpoints = [f.endpoint]) {
  const { changes } = await env.plan(bundleStep(packages), context(endpoints));
  const status = await env.apply(bundleStep(packages), context(endpoints));
  return { changes: changes as PackageChange[], status };
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
  const list = [yq, jq, curl];
  const before = await treeHash(env.root);
  const { changes } = await env.plan(bundleStep(list), context());
  t.equal(await treeHash(env.root), before, "plan changes nothing on disk");
  t.same(
    changes.filter((c) => c.kind === "package").map((c) => [c.action, c.name, c.digest]),
    list.map((p) => ["install", p.name, p.digest]),
  );
  t.match(changes[1]?.summary, /^install package yq sha256:[0-9a-f]{12} from deckhouse\/packages\/yq$/);
  const status = await env.apply(bundleStep(list), context());
  t.equal(status.outcome, "changed", status.error ?? "");
  t.same(await events(env), ["yq 1", "jq 1", "curl 1"], "install ran in list order");
  t.equal(await run(env, "jq"), "1");
  for (const p of list) {
    t.equal((await readFile(path.join(env.root, STORE, p.name, "digest"), "utf8")).trim(), p.digest);
    t.ok(await readFile(path.join(env.root, STORE, p.name, "uninstall"), "utf8"));
    t.equal(await readFile(path.join(env.root, STORE, p.name, OWNER_FILE), "utf8"), "bashible\n");
  }
  t.same(
    (await readdir(path.join(env.root, DOWNLOADS), { recursive: true }).catch(() => [])).filter((n) => n.includes(".")),
    [],
    "downloads are cleaned up",
  );
  t.same((await env.plan(bundleStep(list), context())).changes, [], "a second run plans nothing");
  const fetchesBefore = f.proxy.stats.requests;
  t.equal((await env.apply(bundleStep(list), context())).outcome, "unchanged");
  t.equal(f.proxy.stats.requests, fetchesBefore, "a package whose digest matches is not downloaded");
});

t.test("upgrades a package whose digest changed and removes one no longer listed (RHEL layout)", async (t) => {
  const env = await stepEnv(t, OS_RELEASE.rocky);
  t.equal(env.host.os.family, "rhel");
  const [a1, b1, a2] = await Promise.all([pkg("alpha", "1"), pkg("beta", "1"), pkg("alpha", "2")]);
  await converge(env, [a1, b1]);
  t.equal(await run(env, "alpha"), "1");
  const { changes, status } = await converge(env, [a2]);
  t.same(
    changes.map((c) => `${c.action} ${c.name}`),
    ["remove beta", "upgrade alpha"],
  );
  t.match(changes[1]?.summary, /upgrade package alpha sha256:[0-9a-f]{12} → sha256:[0-9a-f]{12}/);
  t.equal(status.outcome, "changed");
  t.equal(await run(env, "alpha"), "2");
  t.notOk(await open(path.join(env.root, "opt/deckhouse/bin/beta")).catch(() => undefined), "beta's uninstall ran");
  t.same(await readdir(path.join(env.root, STORE)), ["alpha"]);
  t.match(await events(env), ["alpha 1", "beta 1", "uninstalled beta", "alpha 2"]);
  t.same((await env.plan(bundleStep([a2]), context())).changes, []);
});

t.test("a package another tool installed is never uninstalled (a node Deckhouse set up)", async (t) => {
  const env = await stepEnv(t);
  const theirs = path.join(env.root, STORE, "d8-ca-updater");
  await mkdir(theirs, { recursive: true });
  await writeFile(path.join(theirs, "digest"), `sha256:${"1".repeat(64)}\n`);
  await writeFile(path.join(theirs, "uninstall"), `touch "$D8_ROOT/uninstalled-theirs"\n`, { mode: 0o755 });
  const mine = await pkg("mine", "1");
  await converge(env, [mine]);
  const { changes } = await converge(env, []);
  t.same(
    changes.map((c) => `${c.action} ${c.name}`),
    ["remove mine"],
    "only the agent's own package is removed",
  );
  t.ok(await readFile(path.join(theirs, "digest"), "utf8"), "Deckhouse's package stays");
  t.notOk(await open(path.join(env.root, "uninstalled-theirs")).catch(() => undefined), "its uninstall never ran");
});

t.test("a tampered package is refused and the installed version stays", async (t) => {
  const env = await stepEnv(t);
  const v1 = await pkg("tamperme", "1");
  await converge(env, [v1]);
  const v2 = await pkg("tamperme", "2", 32 << 10);
  const { layer } = await f.registry.pushPackage(`${REPO}/tamperme`, "2", v2.blob);
  const fh = await open(f.registry.blobPath(layer), "r+");
  await fh.write(Buffer.from("evil bytes here!"), 0, 16, 2000);
  await fh.close();
  const { status } = await converge(env, [v2]);
  t.equal(status.outcome, "failed");
  t.match(status.error, /package tamperme .*could not be fetched.*HTTP 502.*failed verification/s);
  t.notMatch(status.error, f.token, "the token is not in the error");
  t.equal(await run(env, "tamperme"), "1", "the installed version stays");
  t.equal((await readFile(path.join(env.root, STORE, "tamperme/digest"), "utf8")).trim(), v1.digest);
  t.same(await readdir(path.join(env.root, DOWNLOADS, "tamperme")).catch(() => []), [], "nothing half-downloaded");
});

/** An HTTPS endpoint with the proxy's certificate that misbehaves in a given way. */
async function liar(
  t: Test,
  mode: "truncate" | "wrong-bytes" | "stall" | "no-manifest" | "wrong-manifest",
  p: Pkg,
): Promise<string> {
  const body = p.blob;
  const srv = https.createServer(f.tls, (_req, res) => {
    const manifest =
      mode === "no-manifest"
        ? {}
        : {
            "X-Package-Manifest": (mode === "wrong-manifest"
              ? Buffer.concat([p.manifest, Buffer.from(" ")])
              : p.manifest
            ).toString("base64"),
          };
    res.writeHead(200, {
      "Content-Length": String(body.length),
      "Content-Type": "application/octet-stream",
      ...manifest,
    });
    if (mode === "stall") {
      res.write(body.subarray(0, body.length >> 1)); // and then nothing
    } else if (mode === "truncate") {
      res.write(body.subarray(0, body.length >> 1));
      setTimeout(() => res.socket?.destroy(), 20);
    } else if (mode === "wrong-bytes") {
      const copy = Buffer.from(body);
      copy[copy.length >> 1] = (copy[copy.length >> 1] ?? 0) ^ 0xff;
      res.end(copy);
    } else {
      res.end(body);
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
  const { status } = await converge(env, [v2], [await liar(t, "truncate", v2)]);
  t.equal(status.outcome, "failed");
  t.match(status.error, /cut .*could not be fetched/s);
  t.equal(await run(env, "cut"), "1");
  t.equal((await readFile(path.join(env.root, STORE, "cut/digest"), "utf8")).trim(), v1.digest);
  t.same(await readdir(path.join(env.root, DOWNLOADS, "cut")).catch(() => []), [], "no partial file left");
});

t.test("the node verifies the chain itself: manifest against the digest, layer against the manifest", async (t) => {
  const env = await stepEnv(t);
  const v1 = await pkg("lied", "1");
  await converge(env, [v1]);
  const v2 = await pkg("lied", "2");
  const cases = [
    ["wrong-bytes", /the \d+ layer bytes received hash to sha256:[0-9a-f]{64}, not sha256:.*\(the manifest's layer\)/],
    ["no-manifest", /sent no x-package-manifest header/],
    ["wrong-manifest", /the manifest received hashes to sha256:[0-9a-f]{64}, not/],
  ] as const;
  for (const [mode, message] of cases) {
    const { status } = await converge(env, [v2], [await liar(t, mode, v2)]);
    t.equal(status.outcome, "failed", mode);
    t.match(status.error, message, mode);
    t.equal(await run(env, "lied"), "1", `${mode}: the installed version stays`);
  }
});

/**
 * A proxy as Deckhouse's registry-packages-proxy answers (go_lib/registry-packages-proxy/proxy):
 * GET /package?digest=<manifest digest>&repository=<repo> with a bearer token → the image's last
 * layer blob, Content-Type application/x-gzip, Content-Length, ETag "<digest>", and no manifest.
 * `tamper` flips a byte of the blob it sends.
 */
async function deckhouseProxy(t: Test, pkgs: Pkg[], opts: { tamper?: boolean } = {}): Promise<string> {
  const srv = https.createServer(f.tls, (req, res) => {
    const url = new URL(req.url ?? "/", "https://proxy");
    const p = pkgs.find((x) => x.digest === url.searchParams.get("digest"));
    if (url.pathname !== "/package" || req.headers.authorization !== `Bearer ${f.token}`) {
      res.writeHead(url.pathname === "/package" ? 401 : 404).end();
      return;
    }
    if (!p || url.searchParams.get("repository") !== p.repository) return void res.writeHead(404).end("not found");
    const blob = Buffer.from(p.blob);
    if (opts.tamper) blob[blob.length >> 1] = (blob[blob.length >> 1] ?? 0) ^ 0xff;
    res.writeHead(200, {
      "Content-Type": "application/x-gzip",
      "Content-Disposition": `attachment; filename=${p.digest}.tar.gz`,
      "Content-Length": String(blob.length),
      ETag: `"${p.digest}"`,
    });
    res.end(blob);
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

const withLayer = (p: Pkg): Pkg => ({ ...p, layer: p.layerDigest });

t.test(
  "through Deckhouse's proxy (the blob alone) a package is verified against the bundle's layer and installed",
  async (t) => {
    const env = await stepEnv(t);
    const v1 = withLayer(await pkg("dh", "1"));
    const { status } = await converge(env, [v1], [await deckhouseProxy(t, [v1])]);
    t.equal(status.outcome, "changed", status.error ?? "");
    t.equal(await run(env, "dh"), "1");
    t.equal((await readFile(path.join(env.root, STORE, "dh/digest"), "utf8")).trim(), v1.digest);
  },
);

t.test("a tampered blob from Deckhouse's proxy is refused and nothing is installed", async (t) => {
  const env = await stepEnv(t);
  const p = withLayer(await pkg("dhbad", "1", 64 << 10));
  const { status } = await converge(env, [p], [await deckhouseProxy(t, [p], { tamper: true })]);
  t.equal(status.outcome, "failed");
  t.match(
    status.error,
    new RegExp(
      `layer bytes received hash to sha256:[0-9a-f]{64}, not ${p.layerDigest} \\(the bundle's layer\\); refused`,
    ),
  );
  t.notMatch(status.error, f.token, "the token is not in the error");
  t.same(await readdir(path.join(env.root, STORE)).catch(() => []), [], "nothing installed");
  t.same(await readdir(path.join(env.root, DOWNLOADS, "dhbad")).catch(() => []), [], "nothing half-downloaded");
  await t.rejects(run(env, "dhbad"), "no binary on the node");
});

t.test("without a layer digest in the bundle, Deckhouse's proxy's blob is refused, naming what to set", async (t) => {
  const env = await stepEnv(t);
  const p = await pkg("dhnolayer", "1");
  const { status } = await converge(env, [p], [await deckhouseProxy(t, [p])]);
  t.equal(status.outcome, "failed");
  t.match(status.error, /sent no x-package-manifest header .*Set packages\.dhnolayer\.layer in the context Secret/s);
  t.same(await readdir(path.join(env.root, STORE)).catch(() => []), [], "nothing installed");
});

t.test(
  "with the manifest sent, a bundle layer that disagrees with it is refused (the stronger check stays)",
  async (t) => {
    const env = await stepEnv(t);
    const p = await pkg("mismatch", "1");
    const other = await pkg("mismatch-other", "1", 1024);
    const { status } = await converge(env, [{ ...p, layer: other.layerDigest }]);
    t.equal(status.outcome, "failed");
    t.match(
      status.error,
      new RegExp(`the manifest names layer ${p.layerDigest}, the bundle ${other.layerDigest}; refused`),
    );
    const ok = await converge(env, [withLayer(p)]);
    t.equal(ok.status.outcome, "changed", "with the right layer named, our proxy's package installs");
    t.equal(await run(env, "mismatch"), "1");
  },
);

t.test("endpoints are tried in turn: a dead proxy does not stop the install", async (t) => {
  const env = await stepEnv(t);
  const p = await pkg("failover", "1");
  const dead = `127.0.0.1:${await freePort()}`;
  const { status } = await converge(env, [p], [dead, f.endpoint]);
  t.equal(status.outcome, "changed");
  t.equal(await run(env, "failover"), "1");
});

t.test("TLS is verified against the cluster CA and a wrong token is refused", async (t) => {
  const env = await stepEnv(t);
  const p = await pkg("tls", "1");
  const { createCA } = await import("../../scripts/lib/pki.ts");
  const otherCA = await readFile((await createCA(f.dir, "other-ca", "Some Other CA")).cert, "utf8");
  const e1 = await env.apply(bundleStep([p]), context([f.endpoint], { clusterCA: otherCA }));
  t.equal(e1.outcome, "failed");
  t.match(e1.error, /could not be fetched/);
  const started = f.proxy.stats.refused;
  const e2 = await env.apply(bundleStep([p]), context([f.endpoint], { token: "not-the-token" }));
  t.match(e2.error, /HTTP 401 \(the packages-proxy token in the bundle was refused\)/);
  t.notMatch(e2.error, "not-the-token");
  t.equal(f.proxy.stats.refused - started, 1, "one request per attempt: the engine owns retries");
  const e3 = await env.apply(bundleStep([p]), context([f.endpoint], { clusterCA: "" }));
  t.match(e3.error, /no cluster CA to verify the registry-packages proxy with/);
  t.notOk(await open(path.join(env.root, STORE, "tls")).catch(() => undefined), "nothing installed");
});

t.test("a layer without install/uninstall is refused before anything runs", async (t) => {
  const env = await stepEnv(t);
  const dir = path.join(f.dir, "noscripts");
  await mkdir(dir, { recursive: true });
  await writeFile(path.join(dir, "readme"), "hi\n");
  await execFileP("tar", ["-czf", `${dir}.tgz`, "-C", dir, "."]);
  const { digest } = await f.registry.pushPackage(`${REPO}/noscripts`, "1", await readFile(`${dir}.tgz`));
  const { status } = await converge(env, [{ name: "noscripts", digest, repository: `${REPO}/noscripts` }]);
  t.match(status.error, /not a registry package: its layer has no 'install' script/);
  t.notOk(await open(path.join(env.root, STORE, "noscripts")).catch(() => undefined));
});

t.test("a download killed midway leaves nothing that could pass for the package", async (t) => {
  const env = await stepEnv(t);
  const v1 = await pkg("killed", "1");
  await converge(env, [v1]);
  const v2 = await pkg("killed", "2", 256 << 10);
  const endpoint = await liar(t, "stall", v2);
  const { applySteps } = await import("../../agent/converge/engine.ts");
  const { hostFlags } = await import("../../host/flags.ts");
  const { makeBundle } = await import("../../scripts/lib/bundle.ts");
  const { createLogger } = await import("../../lib/log/log.ts");
  const bundle = makeBundle([bundleStep([v2])], context([endpoint]));
  const abort = new AbortController();
  const log = createLogger({ level: "silent" });
  const applying = applySteps(
    env.host,
    bundle,
    {
      nodeName: "node-1",
      nodeGroup: "worker",
      bundle,
      firstRun: false,
      forced: false,
      bootId: "b",
      log,
      flags: hostFlags(env.host),
      agentArgv: [],
      cluster: "local",
      signal: abort.signal,
    },
    { retry: { intervalMs: 0, maxAttempts: 1 } },
  );
  // Abort once the stalled download has begun: its temp file exists.
  const dir = path.join(env.root, DOWNLOADS, "killed");
  for (;;) {
    if ((await readdir(dir).catch(() => [])).some((n) => n.startsWith("."))) break;
    await new Promise((r) => setTimeout(r, 20));
  }
  abort.abort();
  t.equal((await applying).ok, false);
  t.same(await readdir(dir).catch(() => []), [], "no partial file left");
  t.equal(await run(env, "killed"), "1", "the installed version stays");
  // A process killed outright leaves its temp file (dot-name) behind, and an archive under the
  // real name can only come from outside: both are cleaned and the package refetched.
  await mkdir(dir, { recursive: true });
  await writeFile(path.join(dir, `.${v2.digest.slice(7)}.tar.gz.bashible-dead`), "partial");
  await writeFile(path.join(dir, `${v2.digest.slice(7)}.tar.gz`), "not the package");
  t.equal((await converge(env, [v2])).status.outcome, "changed");
  t.equal(await run(env, "killed"), "2");
  t.same(await readdir(dir).catch(() => []), []);
});

t.test("a failing install script fails the step and leaves the recorded version", async (t) => {
  const env = await stepEnv(t);
  const v1 = await pkg("brittle", "1");
  await converge(env, [v1]);
  const layer = await buildLayer({ install: 'echo "disk full" >&2; exit 3', uninstall: "true" });
  const { digest } = await f.registry.pushPackage(`${REPO}/brittle`, "2", layer);
  const v2 = { name: "brittle", digest, repository: `${REPO}/brittle` };
  const { status } = await converge(env, [v2]);
  t.match(status.error, /package brittle \(sha256:[0-9a-f]{64}\): install exited 3:\ndisk full/);
  t.equal((await readFile(path.join(env.root, STORE, "brittle/digest"), "utf8")).trim(), v1.digest);
  t.equal(await run(env, "brittle"), "1");
  t.match(
    await readFile(path.join(env.root, "var/log/d8/bashible/step.007_fetch_registry_packages.log"), "utf8"),
    /disk full/,
  );
});

t.test("downloads never pass through a directory another user can write (as an attacker would try)", async (t) => {
  const env = await stepEnv(t);
  const NOBODY = 65534;
  // Scripts make Deckhouse's TMPDIR 1777; the attacker pre-creates the directory packages were
  // once downloaded into, to swap the archive between its check and tar.
  const tmp = path.join(env.root, "opt/deckhouse/tmp");
  await mkdir(tmp, { recursive: true, mode: 0o1777 });
  await chmod(tmp, 0o1777);
  const trap = path.join(tmp, "registrypackages");
  await mkdir(trap, { mode: 0o777 });
  await chown(trap, NOBODY, NOBODY);
  const v1 = await pkg("guarded", "1");
  const { status } = await converge(env, [v1]);
  t.notOk(status.error, "installed");
  t.equal(await run(env, "guarded"), "1");
  t.same(await readdir(trap), [], "nothing was downloaded where the attacker can write");
  t.ok(DOWNLOADS.startsWith("/var/lib/bashible/"), "downloads live in the agent's root-only state");

  // Should the download directory itself end up writable by someone else, nothing is handed to
  // tar or an install script there: the step fails, naming the directory.
  const downloads = path.join(env.root, DOWNLOADS);
  await mkdir(downloads, { recursive: true });
  await chmod(downloads, 0o777);
  await chown(downloads, NOBODY, NOBODY);
  const v2 = await pkg("guarded", "2");
  const second = await converge(env, [v2]);
  t.match(second.status.error, /registrypackages can be written by others \(owner uid 65534, mode 0777\); refused/);
  t.equal(await run(env, "guarded"), "1", "the installed version stays");
});
