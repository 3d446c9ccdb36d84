// The peer endpoint over mutual TLS, real certificates from openssl, real sockets: an answer
// counts only with the kubelet serving certificate of the Node asked, naming the address asked;
// askers show their kubelet client certificate (clientAuth only) and must be Nodes of the
// group; the port caps what it holds and closes what idles.
import t from "tap";
import { mkdtemp, readFile } from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import tls from "node:tls";
import { createCA, issueCert } from "../../scripts/lib/pki.ts";
import { askPeer, PEER_PATH, PeerServer, type PeerTls } from "../../agent/fencing/peers.ts";
import { type PeerLimits, peerLimits } from "../../agent/fencing/peer-limits.ts";
import type { ServingTls } from "../../agent/fencing/serving-cert.ts";

const dir = await mkdtemp(path.join(os.tmpdir(), "bashible-peers-"));
t.teardown(() => import("node:fs/promises").then((fs) => fs.rm(dir, { recursive: true, force: true })));
const ca = await createCA(dir, "ca", "kubernetes");
const rogueCA = await createCA(dir, "rogue", "kubernetes");
const caPem = await readFile(ca.cert);
let serial = 0;
/** A kubelet client certificate (clientAuth only): what an agent asks with. */
const clientCert = async (name: string, signer = ca, cn = `system:node:${name}`): Promise<PeerTls> => {
  const c = await issueCert(dir, `client-${++serial}`, signer, { cn, orgs: ["system:nodes"], client: true });
  return { cert: await readFile(c.cert), key: await readFile(c.key), ca: caPem };
};
/** A kubelet serving certificate (serverAuth, the node's name and addresses): what an agent answers with. */
const servingCert = async (name: string, ips = ["127.0.0.1"], signer = ca): Promise<ServingTls> => {
  const c = await issueCert(dir, `serving-${++serial}`, signer, {
    cn: `system:node:${name}`,
    orgs: ["system:nodes"],
    dnsNames: [name],
    ips,
  });
  return { cert: await readFile(c.cert), key: await readFile(c.key) };
};

const [askerA, servingB] = await Promise.all([clientCert("node-a"), servingCert("node-b")]);

async function serve(
  serving: ServingTls | PeerTls,
  o: { allowed?: (n: string) => boolean; limits?: Partial<PeerLimits>; nodeAddress?: string; ageMs?: number } = {},
) {
  const s = new PeerServer({
    host: "127.0.0.1",
    port: 0,
    serving,
    ca: caPem,
    allowed: o.allowed ?? ((n) => n === "node-a"),
    isNodeAddress: (ip) => ip === o.nodeAddress,
    limits: { ...peerLimits({ peerTimeoutMs: 3000, roundMs: 5000 }), ...o.limits },
    report: () => ({ node: "node-b", reachedApi: true, result: "ok", ageMs: o.ageMs ?? 100 }),
  });
  await s.start();
  t.teardown(() => s.stop());
  return s;
}

const ask = (port: number, asker: PeerTls, o: { name?: string; address?: string; localAddress?: string } = {}) =>
  askPeer(
    { name: o.name ?? "node-b", address: o.address ?? "127.0.0.1" },
    { port, tls: asker, timeoutMs: 3000, maxReportAgeMs: 5000, localAddress: o.localAddress },
  );

t.test("a node answers with its serving certificate; the asker checks its name and address", async (t) => {
  const b = await serve(servingB);
  t.same(await ask(b.port, askerA), { node: "node-b", outcome: "reaches-api", detail: "ok" });
});

t.test("an answer that does not prove it is the Node asked, at the address asked, does not count", async (t) => {
  const b = await serve(servingB);
  const other = await ask(b.port, askerA, { name: "node-c" });
  t.equal(other.outcome, "bad-identity", "node-b's certificate is not node-c");
  t.match(other.detail, /answered as node-b/);

  // What a bootstrap token yields: a kubelet client certificate for a name of one's choosing.
  const fake = await serve(await clientCert("node-b"));
  const r = await ask(fake.port, askerA);
  t.equal(r.outcome, "bad-identity", "a client certificate proves no address");
  t.match(r.detail, /not a serving certificate/);

  const elsewhere = await serve(await servingCert("node-b", ["127.0.0.9"]));
  const r2 = await ask(elsewhere.port, askerA);
  t.equal(r2.outcome, "bad-identity", "a serving certificate for another address");
  t.match(r2.detail, /does not name 127\.0\.0\.1/);

  const rogue = await serve(await servingCert("node-b", ["127.0.0.1"], rogueCA));
  const r3 = await ask(rogue.port, askerA);
  t.equal(r3.outcome, "bad-identity", "a node-b certificate from another CA is not node-b");
  t.match(r3.detail, /not signed by the cluster CA/);
});

t.test(
  "an IPv4 address counts in either spelling of the certificate (as the serving approver compares them)",
  async (t) => {
    const b = await serve(await servingCert("node-b", ["::ffff:127.0.0.1"]));
    t.equal((await ask(b.port, askerA)).outcome, "reaches-api");
  },
);

