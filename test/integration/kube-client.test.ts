// The agent's Kubernetes client against a real kube-apiserver: node identities, merge
// patches, events, list + watch, evictions, leases, secrets, and every error class.
import t from "tap";
import { createServer as createTcpServer, type Server } from "node:net";
import { withControlPlane } from "../../scripts/lib/control-plane-fixture.ts";
import { KubeClient } from "../../lib/kube/client.ts";
import { loadKubeconfig, bootstrapConnection, KubeconfigError } from "../../lib/kube/kubeconfig.ts";
import {
  KubeRefusedError,
  KubeStatusError,
  KubeTimeoutError,
  KubeTLSError,
  isConflict,
  isForbidden,
} from "../../lib/kube/errors.ts";
import * as api from "../../lib/kube/api.ts";
import { freePort } from "../../scripts/lib/control-plane.ts";
import { createCA } from "../../scripts/lib/pki.ts";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";

const cp = await withControlPlane(t);
const admin = cp.admin;

async function createNode(name: string, labels: Record<string, string> = {}) {
  return admin.request("POST", "/api/v1/nodes", {
    body: { apiVersion: "v1", kind: "Node", metadata: { name, labels } },
  });
}

await createNode("worker-1", { "node.deckhouse.io/group": "worker" });
await createNode("worker-2", { "node.deckhouse.io/group": "worker" });

t.test("a node identity may patch its own Node and is refused another's", async (t) => {
  const id = await cp.mintNode("worker-1");
  const node = new KubeClient(await loadKubeconfig(id.kubeconfig));
  t.teardown(() => node.close());
  const patched = await api.patchNode(node, "worker-1", {
    metadata: { annotations: { "node.deckhouse.io/configuration-checksum": "abc" } },
  });
  t.equal(patched.metadata.annotations?.["node.deckhouse.io/configuration-checksum"], "abc");

  const err = await api.patchNode(node, "worker-2", { metadata: { annotations: { x: "y" } } }).catch((e) => e);
  t.type(err, KubeStatusError);
  t.equal(err.status, 403);
  t.ok(isForbidden(err));
  t.match(err.message, /worker-2/);
  const other = await api.getNode(admin, "worker-2");
  t.notOk(other.metadata.annotations?.x, "the other node is unchanged");
});

t.test("merge patch deletes keys with null and patches status", async (t) => {
  await api.patchNode(admin, "worker-1", { metadata: { annotations: { "update.node.deckhouse.io/reboot": "" } } });
  let n = await api.getNode(admin, "worker-1");
  t.equal(n.metadata.annotations?.["update.node.deckhouse.io/reboot"], "");
  await api.patchNode(admin, "worker-1", { metadata: { annotations: { "update.node.deckhouse.io/reboot": null } } });
  n = await api.getNode(admin, "worker-1");
  t.notOk("update.node.deckhouse.io/reboot" in (n.metadata.annotations ?? {}));

  const id = await cp.mintNode("worker-1");
  const node = new KubeClient(await loadKubeconfig(id.kubeconfig));
  t.teardown(() => node.close());
  const now = new Date().toISOString().replace(/\.\d+Z$/, "Z");
  await api.patchNodeStatus(node, "worker-1", {
    status: {
      conditions: [
        {
          type: "Ready",
          status: "False",
          reason: "BashibleTest",
          message: "set by test",
          lastHeartbeatTime: now,
          lastTransitionTime: now,
        },
      ],
    },
  });
  n = await api.getNode(admin, "worker-1");
  const ready = (n.status as { conditions: { type: string; reason: string }[] }).conditions.find(
    (c) => c.type === "Ready",
  );
  t.equal(ready?.reason, "BashibleTest");
});

t.test("a node creates Events about itself that kubectl shows", async (t) => {
  const id = await cp.mintNode("worker-1");
  const node = new KubeClient(await loadKubeconfig(id.kubeconfig));
  t.teardown(() => node.close());
  await api.createEvent(node, {
    involved: { kind: "Node", name: "worker-1", apiVersion: "v1" },
    reason: "BashibleNodeUpdate",
    message: "converge started",
    host: "worker-1",
  });
  const out = await cp.kubectl([
    "get",
    "events",
    "-n",
    "default",
    "--field-selector",
    "involvedObject.name=worker-1",
    "-o",
    "json",
  ]);
  const reasons = (JSON.parse(out).items as { reason: string }[]).map((e) => e.reason);
  t.ok(reasons.includes("BashibleNodeUpdate"), `events: ${reasons.join(",")}`);
});

