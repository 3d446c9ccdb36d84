// The bundle server's listener tried as an attacker would: connections that send nothing, a
// header trickle, more connections than the cap, idle HTTP/2 sessions, request bodies, and a
// front-proxy group with a comma in it. Each is bounded, and a real client is served all the same.
import t from "tap";
import { cp as copyDir, mkdtemp, readFile, rm } from "node:fs/promises";
import http2 from "node:http2";
import https from "node:https";
import os from "node:os";
import path from "node:path";
import tls from "node:tls";
import { fileURLToPath } from "node:url";
import { pino } from "pino";
import { startBundleServer, type App } from "../../cluster/server/app.ts";
import { DEFAULT_LISTENER_LIMITS, type ListenerLimits } from "../../cluster/listener-limits.ts";
import { createCA, issueCert } from "../../scripts/lib/pki.ts";

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const API = "/apis/bashible.deckhouse.io/v1alpha1";
const tmp = await mkdtemp(path.join(os.tmpdir(), "bashible-listeners-"));
t.teardown(() => rm(tmp, { recursive: true, force: true }));
const configDir = path.join(tmp, "config");
await copyDir(path.join(REPO, "examples/cluster"), configDir, { recursive: true });

const ca = await createCA(tmp, "ca", "listeners-ca");
const frontProxyCA = await createCA(tmp, "front-proxy-ca", "front-proxy-ca");
const serving = await issueCert(tmp, "serving", ca, {
  cn: "bashible-api",
  dnsNames: ["localhost"],
  ips: ["127.0.0.1"],
});
const proxyCert = await issueCert(tmp, "front-proxy-client", frontProxyCA, { cn: "front-proxy-client", client: true });
const caPem = await readFile(ca.cert);
const client = { ca: caPem, cert: await readFile(proxyCert.cert), key: await readFile(proxyCert.key) };

async function server(limits?: Partial<ListenerLimits>): Promise<App> {
  const app = await startBundleServer({
    log: pino({ level: "silent" }),
    configDir,
    tls: { cert: await readFile(serving.cert), key: await readFile(serving.key) },
    requestHeader: { caPems: [await readFile(frontProxyCA.cert)], allowedNames: ["front-proxy-client"] },
    host: "127.0.0.1",
    port: 0,
    ...(limits ? { limits } : {}),
  });
  t.teardown(() => app.stop());
  return app;
}

/** GET as the front proxy, with these headers (repeated names as separate header lines). */
function get(port: number, p: string, headers: [string, string][]): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = https.request({ host: "127.0.0.1", port, path: p, ...client, agent: false }, (res) => {
      let body = "";
      res.on("data", (d: Buffer) => (body += d.toString()));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
    });
    for (const [name, value] of headers) req.appendHeader(name, value);
    req.once("error", reject);
    req.end();
  });
}

/** A TLS connection that completed its handshake and then sends nothing; resolves its close. */
function idle(port: number, alpn: string): Promise<{ closed: Promise<void> }> {
  return new Promise((resolve, reject) => {
    const s = tls.connect({ host: "127.0.0.1", port, ca: caPem, servername: "localhost", ALPNProtocols: [alpn] });
    const closed = new Promise<void>((r) => s.once("close", () => r()));
    s.resume();
    s.once("secureConnect", () => resolve({ closed }));
    s.once("error", (err) => reject(err));
  });
}

const main = await server();

t.test("a front-proxy group with a comma in it is one group, never system:masters", async (t) => {
  const p = `${API}/nodegroupbundles/worker`;
  const comma = await get(main.port, p, [
    ["X-Remote-User", "mallory"],
    ["X-Remote-Group", "dev,system:masters"],
  ]);
  t.equal(comma.status, 403, "one group named 'dev,system:masters' reads nothing");
  t.match(comma.body, /user \\"mallory\\" may read only nothing/);
  const two = await get(main.port, p, [
    ["X-Remote-User", "admin"],
    ["X-Remote-Group", "dev"],
    ["X-Remote-Group", "system:masters"],
  ]);
  t.equal(two.status, 200, "two headers are two groups, as the aggregator sends them");
});

t.test("200 idle TLS connections are closed by the server; a real client is served meanwhile", async (t) => {
  const conns = await Promise.all(Array.from({ length: 200 }, (_, i) => idle(main.port, i % 2 ? "h2" : "http/1.1")));
  let open = conns.length;
  for (const c of conns) void c.closed.then(() => open--);
  const res = await get(main.port, `${API}/nodegroupbundles/worker`, [
    ["X-Remote-User", "admin"],
    ["X-Remote-Group", "system:masters"],
  ]);
  t.equal(res.status, 200, "served while the idle connections are held");
  t.equal(open, 200, "they were all still open then");
  // The server closes each: none sent a request within the first-request timeout (10 s).
  const results = await Promise.all(conns.map((c) => c.closed));
  t.equal(
    results.length,
    200,
    `all 200 closed by the server (first-request timeout ${DEFAULT_LISTENER_LIMITS.firstRequestTimeoutMs / 1000} s)`,
  );
});

