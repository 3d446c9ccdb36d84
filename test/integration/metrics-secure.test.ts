// The node agent's metrics for an in-cluster Prometheus, against the real kube-apiserver (Node
// and RBAC authorizers): a ServiceAccount allowed to get nodes/metrics reads them over TLS with
// the kubelet's serving certificate, one without that permission gets 403, no token or a garbage
// one 401, both reviews made with the kubelet's own identity; loopback keeps answering without a
// token; the listener waits for the certificate and serves a rotated one.
import t from "tap";
import { mkdir, mkdtemp, readFile, rename, rm, writeFile } from "node:fs/promises";
import { request } from "node:https";
import { request as plainRequest } from "node:http";
import { connect, type Socket } from "node:net";
import os from "node:os";
import path from "node:path";
import type { TLSSocket } from "node:tls";
import { startResidentJobs } from "../../agent/commands/resident-jobs.ts";
import { PATHS } from "../../bundles/paths.ts";
import { KUBELET_SERVING_CERT, startSecureMetrics } from "../../agent/metrics-secure.ts";
import { LISTENER_LIMITS } from "../../agent/metrics-server.ts";
import { KubeClient } from "../../lib/kube/client.ts";
import { loadKubeconfig } from "../../lib/kube/kubeconfig.ts";
import { issueCert } from "../../lib/pki.ts";
import { Registry } from "../../lib/prometheus.ts";
import { freePort, startControlPlane } from "../../scripts/lib/control-plane.ts";
import { captureLogger } from "../../scripts/lib/early-oom.ts";
import { until } from "../../scripts/lib/until.ts";

const NODE = "metrics-node-1";
const cp = await startControlPlane();
t.teardown(() => cp.stop());
const kubelet = new KubeClient(await loadKubeconfig((await cp.mintNode(NODE)).kubeconfig));
t.teardown(() => kubelet.close());

for (const args of [
  ["create", "serviceaccount", "prometheus", "-n", "default"],
  ["create", "serviceaccount", "nosy", "-n", "default"],
  ["create", "clusterrole", "node-metrics-reader", "--verb=get", "--resource=nodes/metrics"],
  [
    "create",
    "clusterrolebinding",
    "prometheus-node-metrics",
    "--clusterrole=node-metrics-reader",
    "--serviceaccount=default:prometheus",
  ],
])
  await cp.kubectl(args);
const tokenOf = async (sa: string) =>
  (await cp.kubectl(["create", "token", sa, "-n", "default", "--duration=1h"])).trim();
const allowed = await tokenOf("prometheus");
const denied = await tokenOf("nosy");
const caPem = await readFile(cp.ca.cert);

const dir = await mkdtemp(path.join(os.tmpdir(), "bashible-metrics-secure-"));
t.teardown(() => rm(dir, { recursive: true, force: true }));

/** The kubelet's serving certificate as the kubelet writes it: certificate and key in one PEM. */
async function servingPem(root: string, name: string): Promise<void> {
  const c = await issueCert(dir, name, cp.ca, {
    cn: `system:node:${NODE}`,
    orgs: ["system:nodes"],
    ips: ["127.0.0.1"],
  });
  const file = path.join(root, KUBELET_SERVING_CERT);
  await mkdir(path.dirname(file), { recursive: true });
  const pem = `${await readFile(c.cert, "utf8")}${await readFile(c.key, "utf8")}`;
  await writeFile(`${file}.new`, pem, { mode: 0o600 });
  await rename(`${file}.new`, file); // replaced at once, as the kubelet swaps its symlink
}

interface Answer {
  status: number;
  body: string;
  /** The served certificate's SHA-256 fingerprint. */
  fingerprint: string;
}

function get(port: number, token?: string, urlPath = "/metrics"): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: "127.0.0.1",
        port,
        path: urlPath,
        ca: caPem, // verified: the certificate is the kubelet's, for the node's address
        agent: false,
        headers: token ? { authorization: `Bearer ${token}` } : {},
      },
      (res) => {
        let body = "";
        res.on("data", (d) => (body += d));
        res.on("end", () =>
          resolve({
            status: res.statusCode ?? 0,
            body,
            fingerprint: (res.socket as TLSSocket).getPeerX509Certificate()?.fingerprint256 ?? "",
          }),
        );
      },
    );
    req.on("error", reject);
    req.end();
  });
}

