// The bundle server as an aggregated API behind a real kube-apiserver: kubectl get and watch
// work through the API server, and each caller reads only what it may.
import t from "tap";
import { withControlPlane } from "../../scripts/lib/control-plane-fixture.ts";
import { registerBundleServer } from "../../scripts/lib/bundle-server.ts";
import { spawn } from "node:child_process";
import path from "node:path";
import { KubeClient } from "../../lib/kube/client.ts";
import { loadKubeconfig } from "../../lib/kube/kubeconfig.ts";
import { KubeStatusError } from "../../lib/kube/errors.ts";
import { createSecret, getSecret, list } from "../../lib/kube/api.ts";
import { ensureGroupToken, TOKEN_TTL_MS } from "../../cluster/server/bootstrap-secrets.ts";
import { writeChecksums } from "../../cluster/server/checksums.ts";
import { until } from "../../scripts/lib/until.ts";

// Service routing (not endpoint routing): the aggregator then resolves an ExternalName Service
// to its name, which is how it reaches a server on loopback (Endpoints refuse loopback IPs).
const cp = await withControlPlane(t, { extraApiserverArgs: ["--enable-aggregator-routing=false"] });
const { app } = await registerBundleServer(cp);
t.teardown(() => app.stop());

const API = "/apis/bashible.deckhouse.io/v1alpha1";
const NS = "d8-cloud-instance-manager";

const served = () => app.store.get("nodegroupbundles", "worker")!.object.checksum as string;
const secretChecksum = async (group: string) => {
  const s = await getSecret(cp.admin, NS, "configuration-checksums");
  const v = (s.data as Record<string, string>)[group];
  return v ? Buffer.from(v, "base64").toString() : undefined;
};

await cp.kubectl(["apply", "-f", "-"], {
  input: JSON.stringify({
    apiVersion: "v1",
    kind: "List",
    items: [
      {
        apiVersion: "v1",
        kind: "Node",
        metadata: { name: "worker-1", labels: { "node.deckhouse.io/group": "worker" } },
      },
      {
        apiVersion: "v1",
        kind: "Node",
        metadata: { name: "front-1", labels: { "node.deckhouse.io/group": "frontend" } },
      },
      {
        apiVersion: "deckhouse.io/v1",
        kind: "NodeGroup",
        metadata: { name: "frontend" },
        spec: { nodeType: "CloudEphemeral" },
      },
    ],
  }),
});
await until("frontend rendered", async () => app.store.get("nodegroupbundles", "frontend"));