// Clocks short enough to watch them cut, long enough that a real client's handshake and first
// request fit in them on a loaded 2-core CI machine (1 s did not, once).
const small = await server({ maxConnections: 20, firstRequestTimeoutMs: 4000, idleTimeoutMs: 4000 });

t.test("a client trickling header bytes never completes a request and is cut", async (t) => {
  const s = tls.connect({ host: "127.0.0.1", port: small.port, servername: "localhost", ...client });
  // Being cut may arrive as a reset: that is the cut, not a failure of the test.
  s.on("error", () => undefined);
  await new Promise((r) => s.once("secureConnect", r));
  s.write(`GET ${API}/nodegroupbundles/worker HTTP/1.1\r\nHost: x\r\n`);
  let response = "";
  s.on("data", (d: Buffer) => (response += d.toString()));
  const trickle = setInterval(() => s.writable && s.write("X-Slow: a\r\n"), 200);
  t.teardown(() => clearInterval(trickle));
  await new Promise((r) => s.once("close", r));
  clearInterval(trickle);
  t.equal(response, "", "cut without an answer, although bytes kept arriving");
});

t.test("beyond the connection cap new connections are closed at once; a real client gets in after", async (t) => {
  const held = await Promise.all(Array.from({ length: 20 }, () => idle(small.port, "http/1.1")));
  const refused = await new Promise<string>((resolve) => {
    const s = tls.connect({ host: "127.0.0.1", port: small.port, ca: caPem, servername: "localhost" });
    s.once("secureConnect", () => resolve("handshake completed"));
    s.once("error", (err) => resolve(`refused: ${(err as NodeJS.ErrnoException).code ?? err.message}`));
    s.once("close", () => resolve("refused: closed"));
  });
  t.match(refused, /^refused/, "the 21st connection is closed before its handshake");
  await Promise.all(held.map((c) => c.closed));
  const res = await new Promise<number>((resolve, reject) => {
    https
      .get({ host: "127.0.0.1", port: small.port, path: "/healthz", ca: caPem, agent: false }, (r) => {
        r.resume();
        resolve(r.statusCode ?? 0);
      })
      .once("error", reject);
  });
  t.equal(res, 200, "once the idle ones were cut, a client is served");
});

t.test("HTTP/2: a session without streams, and one idle after its requests, are closed", async (t) => {
  const silent = http2.connect(`https://127.0.0.1:${small.port}`, { ca: caPem, servername: "localhost" });
  silent.on("error", () => undefined);
  // PINGs are traffic, not requests: they do not keep the session.
  const pinger = setInterval(() => !silent.destroyed && silent.ping(() => undefined), 200);
  t.teardown(() => clearInterval(pinger));
  await new Promise((r) => silent.once("close", r));
  clearInterval(pinger);
  t.pass("the session that opened no stream was closed");

  const used = http2.connect(`https://127.0.0.1:${small.port}`, { servername: "localhost", ...client });
  used.on("error", () => undefined);
  const status = await new Promise<number>((resolve, reject) => {
    const st = used.request({
      ":path": `${API}/nodegroupbundles/worker`,
      "x-remote-user": "admin",
      "x-remote-group": "system:masters",
    });
    st.on("response", (h) => resolve(Number(h[":status"])));
    st.resume();
    st.once("error", reject);
    st.end();
  });
  t.equal(status, 200, "a real client is served over HTTP/2");
  await new Promise((r) => used.once("close", r));
  t.pass("and its session closed once idle");
});

t.test("a request with a body is refused with 413 without the body being read", async (t) => {
  const h1 = await new Promise<number>((resolve, reject) => {
    const req = https.request(
      {
        host: "127.0.0.1",
        port: small.port,
        path: `${API}/nodegroupbundles/worker`,
        method: "GET",
        headers: { "Content-Length": String(64 << 20) },
        ...client,
        agent: false,
      },
      (res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
      },
    );
    req.once("error", reject);
    req.flushHeaders(); // the 64 MiB never follow
  });
  t.equal(h1, 413, "HTTP/1.1: the declared body is refused before it is sent");

  const session = http2.connect(`https://127.0.0.1:${small.port}`, { servername: "localhost", ...client });
  session.on("error", () => undefined);
  t.teardown(() => session.destroy());
  const h2 = await new Promise<number>((resolve, reject) => {
    const st = session.request({ ":method": "POST", ":path": `${API}/nodegroupbundles/worker` }, { endStream: false });
    st.on("response", (h) => resolve(Number(h[":status"])));
    st.on("error", () => undefined);
    st.once("error", reject);
    st.write(Buffer.alloc(1024));
  });
  t.equal(h2, 413, "HTTP/2: a stream that carries data is refused");
});
