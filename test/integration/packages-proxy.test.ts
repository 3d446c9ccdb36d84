// The registry-packages proxy in front of a real docker-registry: token check, digest
// verification, on-disk cache, one upstream fetch for many identical requests, ETag / 304,
// refusal of tampered and truncated upstream blobs, and the `bashible packages-proxy` CLI.
import t from "tap";
import { spawn } from "node:child_process";
import { readdir, open, truncate, writeFile } from "node:fs/promises";
import http from "node:http";
import https from "node:https";
import type { AddressInfo } from "node:net";
import tls from "node:tls";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { startProxyFixture, withProxy } from "../../scripts/lib/packages-proxy.ts";
import { startPackagesProxy } from "../../cluster/packages-proxy/server.ts";
import { createLogger } from "../../lib/log/log.ts";
import { buildLayer, binaryPackage, sha256 } from "../../scripts/lib/registry.ts";
import { freePort } from "../../scripts/lib/control-plane.ts";

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const f = await withProxy(t);

interface Res {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: Buffer;
}

function get(url: string, headers: Record<string, string> = {}, ca = f.clusterCA, method = "GET"): Promise<Res> {
  return new Promise((resolve, reject) => {
    const req = https.request(url, { method, headers, ca }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end();
  });
}

const auth = { authorization: `Bearer ${f.token}` };
const pkgUrl = (base: string, digest: string, repository = "deckhouse/packages/jq") =>
  `${base}/package?digest=${digest}&repository=${encodeURIComponent(repository)}`;

async function cachedFiles(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const sub of await readdir(path.join(dir, "sha256")).catch(() => [])) {
    for (const name of await readdir(path.join(dir, "sha256", sub))) out.push(name);
  }
  return out;
}

t.test("serves a package's layer by manifest digest, with the manifest beside it, ETag and 304", async (t) => {
  const layer = await buildLayer(binaryPackage("jq", "1.7"));
  const { digest, layer: layerDigest } = await f.registry.pushPackage("deckhouse/packages/jq", "1.7", layer);
  const res = await get(pkgUrl(f.proxy.url, digest), auth);
  t.equal(res.status, 200);
  t.ok(res.body.equals(layer), "the bytes are the layer's");
  const manifest = Buffer.from(String(res.headers["x-package-manifest"]), "base64");
  t.equal(sha256(manifest), digest, "the manifest sent hashes to the digest asked for");
  t.equal(JSON.parse(manifest.toString()).layers[0].digest, layerDigest, "and names the layer sent");
  t.equal(res.headers["docker-content-digest"], layerDigest);
  t.equal(res.headers.etag, `"${digest}"`);
  t.equal(res.headers["content-length"], String(layer.length));
  const again = await get(pkgUrl(f.proxy.url, digest), { ...auth, "if-none-match": `"${digest}"` });
  t.equal(again.status, 304);
  t.equal(again.body.length, 0);
  const head = await get(pkgUrl(f.proxy.url, digest), auth, f.clusterCA, "HEAD");
  t.equal(head.status, 200);
  t.equal(head.headers["content-length"], String(layer.length));
});

t.test("a request without the right token is refused, whatever it asks for", async (t) => {
  const digest = sha256(Buffer.from("x"));
  t.equal((await get(pkgUrl(f.proxy.url, digest))).status, 401);
  t.equal((await get(pkgUrl(f.proxy.url, digest), { authorization: "Bearer wrong" })).status, 401);
  t.equal((await get(pkgUrl(f.proxy.url, digest), { authorization: `Bearer ${f.token}x` })).status, 401);
  t.equal((await get(pkgUrl(f.proxy.url, digest), { authorization: `Basic ${f.token}` })).status, 401);
});

t.test("bad parameters are 400 and an unknown blob is 404", async (t) => {
  t.equal((await get(pkgUrl(f.proxy.url, "sha256:abc"), auth)).status, 400);
  t.equal((await get(pkgUrl(f.proxy.url, sha256(Buffer.from("y")), "Bad/Repo"), auth)).status, 400);
  const missing = await get(pkgUrl(f.proxy.url, sha256(Buffer.from("not pushed"))), auth);
  t.equal(missing.status, 404);
  t.match(missing.body.toString(), /no such blob|answered 404/);
});