t.test("kubectl gets the three resources through the API server", async (t) => {
  const yaml = await cp.kubectl(["get", "nodegroupbundles", "worker", "-o", "yaml"]);
  t.match(yaml, /kind: NodeGroupBundle/);
  t.match(yaml, /bashible.deckhouse.io\/configuration-checksum: [0-9a-f]{64}/);
  t.match(yaml, /name: 050_sysctl-tuning/);
  const bashibles = await cp.kubectl(["get", "bashibles", "worker"]);
  t.match(bashibles, /NAME\s+CHECKSUM/);
  t.match(bashibles, /worker\s+[0-9a-f]{16}/);
  const listed = await cp.kubectl(["get", "nodegroupbundles"]);
  t.match(listed, /NAME\s+CHECKSUM\s+STEPS\n(?:.*\n)*worker\s+[0-9a-f]{16}\s+\d+\n/, "server-side columns");
  const bootstrap = await cp.kubectl(["get", "bootstrap", "worker", "-o", "jsonpath={.bootstrap}"]);
  t.match(bootstrap, /^#!\/bin\/bash/);
});

const clientFor = async (kubeconfig: string) => {
  const c = new KubeClient(await loadKubeconfig(kubeconfig));
  t.teardown(() => c.close());
  return c;
};
const refused = async (c: KubeClient, p: string) => {
  const err = await c.request("GET", p).catch((e) => e);
  return err instanceof KubeStatusError ? err : undefined;
};

t.test("a node reads its own group's bundle and is refused another group's", async (t) => {
  const id = await cp.mintNode("worker-1");
  const node = await clientFor(id.kubeconfig);
  const b = await node.request<{ nodeGroup: string; checksum: string }>("GET", `${API}/nodegroupbundles/worker`);
  t.equal(b.nodeGroup, "worker");
  t.equal(b.checksum, served());
  for (const p of [`${API}/nodegroupbundles/frontend`, `${API}/bashibles/frontend`, `${API}/bootstrap/frontend`]) {
    const err = await refused(node, p);
    t.equal(err?.status, 403, `${p} refused`);
    t.match(err?.message, /user "system:node:worker-1" may read only node group worker/);
  }
  const listed = await node.request<{ items: { metadata: { name: string } }[] }>("GET", `${API}/nodegroupbundles`);
  t.same(
    listed.items.map((i) => i.metadata.name),
    ["worker"],
    "a list shows only its own group",
  );
  const watchErr = await (async () => {
    for await (const _ of node.watch(`${API}/nodegroupbundles`, { fieldSelector: "metadata.name=frontend" })) break;
  })().catch((e) => e);
  t.equal(watchErr?.status, 403, "watching another group is refused too");
});

t.test("a node cannot move itself into another group", async (t) => {
  const node = await clientFor((await cp.mintNode("worker-1")).kubeconfig);
  const patch = { metadata: { labels: { "node.deckhouse.io/group": "frontend" } } };
  const err = await node.request("PATCH", "/api/v1/nodes/worker-1", { body: patch }).catch((e) => e);
  t.equal(err?.status, 403);
  t.match(err?.message, /may not change its own node.deckhouse.io\/group label/);
  const n = await cp.admin.request<{ metadata: { labels: Record<string, string> } }>("GET", "/api/v1/nodes/worker-1");
  t.equal(n.metadata.labels["node.deckhouse.io/group"], "worker");
  await node.request("PATCH", "/api/v1/nodes/worker-1", { body: { metadata: { labels: { other: "ok" } } } });
  t.pass("other labels stay writable");
});

t.test("a node without a group label, or a non-node user, reads nothing", async (t) => {
  const ghost = await clientFor((await cp.mintNode("ghost")).kubeconfig);
  t.equal((await refused(ghost, `${API}/nodegroupbundles/worker`))?.status, 403);
  const token = await cp.mintBootstrapToken();
  const file = await cp.writeKubeconfig(path.join(cp.dir, "plain-token.kubeconfig"), { token });
  const plain = await clientFor(file);
  const err = await refused(plain, `${API}/bootstrap/worker`);
  t.equal(err?.status, 403, "a bootstrap token without a group scope is refused");
  t.match(err?.message, /may read only nothing/);
});

t.test("a group-scoped bootstrap token reads only its group", async (t) => {
  const token = await cp.mintBootstrapToken({ extraGroups: ["system:bootstrappers:d8-node-manager:worker"] });
  const file = await cp.writeKubeconfig(path.join(cp.dir, "worker-token.kubeconfig"), { token });
  const c = await clientFor(file);
  const boot = await c.request<{ bootstrap: string }>("GET", `${API}/bootstrap/worker`);
  t.match(boot.bootstrap, /bootstrap of node group worker complete/);
  t.equal((await refused(c, `${API}/bootstrap/frontend`))?.status, 403);
});

t.test("a token made as Deckhouse makes them is scoped by its node-group label", async (t) => {
  // Deckhouse's hook: label node-manager.deckhouse.io/node-group, extra group d8-node-manager only.
  const id = "dkhs01";
  const secret = "0123456789abcdef";
  await createSecret(cp.admin, {
    apiVersion: "v1",
    kind: "Secret",
    type: "bootstrap.kubernetes.io/token",
    metadata: {
      name: `bootstrap-token-${id}`,
      namespace: "kube-system",
      labels: { "node-manager.deckhouse.io/node-group": "worker" },
    },
    stringData: {
      "token-id": id,
      "token-secret": secret,
      expiration: new Date(Date.now() + 3600_000).toISOString().replace(/\.\d+Z$/, "Z"),
      "usage-bootstrap-authentication": "true",
      "usage-bootstrap-signing": "true",
      "auth-extra-groups": "system:bootstrappers:d8-node-manager",
    },
  });
  const c = await clientFor(
    await cp.writeKubeconfig(path.join(cp.dir, "deckhouse-token.kubeconfig"), { token: `${id}.${secret}` }),
  );
  const boot = await c.request<{ bootstrap: string }>("GET", `${API}/bootstrap/worker`);
  t.match(boot.bootstrap, /bootstrap of node group worker complete/);
  t.equal((await refused(c, `${API}/bootstrap/frontend`))?.status, 403);
});

t.test("kubectl get -w sees a NodeGroupConfiguration change within seconds", async (t) => {
  const kubectl = spawn(
    path.join(cp.binDir, "kubectl"),
    [
      `--kubeconfig=${cp.adminKubeconfig}`,
      "get",
      "nodegroupbundles",
      "worker",
      "-w",
      "-o",
      "jsonpath={.checksum}{'\\n'}",
    ],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  t.teardown(() => kubectl.kill());
  let out = "";
  kubectl.stdout.on("data", (d: Buffer) => (out += d.toString()));
  // The default (server-side Table) output, as a person would run it.
  const table = spawn(
    path.join(cp.binDir, "kubectl"),
    [`--kubeconfig=${cp.adminKubeconfig}`, "get", "nodegroupbundles", "worker", "-w"],
    {
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  t.teardown(() => table.kill());
  let tableOut = "";
  table.stdout.on("data", (d: Buffer) => (tableOut += d.toString()));
  const before = served();
  await until("first line", async () => out.includes(before));
  const id = await cp.mintNode("worker-1");
  const node = await clientFor(id.kubeconfig);
  const abort = new AbortController();
  const nodeSaw: string[] = [];
  const nodeWatch = (async () => {
    for await (const ev of node.watch<{ checksum: string }>(`${API}/nodegroupbundles`, {
      fieldSelector: "metadata.name=worker",
      signal: abort.signal,
    })) {
      nodeSaw.push(`${ev.type}:${ev.object.checksum}`);
    }
  })();
  await until("node watch started", async () => nodeSaw.length > 0);

  await cp.kubectl([
    "patch",
    "nodegroupconfiguration",
    "sysctl-tuning",
    "--type=merge",
    "-p",
    '{"spec":{"content":"echo changed\\n"}}',
  ]);
  const after = await until("new checksum served", async () => (served() !== before ? served() : undefined));
  await until("kubectl printed the new checksum", async () => out.includes(after));
  await until("kubectl's table printed the new checksum", async () => tableOut.includes(after.slice(0, 16)));
  t.match(
    tableOut,
    /^NAME\s+CHECKSUM\s+STEPS\nworker\s+[0-9a-f]{16}\s+(\d+)\nworker\s+[0-9a-f]{16}\s+\1\n/,
    "header once, then rows",
  );
  await until("the node's watch got it", async () => nodeSaw.includes(`MODIFIED:${after}`));
  abort.abort();
  await nodeWatch;
  t.equal(
    await until("Secret updated", async () => ((await secretChecksum("worker")) === after ? after : undefined)),
    after,
  );
});

t.test("scaling a NodeGroup leaves its checksum alone", async (t) => {
  const before = served();
  const passes = app.loop.passes;
  await cp.kubectl(["patch", "nodegroup", "worker", "--type=merge", "-p", '{"spec":{"staticInstances":{"count":5}}}']);
  await until("a render pass", async () => app.loop.passes > passes);
  t.equal(served(), before);
  t.equal(await secretChecksum("worker"), before);
});

t.test("a bad NodeUser keeps the last good bundle and is reported", async (t) => {
  const before = served();
  const errorsBefore = app.metrics.renderErrors.get({ group: "worker" });
  await cp.kubectl(["apply", "-f", "-"], {
    input: JSON.stringify({
      apiVersion: "deckhouse.io/v1",
      kind: "NodeUser",
      metadata: { name: "root" },
      spec: { uid: 1500, sshPublicKeys: ["ssh-ed25519 AAAA root"], nodeGroups: ["worker"] },
    }),
  });
  const ev = await until("an Event on the NodeGroup", async () => {
    const l = await list<{ reason: string; message: string; involvedObject: { kind: string; name: string } }>(
      cp.admin,
      "/api/v1/namespaces/default/events",
    );
    return l.items.find((e) => e.reason === "BashibleRenderFailed" && e.involvedObject.name === "worker");
  });
  t.equal(ev.involvedObject.kind, "NodeGroup");
  t.match(ev.message, /NodeUser\/root: 'root' is a system account/);
  t.equal(served(), before, "the last good bundle is still served");
  t.equal(await secretChecksum("worker"), before, "the checksum Secret keeps the last good value");
  t.ok(app.metrics.renderErrors.get({ group: "worker" }) > errorsBefore);
  const id = await cp.mintNode("worker-1");
  const node = await clientFor(id.kubeconfig);
  t.equal((await node.request<{ checksum: string }>("GET", `${API}/nodegroupbundles/worker`)).checksum, before);
  await cp.kubectl(["delete", "nodeuser", "root"]);
  const passes = app.loop.passes;
  await until("a render pass", async () => app.loop.passes > passes);
  t.equal(served(), before, "removing the bad user renders the same bundle again");
});

t.test("a Static group gets a manual bootstrap Secret whose token reads its bootstrap script", async (t) => {
  const s = await until("Secret", async () => getSecret(cp.admin, NS, "manual-bootstrap-for-worker"));
  const data = Object.fromEntries(
    Object.entries(s.data as Record<string, string>).map(([k, v]) => [k, Buffer.from(v, "base64").toString()]),
  );
  t.same(Object.keys(data).sort(), ["apiserverEndpoints", "bootstrap.sh", "cloud-config"]);
  t.match(data["cloud-config"], /^#cloud-config/);
  t.match(data.apiserverEndpoints, new RegExp(new URL(cp.server).host));
  const token = data["bootstrap.sh"]!.match(/printf '%s' '([a-z0-9]{6}\.[a-z0-9]{16})'/)?.[1];
  t.ok(token, "bootstrap.sh carries a bootstrap token");
  const secret = await getSecret(cp.admin, "kube-system", `bootstrap-token-${token!.split(".")[0]}`);
  t.equal(
    Buffer.from((secret.data as Record<string, string>)["auth-extra-groups"]!, "base64").toString(),
    "system:bootstrappers:d8-node-manager,system:bootstrappers:d8-node-manager:worker",
  );
  const file = await cp.writeKubeconfig(path.join(cp.dir, "manual.kubeconfig"), { token: token! });
  const c = await clientFor(file);
  const res = await c.raw("GET", `${API}/bootstrap/worker`, { headers: { Accept: "text/plain" } });
  t.equal(res.status, 200);
  t.match(res.body.toString(), /^#!\/bin\/bash\n# Phase 2/, "the bare script, as bootstrap.sh asks for it");
  t.equal((await refused(c, `${API}/bootstrap/frontend`))?.status, 403);
  t.rejects(getSecret(cp.admin, NS, "manual-bootstrap-for-frontend"), "no Secret for a CloudEphemeral group");
});

t.test("a group token is reused while 3 h remain and replaced after", async (t) => {
  const now = Date.now();
  const a = await ensureGroupToken(cp.admin, "worker", now);
  const b = await ensureGroupToken(cp.admin, "worker", now + 30 * 60_000);
  t.equal(b.token, a.token, "still 3.5 h left: same token");
  const c = await ensureGroupToken(cp.admin, "worker", now + TOKEN_TTL_MS - 2.5 * 3600_000 + 60_000);
  t.not(c.token, a.token, "under 3 h left: a fresh token");
  t.ok(Date.parse(c.expiration) > Date.parse(a.expiration));
});

t.test("the aggregator reaches the server over HTTP/2 (watches multiplex on few connections)", async (t) => {
  const text = app.metrics.text();
  t.match(text, /bashible_server_requests_total\{code="200",http="2",resource="nodegroupbundles",verb="watch"\} \d+/);
});

t.test("concurrent checksum writers all succeed (conflicts are retried)", async (t) => {
  const ns = "checksum-race";
  await cp.kubectl(["create", "namespace", ns]);
  const maps = Array.from({ length: 6 }, (_, i) => new Map([["g", `c${i}`]]));
  const results = await Promise.all(maps.map((m) => writeChecksums(cp.admin, m, { namespace: ns })));
  t.ok(results.some(Boolean), "someone wrote");
  const s = await getSecret(cp.admin, ns, "configuration-checksums");
  t.match(Buffer.from((s.data as Record<string, string>).g!, "base64").toString(), /^c[0-5]$/);
});

t.test("deleting a NodeGroup removes its bundle, its checksum, and tells watchers", async (t) => {
  const abort = new AbortController();
  const events: string[] = [];
  const watching = (async () => {
    for await (const ev of cp.admin.watch<{ metadata: { name: string } }>(`${API}/nodegroupbundles`, {
      fieldSelector: "metadata.name=frontend",
      signal: abort.signal,
    })) {
      events.push(ev.type);
    }
  })();
  await until("watch started", async () => events.length > 0);
  await cp.kubectl(["delete", "nodegroup", "frontend"]);
  await until("DELETED event", async () => events.includes("DELETED"));
  abort.abort();
  await watching;
  t.equal((await cp.admin.raw("GET", `${API}/nodegroupbundles/frontend`)).status, 404);
  t.equal(
    await until("Secret without frontend", async () => ((await secretChecksum("frontend")) ? undefined : "gone")),
    "gone",
  );
  t.ok(await secretChecksum("worker"), "other groups stay");
});