t.test("the endpoint refuses askers that are not nodes of the group", async (t) => {
  const b = await serve(servingB);
  t.match(await ask(b.port, await clientCert("admin", ca, "kubernetes-admin")), {
    outcome: "no-answer",
    detail: /status 401: .*is not a node/,
  });
  t.match(await ask(b.port, await clientCert("node-z")), {
    outcome: "no-answer",
    detail: /status 403: .*node node-z is not a peer/,
  });
  t.match(await ask(b.port, { ...(await clientCert("node-a", rogueCA)), ca: caPem }), {
    outcome: "no-answer",
    detail: /status 401: .*not signed by the cluster CA/,
  });
});

t.test("a stale report does not count as an answer about the API", async (t) => {
  const b = await serve(servingB, { allowed: () => true, ageMs: 60_000 });
  t.equal((await ask(b.port, askerA)).outcome, "stale");
});

/** Opens a TCP connection from `localAddress` and resolves once it is connected. */
function connectRaw(port: number, localAddress = "127.0.0.1"): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ port, host: "127.0.0.1", localAddress });
    s.once("connect", () => resolve(s));
    s.once("error", reject);
  });
}
const closed = (s: net.Socket) =>
  new Promise<void>((r) => (s.destroyed || s.closed ? r() : s.once("close", () => r())));

t.test("connections over the limits are closed at once; a Node's address still gets its answer", async (t) => {
  const b = await serve(servingB, {
    nodeAddress: "127.0.0.2",
    // Held connections are not timed out while the test looks at them.
    limits: { maxFromOthers: 4, perAddress: 2, newFromOthersPerSecond: 1000, firstRequestMs: 600_000 },
  });
  // Strangers: two per address, four in all; the fifth and the third from one address are closed.
  const held = [await connectRaw(b.port, "127.0.0.3"), await connectRaw(b.port, "127.0.0.3")];
  const third = await connectRaw(b.port, "127.0.0.3");
  await closed(third);
  held.push(await connectRaw(b.port, "127.0.0.4"), await connectRaw(b.port, "127.0.0.4"));
  const fifth = await connectRaw(b.port, "127.0.0.5");
  await closed(fifth);
  t.same(
    { perAddress: b.refused.perAddress, fromOthers: b.refused.fromOthers },
    { perAddress: 1, fromOthers: 1 },
    "one refused per limit",
  );
  t.ok(
    held.every((s) => !s.destroyed),
    "the connections within the limits stay open",
  );
  // A peer asking from its Node's address has a pool of its own.
  t.same(await ask(b.port, askerA, { localAddress: "127.0.0.2" }), {
    node: "node-b",
    outcome: "reaches-api",
    detail: "ok",
  });
  for (const s of held) s.destroy();
});

t.test("a connection that never sends a request, or idles after its answer, is closed", async (t) => {
  const b = await serve(servingB, { limits: { firstRequestMs: 300, idleMs: 300 } });
  // No TLS handshake at all.
  const idle = await connectRaw(b.port);
  await closed(idle);
  // A handshake, then a request head sent one byte at a time that never ends.
  const slow = tls.connect({ port: b.port, host: "127.0.0.1", ...askerA, rejectUnauthorized: false });
  slow.on("error", () => undefined);
  await new Promise((r) => slow.once("secureConnect", r));
  const head = `GET ${PEER_PATH} HTTP/1.1\r\nHost: x\r\n`;
  let i = 0;
  const drip = setInterval(() => slow.write(head[i++ % head.length] ?? "x"), 20);
  await closed(slow as unknown as net.Socket);
  clearInterval(drip);
  // A whole request, its answer, then nothing: kept alive for idleMs, then closed.
  const kept = tls.connect({ port: b.port, host: "127.0.0.1", ...askerA, rejectUnauthorized: false });
  kept.on("error", () => undefined);
  let answer = "";
  kept.on("data", (d) => (answer += d));
  await new Promise((r) => kept.once("secureConnect", r));
  kept.write(`GET ${PEER_PATH} HTTP/1.1\r\nHost: x\r\n\r\n`);
  await closed(kept as unknown as net.Socket);
  t.match(answer, /^HTTP\/1\.1 200/, "answered before it was closed");
  t.pass("all three closed by the endpoint");
});

t.test("a request with a body, or a head larger than a peer's, is refused", async (t) => {
  const b = await serve(servingB);
  const send = (req: string) =>
    new Promise<string>((resolve) => {
      const s = tls.connect({ port: b.port, host: "127.0.0.1", ...askerA, rejectUnauthorized: false });
      let out = "";
      s.on("data", (d) => (out += d));
      s.on("error", () => undefined);
      s.once("close", () => resolve(out));
      s.once("secureConnect", () => s.write(req));
    });
  t.match(await send(`POST ${PEER_PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello`), /^HTTP\/1\.1 413/);
  t.match(await send(`GET ${PEER_PATH} HTTP/1.1\r\nHost: x\r\nX-Pad: ${"a".repeat(8192)}\r\n\r\n`), /^HTTP\/1\.1 431/);
});