t.test(
  "fifty concurrent requests for one package make one upstream fetch of its manifest and one of its layer",
  async (t) => {
    const proxy = await f.another();
    const layer = await buildLayer(binaryPackage("big", "1", 4 << 20));
    const { digest } = await f.registry.pushPackage("deckhouse/packages/big", "1", layer);
    const all = await Promise.all(
      Array.from({ length: 50 }, () => get(pkgUrl(proxy.url, digest, "deckhouse/packages/big"), auth)),
    );
    t.ok(
      all.every((r) => r.status === 200 && r.body.equals(layer)),
      "every node got the verified bytes",
    );
    t.equal(proxy.stats.upstreamFetches, 2, "one upstream fetch each of the manifest and the layer");
    await get(pkgUrl(proxy.url, digest, "deckhouse/packages/big"), auth);
    t.equal(proxy.stats.upstreamFetches, 2, "later requests are served from the cache");
    t.ok(proxy.stats.cacheHits >= 1);
    const metrics = (await get(`${proxy.url}/metrics`)).body.toString();
    t.match(metrics, /^registry_packages_proxy_upstream_fetches_total 2$/m);
    t.match(metrics, /^registry_packages_proxy_served_total 51$/m);
  },
);

t.test("a tampered upstream blob is refused with 502 and never cached", async (t) => {
  const proxy = await f.another();
  const layer = await buildLayer(binaryPackage("tampered", "1", 64 << 10));
  const { digest, layer: layerDigest } = await f.registry.pushPackage("deckhouse/packages/tampered", "1", layer);
  // Swap bytes in the registry's own storage: same size, different content.
  const fh = await open(f.registry.blobPath(layerDigest), "r+");
  const buf = Buffer.alloc(16);
  await fh.read(buf, 0, 16, 1000);
  await fh.write(buf.reverse(), 0, 16, 1000);
  await fh.close();
  const res = await get(pkgUrl(proxy.url, digest, "deckhouse/packages/tampered"), auth);
  t.equal(res.status, 502);
  t.match(res.body.toString(), /failed verification.*hash to sha256:[0-9a-f]{64}.*not cached/s);
  const listing = (await readdir(f.dir)).filter((n) => n.startsWith("cache-"));
  for (const c of listing) {
    t.notOk((await cachedFiles(path.join(f.dir, c))).includes(layerDigest.slice(7)), `${c} holds no tampered blob`);
  }
});

t.test("a truncated upstream blob is refused with 502 and never cached", async (t) => {
  const proxy = await f.another();
  const layer = await buildLayer(binaryPackage("truncated", "1", 64 << 10));
  const { digest, layer: layerDigest } = await f.registry.pushPackage("deckhouse/packages/truncated", "1", layer);
  await truncate(f.registry.blobPath(layerDigest), 1000);
  const res = await get(pkgUrl(proxy.url, digest, "deckhouse/packages/truncated"), auth);
  t.equal(res.status, 502);
  t.match(res.body.toString(), /failed verification|premature|ECONNRESET/);
  for (const c of (await readdir(f.dir)).filter((n) => n.startsWith("cache-"))) {
    t.notOk((await cachedFiles(path.join(f.dir, c))).includes(layerDigest.slice(7)), `${c} holds no truncated blob`);
  }
});