t.test("list then watch from its resourceVersion sees changes, with bookmarks", async (t) => {
  const ns = "watch-test";
  await admin.request("POST", "/api/v1/namespaces", {
    body: { apiVersion: "v1", kind: "Namespace", metadata: { name: ns } },
  });
  const path = `/api/v1/namespaces/${ns}/configmaps`;
  await admin.request("POST", path, { body: { metadata: { name: "before" }, data: { a: "1" } } });
  const listed = await api.list(admin, path);
  t.equal(listed.items.length, 1);
  const seen: string[] = [];
  const ac = new AbortController();
  const events = api.watch(admin, path, { resourceVersion: listed.metadata.resourceVersion, signal: ac.signal });
  setTimeout(async () => {
    await admin.request("POST", path, { body: { metadata: { name: "after" }, data: { a: "1" } } });
    await api.patchNode(admin, "worker-2", {}); // unrelated: must not show up
    await admin.request("PATCH", `${path}/after`, { body: { data: { a: "2" } } });
    await admin.request("DELETE", `${path}/after`);
  }, 200);
  for await (const ev of events) {
    if (ev.type === "BOOKMARK") continue;
    seen.push(`${ev.type}:${ev.object.metadata.name}`);
    if (ev.type === "DELETED") ac.abort();
  }
  t.same(seen, ["ADDED:after", "MODIFIED:after", "DELETED:after"], "only changes after the listed version");

  // From resourceVersion "0" the server sends the current state, then a BOOKMARK before it
  // ends the stream at timeoutSeconds.
  const types: string[] = [];
  for await (const ev of api.watch(admin, path, { timeoutSeconds: 2, resourceVersion: "0" })) {
    types.push(ev.type);
  }
  t.equal(types[0], "ADDED", `initial events: ${types.join(",")}`);
  t.ok(types.includes("BOOKMARK"), "a bookmark arrived");
});

t.test("pods: eviction honours a PodDisruptionBudget, delete with grace 0 removes", async (t) => {
  const ns = "evict-test";
  await admin.request("POST", "/api/v1/namespaces", {
    body: { apiVersion: "v1", kind: "Namespace", metadata: { name: ns } },
  });
  // No controller-manager here to create the namespace's default ServiceAccount.
  await admin.request("POST", `/api/v1/namespaces/${ns}/serviceaccounts`, { body: { metadata: { name: "default" } } });
  const pod = (name: string) => ({
    apiVersion: "v1",
    kind: "Pod",
    metadata: { name, labels: { app: "guarded" } },
    spec: { nodeName: "worker-1", containers: [{ name: "c", image: "busybox" }] },
  });
  await admin.request("POST", `/api/v1/namespaces/${ns}/pods`, { body: pod("p1") });
  await admin.request("POST", `/api/v1/namespaces/${ns}/pods`, { body: pod("p2") });
  await admin.request("POST", `/apis/policy/v1/namespaces/${ns}/poddisruptionbudgets`, {
    body: {
      apiVersion: "policy/v1",
      kind: "PodDisruptionBudget",
      metadata: { name: "pdb" },
      spec: { minAvailable: 2, selector: { matchLabels: { app: "guarded" } } },
    },
  });
  // Running pods count for the budget (Pending ones may always be evicted).
  await admin.request("PATCH", `/api/v1/namespaces/${ns}/pods/p1/status`, {
    body: { status: { phase: "Running", conditions: [{ type: "Ready", status: "True" }] } },
  });
  const blocked = await api.evictPod(admin, ns, "p1").catch((e) => e);
  t.type(blocked, KubeStatusError);
  t.equal(blocked.status, 429, "the budget blocks the eviction");

  await api.evictPod(admin, ns, "p2", 0); // Pending: allowed
  const gone = await admin.request("GET", `/api/v1/namespaces/${ns}/pods/p2`).catch((e) => e);
  t.ok(gone instanceof KubeStatusError && gone.status === 404, "the evicted pod is gone");

  const id = await cp.mintNode("worker-1");
  const node = new KubeClient(await loadKubeconfig(id.kubeconfig));
  t.teardown(() => node.close());
  await api.deletePod(node, ns, "p1", 0);
  const after = await admin.request("GET", `/api/v1/namespaces/${ns}/pods/p1`).catch((e) => e);
  t.ok(after instanceof KubeStatusError && after.status === 404, "a node deletes a pod bound to it with grace 0");
});

