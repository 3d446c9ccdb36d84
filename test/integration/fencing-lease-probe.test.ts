// The API check's own connection (agent/fencing/lease-probe.ts) against a real kube-apiserver:
// the Lease read as KubeClient reads it, 404 and 401 as the statuses they are, one connection
// kept between checks, a connection the server side dropped replaced within the same check, a
// server that does not answer is a timeout; and the response parser on chunked bodies.
import t from "tap";
import { readFile } from "node:fs/promises";
import net from "node:net";
import { withControlPlane } from "../../scripts/lib/control-plane-fixture.ts";
import { TcpProxy } from "../../scripts/lib/tcp-proxy.ts";
import { microTime } from "../../lib/kube/api.ts";
import { checkApi, leasePath } from "../../agent/fencing/health.ts";
import { LeaseProbe, parseResponse } from "../../agent/fencing/lease-probe.ts";

const cp = await withControlPlane(t);
const renewed = Date.now() - 3000;
await cp.admin.request("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", {
  body: {
    metadata: { name: "probe-node" },
    spec: { holderIdentity: "probe-node", leaseDurationSeconds: 40, renewTime: microTime(renewed) },
  },
});
// A relay that counts connections and can drop them, standing in for the node's API proxy.
let connections = 0;
const port = Number(new URL(cp.server).port);
const relay = new TcpProxy({ host: "127.0.0.1", target: { host: "127.0.0.1", port } });
await relay.start();
const counter = net.createServer((c) => {
  connections++;
  const u = net.connect(relay.port, "127.0.0.1");
  c.pipe(u).pipe(c);
  c.on("error", () => undefined);
  u.on("error", () => undefined);
  c.once("close", () => u.destroy());
  u.once("close", () => c.destroy());
});
await new Promise<void>((r) => counter.listen(0, "127.0.0.1", () => r()));
t.teardown(async () => {
  await relay.stop();
  await new Promise<void>((r) => counter.close(() => r()));
});
const server = `https://127.0.0.1:${(counter.address() as net.AddressInfo).port}`;
const probeOf = (name: string, conn = cp.admin.connection) => {
  const p = new LeaseProbe({ ...conn, server }, leasePath(name));
  t.teardown(() => p.close());
  return p;
};

t.test("the Lease is read, and later checks reuse the connection", async (t) => {
  const probe = probeOf("probe-node");
  connections = 0;
  const first = await checkApi(probe, 4000, Date.now);
  t.match(first, { result: "ok", reached: true, kubeletLeaseRenewedAt: renewed });
  t.ok((first.kubeletLeaseAgeSeconds ?? 0) >= 3, "the Lease's age");
  for (let i = 0; i < 5; i++) t.equal((await checkApi(probe, 4000, Date.now)).result, "ok");
  t.equal(connections, 1, "one connection for six checks");
});

t.test("a missing Lease is 404, bad credentials are 401: the API answered", async (t) => {
  t.match(await checkApi(probeOf("no-such-node"), 4000, Date.now), { result: "no-lease", reached: true });
  const anonymous = probeOf("probe-node", { ...cp.admin.connection, cert: undefined, key: undefined, token: "nope" });
  t.match(await checkApi(anonymous, 4000, Date.now), { result: "auth", reached: true, detail: /^401/ });
});

t.test("a connection dropped between checks is replaced within the next check", async (t) => {
  const probe = probeOf("probe-node");
  t.equal((await checkApi(probe, 4000, Date.now)).result, "ok");
  relay.setMode("blackhole"); // cuts every open connection…
  relay.setMode("pass"); // …and lets new ones through
  t.equal((await checkApi(probe, 4000, Date.now)).result, "ok", "no failed check for a dropped connection");
});

t.test("a server that does not answer is a timeout, and the probe recovers when it does", async (t) => {
  const probe = probeOf("probe-node");
  relay.setMode("blackhole");
  try {
    t.match(await checkApi(probe, 500, Date.now), { result: "timeout", reached: false });
  } finally {
    relay.setMode("pass");
  }
  t.equal((await checkApi(probe, 4000, Date.now)).result, "ok");
});

t.test("nothing listening is refused; a wrong CA is a TLS failure", async (t) => {
  const closed = new LeaseProbe({ ...cp.admin.connection, server: "https://127.0.0.1:1" }, leasePath("x"));
  t.match(await checkApi(closed, 2000, Date.now), { result: "refused", reached: false });
  const wrongCa = probeOf("probe-node", { ...cp.admin.connection, ca: await readFile(cp.frontProxyCA.cert) });
  t.match(await checkApi(wrongCa, 2000, Date.now), { result: "tls", reached: false });
});

t.test("responses are parsed whole, by length or in chunks, and never past their end", async (t) => {
  const head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n";
  const chunked = Buffer.from(`${head}Transfer-Encoding: chunked\r\n\r\n4\r\n{"a"\r\n3\r\n:1}\r\n0\r\n\r\n`);
  t.same(parseResponse(chunked)?.response.body.toString(), '{"a":1}');
  t.equal(parseResponse(chunked.subarray(0, chunked.length - 2)), undefined, "the last chunk is not complete yet");
  const sized = Buffer.from(`${head}Content-Length: 7\r\nConnection: close\r\n\r\n{"a":1}`);
  t.match(parseResponse(sized), { keepAlive: false, used: sized.length });
  t.equal(parseResponse(sized.subarray(0, sized.length - 1)), undefined, "a body short of its length");
  t.throws(() => parseResponse(Buffer.from("SSH-2.0-OpenSSH\r\n\r\n")), /not an HTTP\/1\.1 response/);
  t.throws(() => parseResponse(Buffer.from(`${head}Content-Length: 99999999\r\n\r\n`)), /too large/);
});