t.test("`bashible packages-proxy` serves over HTTPS until SIGTERM", async (t) => {
  const data = await buildLayer(binaryPackage("cli", "1"));
  const { digest } = await f.registry.pushPackage("deckhouse/packages/cli", "1", data);
  const port = await freePort();
  const files = {
    cert: path.join(f.dir, "cli.crt"),
    key: path.join(f.dir, "cli.key"),
    token: path.join(f.dir, "cli.token"),
  };
  await writeFile(files.cert, f.tls.cert);
  await writeFile(files.key, f.tls.key);
  await writeFile(files.token, `${f.token}\n`);
  const child = spawn(
    process.execPath,
    [
      path.join(REPO, "agent/main.ts"),
      "packages-proxy",
      "--listen",
      `127.0.0.1:${port}`,
      "--tls-cert",
      files.cert,
      "--tls-key",
      files.key,
      "--token-file",
      files.token,
      "--upstream",
      f.registry.url,
      "--cache-dir",
      path.join(f.dir, "cli-cache"),
      "--log-format",
      "json",
    ],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  const out: Buffer[] = [];
  child.stdout.on("data", (d: Buffer) => out.push(d));
  child.stderr.on("data", (d: Buffer) => out.push(d));
  const exited = new Promise<number | null>((r) => child.once("exit", (c) => r(c)));
  const deadline = Date.now() + 15_000;
  let res: Res | undefined;
  while (Date.now() < deadline) {
    res = await get(pkgUrl(`https://127.0.0.1:${port}`, digest, "deckhouse/packages/cli"), auth).catch(() => undefined);
    if (res) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  t.equal(res?.status, 200, Buffer.concat(out).toString());
  t.ok(res?.body.equals(data));
  child.kill("SIGTERM");
  t.equal(await exited, 0, "clean exit on SIGTERM");
  t.notMatch(Buffer.concat(out).toString(), f.token, "the token is never logged");
});

t.test("pulls from a registry that wants the token flow, and says so when its credentials are wrong", async (t) => {
  const creds = { username: "puller", password: "s3cret-registry-password" };
  const g = await startProxyFixture({ registryAuth: creds });
  t.teardown(() => g.stop());
  const data = await buildLayer(binaryPackage("authed", "1", 50_000));
  const { digest } = await g.registry.pushPackage("deckhouse/packages/authed", "1", data);
  const issuedBefore = g.registry.auth?.tokensIssued() ?? 0;

  const anonymous = await get(
    pkgUrl(g.proxy.url, digest, "deckhouse/packages/authed"),
    {
      authorization: `Bearer ${g.token}`,
    },
    g.clusterCA,
  );
  t.equal(anonymous.status, 502, "no credentials: the registry refuses the proxy");
  t.match(anonymous.body.toString(), /answered 401/);

  const wrong = await g.another({ upstream: { username: "puller", password: "wrong" } });
  const w = await get(
    pkgUrl(wrong.url, digest, "deckhouse/packages/authed"),
    { authorization: `Bearer ${g.token}` },
    g.clusterCA,
  );
  t.equal(w.status, 502);
  t.notMatch(w.body.toString(), /wrong/, "the password is not echoed");

  const right = await g.another({ upstream: creds });
  const r = await get(
    pkgUrl(right.url, digest, "deckhouse/packages/authed"),
    { authorization: `Bearer ${g.token}` },
    g.clusterCA,
  );
  t.equal(r.status, 200, r.body.toString());
  t.ok(r.body.equals(data));
  t.ok((g.registry.auth?.tokensIssued() ?? 0) > issuedBefore, "a registry token was obtained for the pull");
});

t.test(
  "after a restart, a cache file that rotted on disk is cut off before its end, dropped, and refetched",
  async (t) => {
    const cacheDir = path.join(f.dir, "restart-cache");
    const start = () =>
      startPackagesProxy({
        upstream: { url: f.registry.url, attempts: 1 },
        cacheDir,
        token: f.token,
        tls: f.tls,
        log: createLogger({ level: "silent" }),
      });
    const layer = await buildLayer(binaryPackage("rot", "1", 128 << 10));
    const { digest, layer: layerDigest } = await f.registry.pushPackage("deckhouse/packages/rot", "1", layer);
    const first = await start();
    t.equal((await get(pkgUrl(first.url, digest, "deckhouse/packages/rot"), auth)).status, 200);
    await first.close();
    const cached = path.join(cacheDir, "sha256", layerDigest.slice(7, 9), layerDigest.slice(7));
    const fh = await open(cached, "r+");
    await fh.write(Buffer.from("rot"), 0, 3, 500);
    await fh.close();

    const second = await start();
    t.teardown(() => second.close());
    const url = pkgUrl(second.url, digest, "deckhouse/packages/rot");
    const broken = await get(url, auth).catch((e: Error) => e);
    t.ok(broken instanceof Error || !broken.body.equals(layer), "the rotten copy is never delivered whole");
    const fresh = await get(url, auth);
    t.equal(fresh.status, 200);
    t.ok(fresh.body.equals(layer), "refetched from upstream");
    t.equal(second.stats.upstreamFetches, 1);
    const again = await get(url, auth);
    t.ok(again.body.equals(layer), "and served from the cache afterwards");
    t.equal(second.stats.upstreamFetches, 1);
  },
);

t.test("a layer larger than its manifest declares is refused before the excess is read", async (t) => {
  const proxy = await f.another();
  const layer = await buildLayer(binaryPackage("swapped", "1"));
  const { digest, layer: layerDigest } = await f.registry.pushPackage("deckhouse/packages/swapped", "1", layer);
  // The registry's storage swapped for 64 MiB under the same digest: it announces the new length.
  await writeFile(f.registry.blobPath(layerDigest), Buffer.alloc(64 << 20, 1));
  const res = await get(pkgUrl(proxy.url, digest, "deckhouse/packages/swapped"), auth);
  t.equal(res.status, 502);
  t.match(
    res.body.toString(),
    `announces ${64 << 20} bytes, more than the ${layer.length} bytes its manifest declares`,
  );
  for (const c of (await readdir(f.dir)).filter((n) => n.startsWith("cache-"))) {
    t.notOk((await cachedFiles(path.join(f.dir, c))).includes(layerDigest.slice(7)), `${c} holds nothing of it`);
  }
});

t.test("a registry streaming a layer without a length is cut off at the declared size", async (t) => {
  // A hostile registry: a valid manifest declaring a 1024-byte layer, then 64 MiB of "layer".
  const layerBytes = Buffer.alloc(1024, 7);
  const layerDigest = sha256(layerBytes);
  const manifest = Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: "application/vnd.oci.image.manifest.v1+json",
      config: { mediaType: "application/vnd.oci.image.config.v1+json", digest: layerDigest, size: 1024 },
      layers: [{ mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: layerDigest, size: 1024 }],
    }),
  );
  let written = 0;
  let finished = false;
  let cutOff!: () => void;
  const closed = new Promise<void>((r) => (cutOff = r));
  const hostile = http.createServer(async (req, res) => {
    if (req.url?.includes("/manifests/")) {
      res.writeHead(200, { "Content-Type": "application/vnd.oci.image.manifest.v1+json" });
      return void res.end(manifest);
    }
    res.writeHead(200, { "Content-Type": "application/octet-stream" }); // chunked: no length announced
    res.once("close", () => cutOff());
    const chunk = Buffer.alloc(64 << 10, 7);
    while (written < 64 << 20 && !res.destroyed) {
      written += chunk.length;
      if (!res.write(chunk)) await new Promise((r) => res.once("drain", r).once("close", r));
    }
    res.end(() => (finished = true));
  });
  await new Promise<void>((r) => hostile.listen(0, "127.0.0.1", () => r()));
  t.teardown(() => hostile.close());
  const proxy = await f.another({ upstream: { url: `http://127.0.0.1:${(hostile.address() as AddressInfo).port}` } });
  const res = await get(pkgUrl(proxy.url, sha256(manifest), "deckhouse/packages/hostile"), auth);
  t.equal(res.status, 502);
  t.match(res.body.toString(), "sent more than 1024 bytes, more than the 1024 bytes its manifest declares");
  await closed;
  t.notOk(finished, "the 64 MiB were never all taken");
  t.ok(written < 16 << 20, `the proxy stopped reading: ${written} bytes left the registry (socket buffers included)`);
});