t.test("leases: update is compare-and-swap, a stale write gets a Conflict", async (t) => {
  await api.createLease(admin, {
    apiVersion: "coordination.k8s.io/v1",
    kind: "Lease",
    metadata: { name: "bashible-test", namespace: "default" },
    spec: { holderIdentity: "a", leaseDurationSeconds: 15 },
  });
  const first = await api.getLease(admin, "default", "bashible-test");
  const renewed = await api.updateLease(admin, { ...first, spec: { ...(first.spec as object), holderIdentity: "b" } });
  t.equal((renewed.spec as { holderIdentity: string }).holderIdentity, "b");
  const stale = await api.updateLease(admin, { ...first, spec: { holderIdentity: "c" } }).catch((e) => e);
  t.ok(isConflict(stale), "stale resourceVersion → 409");
});

t.test("secrets: get and update with conflict detection", async (t) => {
  await api.createSecret(admin, {
    apiVersion: "v1",
    kind: "Secret",
    metadata: { name: "configuration-checksums", namespace: "default" },
    data: { worker: Buffer.from("aaa").toString("base64") },
  });
  const s = await api.getSecret(admin, "default", "configuration-checksums");
  const updated = await api.updateSecret(admin, { ...s, data: { worker: Buffer.from("bbb").toString("base64") } });
  t.equal(Buffer.from((updated.data as Record<string, string>).worker ?? "", "base64").toString(), "bbb");
  t.ok(isConflict(await api.updateSecret(admin, { ...s, data: {} }).catch((e) => e)));
  const id = await cp.mintNode("worker-1");
  const node = new KubeClient(await loadKubeconfig(id.kubeconfig));
  t.teardown(() => node.close());
  t.ok(
    isForbidden(await api.getSecret(node, "default", "configuration-checksums").catch((e) => e)),
    "nodes cannot read arbitrary secrets",
  );
});

t.test("bootstrap tokens authenticate as system:bootstrappers", async (t) => {
  const token = await cp.mintBootstrapToken({ extraGroups: ["system:bootstrappers:d8-node-manager:worker"] });
  const dir = await mkdtemp(path.join(os.tmpdir(), "bb-"));
  await writeFile(path.join(dir, "bootstrap-token"), `${token}\n`);
  await writeFile(path.join(dir, "ca.crt"), await readFile(cp.ca.cert));
  const c = new KubeClient(await bootstrapConnection(cp.server, "/bootstrap-token", "/ca.crt", dir));
  t.teardown(() => c.close());
  const review = await c.request<{ status: { userInfo: { username: string; groups: string[] } } }>(
    "POST",
    "/apis/authentication.k8s.io/v1/selfsubjectreviews",
    { body: { apiVersion: "authentication.k8s.io/v1", kind: "SelfSubjectReview" } },
  );
  t.match(review.status.userInfo.username, /^system:bootstrap:/);
  t.ok(review.status.userInfo.groups.includes("system:bootstrappers:d8-node-manager:worker"));
  t.notMatch(JSON.stringify(c.connection.source), token, "the token is not part of the description");
});