t.test("bashible run's jobs: allowed 200, not allowed 403, no or garbage token 401, loopback as before", async (t) => {
  const root = path.join(dir, "run");
  await servingPem(root, "serving-run");
  const [plainPort, securePort] = [await freePort(), await freePort()];
  const log = captureLogger();
  const jobs = await startResidentJobs({
    values: {
      "early-oom": "off",
      "metrics-address": `127.0.0.1:${plainPort}`,
      "metrics-secure-address": `127.0.0.1:${securePort}`,
    },
    root,
    log,
    nodeName: NODE,
    kube: () => kubelet,
  });
  t.teardown(() => jobs.stop());
  jobs.registry.gauge("bashible_test_up", "a series to find").set(1);

  const ok = await until("the secure listener to answer", () => get(securePort, allowed).catch(() => undefined));
  t.equal(ok.status, 200, "the ServiceAccount that may get nodes/metrics");
  t.match(ok.body, /^bashible_test_up 1$/m, "the agent's metrics text");
  t.match(ok.body, /^process_resident_memory_bytes /m);

  const forbidden = await get(securePort, denied);
  t.equal(forbidden.status, 403, "a valid token whose user may not get nodes/metrics");
  t.equal(forbidden.body, "", "no detail");
  const noToken = await get(securePort);
  t.equal(noToken.status, 401, "no token");
  t.equal(noToken.body, "");
  t.equal((await get(securePort, "garbage.not-a-jwt")).status, 401, "a garbage token");
  t.equal((await get(securePort, `${allowed}x`)).status, 401, "a tampered token");
  t.equal((await get(securePort, allowed)).status, 200, "allowed again (cached or not, the same answer)");
  t.equal(
    (await get(securePort, allowed, "/early-oom")).status,
    404,
    "the paths loopback serves, no other (early OOM is off here)",
  );

  // Loopback: no token, as before.
  const local = await new Promise<{ status: number; body: string }>((resolve, reject) => {
    const req = plainRequest({ host: "127.0.0.1", port: plainPort, path: "/metrics" }, (res) => {
      let body = "";
      res.on("data", (d) => (body += d));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on("error", reject);
    req.end();
  });
  t.equal(local.status, 200, "the loopback listener needs no token");
  t.match(local.body, /^bashible_test_up 1$/m);

  // The reviews above were the kubelet's: allowed by the Node authorizer, not by an RBAC binding.
  const binding = await cp.admin.request<{ subjects?: unknown[] }>(
    "GET",
    "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/system:node",
  );
  t.same(binding.subjects ?? [], [], "system:node is bound to no one: the Node authorizer let the node review");

  const logged = JSON.stringify(log.lines);
  t.notOk(logged.includes(allowed) || logged.includes(denied), "no token in the log");
  t.ok(log.lines.some((l) => /metrics listening on 127\.0\.0\.1:\d+ \(TLS/.test(l.msg)));
});

/** A converge's record that it applied a bundle with this context (what the resident agent follows). */
async function applyBundle(root: string, n: number, context: Record<string, unknown>): Promise<void> {
  const checksum = n.toString(16).padStart(64, "0");
  await mkdir(path.join(root, PATHS.bundles), { recursive: true });
  await writeFile(path.join(root, PATHS.bundles, `${checksum}.json`), JSON.stringify({ checksum, context }));
  await writeFile(`${path.join(root, PATHS.status)}.new`, JSON.stringify({ appliedChecksum: checksum }));
  await rename(`${path.join(root, PATHS.status)}.new`, path.join(root, PATHS.status));
}

/** Whether something accepts connections on 127.0.0.1:`port`. */
const listening = (port: number) =>
  new Promise<boolean>((resolve) => {
    const s = connect(port, "127.0.0.1");
    s.once("connect", () => {
      s.destroy();
      resolve(true);
    });
    s.once("error", () => resolve(false));
  });

t.test(
  "without the flag the listener follows the cluster's setting in the applied bundle; the flag wins",
  async (t) => {
    const root = path.join(dir, "follow");
    await servingPem(root, "serving-follow");
    const [p1, p2, p3] = [await freePort(), await freePort(), await freePort()];
    const log = captureLogger();
    const jobs = await startResidentJobs({
      values: { "early-oom": "off", "metrics-address": "off" },
      root,
      log,
      nodeName: NODE,
      kube: () => kubelet,
    });
    t.teardown(() => jobs.stop());
    t.notOk(await listening(p1), "nothing applied yet: off");

    await applyBundle(root, 1, { agent: { metricsSecureAddress: `127.0.0.1:${p1}` } });
    jobs.refresh();
    const ok = await until("the listener on the bundle's address", () => get(p1, allowed).catch(() => undefined));
    t.equal(ok.status, 200, "authenticated as with the flag");
    t.equal((await get(p1)).status, 401);

    await applyBundle(root, 2, { agent: { metricsSecureAddress: `127.0.0.1:${p2}` } });
    jobs.refresh();
    t.equal(
      (await until("the listener on the new address", () => get(p2, allowed).catch(() => undefined))).status,
      200,
    );
    t.notOk(await listening(p1), "the old address closed before the new one bound");

    await applyBundle(root, 3, { nodeGroup: { name: "worker" } });
    jobs.refresh();
    await until("the listener to close with the setting gone", async () => !(await listening(p2)));
    t.ok(log.lines.some((l) => l.msg === "authenticated metrics follow the cluster's setting: off"));

    // The node's own flag: the bundle's address is never opened.
    const pinnedRoot = path.join(dir, "pinned");
    await servingPem(pinnedRoot, "serving-pinned");
    await applyBundle(pinnedRoot, 4, { agent: { metricsSecureAddress: `127.0.0.1:${p3}` } });
    const pinnedPort = await freePort();
    const pinned = await startResidentJobs({
      values: { "early-oom": "off", "metrics-address": "off", "metrics-secure-address": `127.0.0.1:${pinnedPort}` },
      root: pinnedRoot,
      log: captureLogger(),
      nodeName: NODE,
      kube: () => kubelet,
    });
    t.teardown(() => pinned.stop());
    pinned.refresh();
    t.equal((await until("the flag's listener", () => get(pinnedPort, allowed).catch(() => undefined))).status, 200);
    t.notOk(await listening(p3), "the node's flag wins over the bundle");
  },
);

t.test("waits for the kubelet's certificate with one log line, then serves it, and a rotated one", async (t) => {
  const root = path.join(dir, "wait");
  const registry = new Registry();
  registry.gauge("bashible_test_up", "a series to find").set(1);
  const log = captureLogger();
  const secure = await startSecureMetrics({
    registry,
    address: `127.0.0.1:${await freePort()}`,
    root,
    log,
    nodeName: NODE,
    kube: () => kubelet,
    pollMs: 50,
  });
  t.teardown(() => secure.close());
  const waiting = await until("the waiting line", () =>
    log.lines.find((l) => /wait for the kubelet's serving certificate/.test(l.msg)),
  );
  t.match(waiting.msg, /kubectl get csr/, "says what to look at");
  await servingPem(root, "serving-1");
  const { port } = await secure.listening;
  t.equal(
    log.lines.filter((l) => /wait for the kubelet's serving certificate/.test(l.msg)).length,
    1,
    "one line while waiting",
  );
  const a = await get(port, allowed);
  t.equal(a.status, 200);
  const served1 = a.fingerprint;
  t.ok(served1, "a certificate was presented");

  await servingPem(root, "serving-2");
  const rotated = await until("the rotated certificate to be served", async () => {
    const r = await get(port, allowed);
    return r.fingerprint !== served1 && r;
  });
  t.equal(rotated.status, 200, "the rotated certificate serves, the token still checked");
  t.ok(log.lines.some((l) => /rotated certificate/.test(l.msg)));
});

t.test("internal:PORT waits for the Node's InternalIP, then listens there", async (t) => {
  const root = path.join(dir, "internal");
  await servingPem(root, "serving-internal");
  await cp.admin.request("POST", "/api/v1/nodes", {
    body: { apiVersion: "v1", kind: "Node", metadata: { name: NODE } },
  });
  const log = captureLogger();
  const port = await freePort();
  const secure = await startSecureMetrics({
    registry: new Registry(),
    address: `internal:${port}`,
    root,
    log,
    nodeName: NODE,
    kube: () => kubelet,
    pollMs: 50,
  });
  t.teardown(() => secure.close());
  await until("the waiting line", () => log.lines.find((l) => /wait for Node metrics-node-1's InternalIP/.test(l.msg)));
  await cp.admin.request("PATCH", `/api/v1/nodes/${NODE}/status`, {
    contentType: "application/merge-patch+json",
    body: { status: { addresses: [{ type: "InternalIP", address: "127.0.0.1" }] } },
  });
  t.same(await secure.listening, { host: "127.0.0.1", port }, "bound to the InternalIP");
  t.equal((await get(port, allowed)).status, 200);
  t.equal((await get(port)).status, 401);
});

t.test("200 sockets that never start TLS: a scrape is still answered, and at most the cap stay open", async (t) => {
  const root = path.join(dir, "flood");
  await servingPem(root, "serving-flood");
  const secure = await startSecureMetrics({
    registry: new Registry(),
    address: `127.0.0.1:${await freePort()}`,
    root,
    log: captureLogger(),
    nodeName: NODE,
    kube: () => kubelet,
    // Handshake and idle timeouts far beyond the wait below: only the cap can close them in time.
    limits: { ...LISTENER_LIMITS, headersMs: 300_000, idleMs: 300_000 },
  });
  t.teardown(() => secure.close());
  const { port } = await secure.listening;
  const idle = await Promise.all(
    Array.from(
      { length: 200 },
      () =>
        new Promise<Socket>((resolve) => {
          const s = connect(port, "127.0.0.1");
          s.on("error", () => undefined);
          s.once("connect", () => resolve(s));
          s.once("close", () => resolve(s));
        }),
    ),
  );
  t.teardown(() => {
    for (const s of idle) s.destroy();
  });
  const open = () => idle.filter((s) => !s.destroyed && s.readyState === "open").length;
  await until(
    `the listener to hold at most ${LISTENER_LIMITS.maxConnections} of them`,
    () => open() <= LISTENER_LIMITS.maxConnections,
  );
  t.equal((await get(port, allowed)).status, 200, "the scrape is answered");
  t.ok(open() <= LISTENER_LIMITS.maxConnections, `${open()} of 200 still open`);
});