t.test("idle connections to the proxy are closed, a body is refused, and a real client is served", async (t) => {
  const proxy = await startPackagesProxy({
    upstream: { url: f.registry.url, attempts: 1 },
    cacheDir: path.join(f.dir, "limits-cache"),
    token: f.token,
    tls: f.tls,
    log: createLogger({ level: "silent" }),
    limits: { maxConnections: 30, firstRequestTimeoutMs: 1000 },
  });
  t.teardown(() => proxy.close());
  const idle = await Promise.all(
    Array.from(
      { length: 20 },
      () =>
        new Promise<Promise<void>>((resolve, reject) => {
          const s = tls.connect({ host: "127.0.0.1", port: proxy.port, ca: f.clusterCA });
          const closed = new Promise<void>((r) => s.once("close", () => r()));
          s.once("secureConnect", () => resolve(closed));
          s.once("error", reject);
        }),
    ),
  );
  const layer = await buildLayer(binaryPackage("limits", "1"));
  const { digest } = await f.registry.pushPackage("deckhouse/packages/limits", "1", layer);
  const res = await get(pkgUrl(proxy.url, digest, "deckhouse/packages/limits"), auth);
  t.equal(res.status, 200, "served while 20 idle connections are held");
  await Promise.all(idle);
  t.pass("the idle connections were closed by the proxy");
  const withBody = await get(pkgUrl(proxy.url, digest, "deckhouse/packages/limits"), {
    ...auth,
    "content-length": String(64 << 20),
  }).catch((e: Error) => ({ status: -1, body: Buffer.from(e.message) }));
  t.equal(withBody.status, 413, "a request body is refused unread");
});