t.test("error classes", async (t) => {
  t.test("a wrong bearer token is 401", async (t) => {
    const c = new KubeClient({
      ...(await loadKubeconfig(cp.adminKubeconfig)),
      cert: undefined,
      key: undefined,
      token: "abcdef.0123456789abcdef",
    });
    t.teardown(() => c.close());
    const err = await api.getNode(c, "worker-1").catch((e) => e);
    t.type(err, KubeStatusError);
    t.equal(err.status, 401);
    t.ok(err.isClientError);
  });

  t.test("an unavailable aggregated API is a 5xx", async (t) => {
    await admin.request("POST", "/apis/apiregistration.k8s.io/v1/apiservices", {
      body: {
        apiVersion: "apiregistration.k8s.io/v1",
        kind: "APIService",
        metadata: { name: "v1alpha1.down.example.com" },
        spec: {
          group: "down.example.com",
          version: "v1alpha1",
          groupPriorityMinimum: 100,
          versionPriority: 10,
          insecureSkipTLSVerify: true,
          service: { namespace: "default", name: "nothing-here", port: 443 },
        },
      },
    });
    // The aggregator picks the APIService up asynchronously: until then the path is a 404.
    let err: KubeStatusError | undefined;
    for (let i = 0; i < 100; i++) {
      err = await admin.request("GET", "/apis/down.example.com/v1alpha1/things").catch((e) => e);
      if (!(err instanceof KubeStatusError) || err.status !== 404) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    t.type(err, KubeStatusError);
    t.ok(err?.isServerError, `status ${err?.status}`);
  });

  t.test("a closed port is refused", async (t) => {
    const port = await freePort();
    const c = new KubeClient({ ...(await loadKubeconfig(cp.adminKubeconfig)), server: `https://127.0.0.1:${port}` });
    t.teardown(() => c.close());
    t.type(await api.getNode(c, "x").catch((e) => e), KubeRefusedError);
  });

  t.test("a server that never answers times out within the deadline", async (t) => {
    const sockets: import("node:net").Socket[] = [];
    const silent: Server = createTcpServer((s) => sockets.push(s));
    await new Promise<void>((r) => silent.listen(0, "127.0.0.1", r));
    t.teardown(() => {
      for (const s of sockets) s.destroy();
      silent.close();
    });
    const port = (silent.address() as { port: number }).port;
    const c = new KubeClient(
      { ...(await loadKubeconfig(cp.adminKubeconfig)), server: `https://127.0.0.1:${port}` },
      { timeoutMs: 300 },
    );
    t.teardown(() => c.close());
    const err = await api.getNode(c, "x").catch((e) => e);
    t.type(err, KubeTimeoutError, "a silent server ends in a timeout error, not a hang");
    t.match(err.message, /no answer within 300 ms/);
  });

  t.test("a server certificate from another CA is a TLS error", async (t) => {
    const dir = await mkdtemp(path.join(os.tmpdir(), "bb-ca-"));
    t.teardown(() => rm(dir, { recursive: true, force: true }));
    const other = await createCA(dir, "other");
    const c = new KubeClient({ ...(await loadKubeconfig(cp.adminKubeconfig)), ca: await readFile(other.cert) });
    t.teardown(() => c.close());
    const err = await api.getNode(c, "worker-1").catch((e) => e);
    t.type(err, KubeTLSError);
  });
});

t.test("kubeconfig: the kubelet.conf shape (one PEM for cert and key) loads; insecure ones are refused", async (t) => {
  const id = await cp.mintNode("worker-1");
  const root = await mkdtemp(path.join(os.tmpdir(), "bb-root-"));
  t.teardown(() => rm(root, { recursive: true, force: true }));
  const pem = `${await readFile(id.cert, "utf8")}${await readFile(id.key, "utf8")}`;
  const { mkdir } = await import("node:fs/promises");
  await mkdir(path.join(root, "var/lib/kubelet/pki"), { recursive: true });
  await mkdir(path.join(root, "etc/kubernetes/pki"), { recursive: true });
  await writeFile(path.join(root, "var/lib/kubelet/pki/kubelet-client-current.pem"), pem);
  await writeFile(path.join(root, "etc/kubernetes/pki/ca.crt"), await readFile(cp.ca.cert));
  await writeFile(
    path.join(root, "etc/kubernetes/kubelet.conf"),
    `apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority: /etc/kubernetes/pki/ca.crt
    server: ${cp.server}
  name: d8
contexts:
- context:
    cluster: d8
    user: kubelet
  name: kubelet@d8
current-context: kubelet@d8
users:
- name: kubelet
  user:
    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem
    client-key: /var/lib/kubelet/pki/kubelet-client-current.pem
`,
  );
  const c = new KubeClient(await loadKubeconfig("/etc/kubernetes/kubelet.conf", { root }));
  t.teardown(() => c.close());
  t.equal((await api.getNode(c, "worker-1")).metadata.name, "worker-1");

  await writeFile(
    path.join(root, "insecure.conf"),
    (await readFile(path.join(root, "etc/kubernetes/kubelet.conf"), "utf8")).replace(
      "certificate-authority: /etc/kubernetes/pki/ca.crt",
      "insecure-skip-tls-verify: true",
    ),
  );
  const err = await loadKubeconfig("/insecure.conf", { root }).catch((e) => e);
  t.type(err, KubeconfigError);
  t.match(err.message, /insecure-skip-tls-verify/);
});
