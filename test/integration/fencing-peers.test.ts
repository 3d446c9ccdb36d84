// The peer endpoint over mutual TLS with kubelet client certificates (clientAuth only), checked
// by hand against the cluster CA and the node name: real certificates from openssl, real TLS.
import t from "tap";
import { mkdtemp, readFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { createCA, issueCert } from "../../scripts/lib/pki.ts";
import { askPeer, PeerServer, type PeerTls } from "../../agent/fencing/peers.ts";

const dir = await mkdtemp(path.join(os.tmpdir(), "bashible-peers-"));
const ca = await createCA(dir, "ca", "kubernetes");
const rogueCA = await createCA(dir, "rogue", "kubernetes");
const nodeCert = async (name: string, signer = ca, cn = `system:node:${name}`) => {
  const c = await issueCert(dir, `${name}-${path.basename(signer.cert, ".crt")}`, signer, {
    cn,
    orgs: ["system:nodes"],
    client: true, // clientAuth only, as the kubelet's certificate
  });
  return { cert: await readFile(c.cert), key: await readFile(c.key), ca: await readFile(ca.cert) } satisfies PeerTls;
};

const [a, b, rogue, admin] = await Promise.all([
  nodeCert("node-a"),
  nodeCert("node-b"),
  nodeCert("node-b", rogueCA),
  nodeCert("admin", ca, "kubernetes-admin"),
]);

async function serve(tls: PeerTls, allowed = (n: string) => n === "node-a") {
  const s = new PeerServer({
    host: "127.0.0.1",
    port: 0,
    tls,
    allowed,
    report: () => ({ node: "node-b", reachedApi: true, result: "ok", ageMs: 100 }),
  });
  await s.start();
  t.teardown(() => s.stop());
  return s;
}

const ask = (port: number, tls: PeerTls, name = "node-b") =>
  askPeer({ name, address: "127.0.0.1" }, { port, tls, timeoutMs: 3000, maxReportAgeMs: 5000 });

t.test("two nodes of the cluster CA talk, each checking the other's node name", async (t) => {
  const b1 = await serve(b);
  t.same(await ask(b1.port, a), { node: "node-b", outcome: "reaches-api", detail: "ok" });
});

t.test("the asker refuses an answer from a certificate that is not the node it asked", async (t) => {
  const b1 = await serve(b);
  const r = await ask(b1.port, a, "node-c");
  t.equal(r.outcome, "bad-identity");
  t.match(r.detail, /answered as node-b/);
  const fake = await serve(rogue);
  const r2 = await ask(fake.port, a);
  t.equal(r2.outcome, "bad-identity", "a node-b certificate from another CA is not node-b");
  t.match(r2.detail, /not signed by the cluster CA/);
});

t.test("the endpoint refuses askers that are not nodes of the group", async (t) => {
  const b1 = await serve(b);
  t.match(await ask(b1.port, admin), { outcome: "no-answer", detail: /status 401: .*is not a node/ });
  const stranger = await nodeCert("node-z");
  t.match(await ask(b1.port, stranger), { outcome: "no-answer", detail: /status 403: .*node node-z is not a peer/ });
  const rogueAsker = { ...(await nodeCert("node-a", rogueCA)), ca: b.ca };
  t.match(await ask(b1.port, rogueAsker), {
    outcome: "no-answer",
    detail: /status 401: .*not signed by the cluster CA/,
  });
});

t.test("a stale report does not count as an answer about the API", async (t) => {
  const s = new PeerServer({
    host: "127.0.0.1",
    port: 0,
    tls: b,
    allowed: () => true,
    report: () => ({ node: "node-b", reachedApi: true, result: "ok", ageMs: 60_000 }),
  });
  await s.start();
  t.teardown(() => s.stop());
  t.equal((await ask(s.port, a)).outcome, "stale");
});
