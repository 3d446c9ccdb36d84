// Bootstrap tokens are scoped to one node group end to end, tried as an attacker with a token of
// another group would, against a real kube-apiserver and kube-controller-manager (csrapproving
// and csrsigning, as kubeadm runs them) with the deploy manifests' RBAC and admission policy and
// the bundle server's controllers. Requests are made as a kubelet's TLS bootstrap makes them: a
// CSR for system:node:<name> created with the token, then the Node registered with the
// certificate issued.
import t from "tap";
import { execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { withControlPlane } from "../../scripts/lib/control-plane-fixture.ts";
import { registerBundleServer } from "../../scripts/lib/bundle-server.ts";
import { KubeClient } from "../../lib/kube/client.ts";
import { loadKubeconfig } from "../../lib/kube/kubeconfig.ts";
import { KubeStatusError } from "../../lib/kube/errors.ts";
import { createSecret } from "../../lib/kube/api.ts";
import { BOOTSTRAP_GROUP } from "../../cluster/bootstrap-scope.ts";
import type { Csr } from "../../cluster/controllers/csr-approval.ts";
import { BOOTSTRAP_TOKEN_GROUP_LABEL, CONFIGMAPS, NAMESPACE, NODE_KEYS } from "../../bundles/names.ts";
import { until } from "../../scripts/lib/until.ts";

const REPO = path.resolve(import.meta.dirname, "../..");
const CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
const API = "/apis/bashible.deckhouse.io/v1alpha1";

const cp = await withControlPlane(t, { controllerManager: { controllers: ["csrapproving", "csrsigning"] } });
const admin = cp.admin;
const { app } = await registerBundleServer(cp, { controllers: {} });
t.teardown(() => app.stop());
await cp.kubectl(["apply", "-f", path.join(REPO, "cluster/deploy/kubelet-bootstrap-rbac.yaml")]);
await cp.kubectl(["apply", "-f", "-"], {
  input: JSON.stringify({
    apiVersion: "deckhouse.io/v1",
    kind: "NodeGroup",
    metadata: { name: "frontend" },
    spec: { nodeType: "CloudEphemeral" },
  }),
});
await until("frontend rendered", async () => app.store.get("nodegroupbundles", "frontend"));

const work = path.join(cp.dir, "bootstrap-scope");
mkdirSync(work, { recursive: true });
const clients: KubeClient[] = [];
t.teardown(() => {
  for (const c of clients) c.close();
});
const clientOf = async (file: string) => {
  const c = new KubeClient(await loadKubeconfig(file));
  clients.push(c);
  return c;
};
let n = 0;

/** A bootstrap token of this node group (ours: the group in its extra groups), or of none. */
async function token(group?: string): Promise<KubeClient> {
  const tok = await cp.mintBootstrapToken({
    extraGroups: group ? [BOOTSTRAP_GROUP, `${BOOTSTRAP_GROUP}:${group}`] : [],
  });
  return clientOf(await cp.writeKubeconfig(path.join(work, `token-${++n}.kubeconfig`), { token: tok }));
}

/** A machine's key, as the kubelet keeps it. */
function key(): string {
  const file = path.join(work, `key-${++n}.pem`);
  execFileSync("openssl", ["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", file]);
  return file;
}

/** The kubelet's bootstrap CSR for `node` with `keyFile`, created with `by`. */
async function ask(by: KubeClient, name: string, node: string, keyFile: string): Promise<void> {
  const out = path.join(work, `${name}.csr`);
  execFileSync("openssl", [
    "req",
    "-new",
    "-key",
    keyFile,
    "-out",
    out,
    "-subj",
    `/O=system:nodes/CN=system:node:${node}`,
  ]);
  await by.request("POST", CSRS, {
    body: {
      apiVersion: "certificates.k8s.io/v1",
      kind: "CertificateSigningRequest",
      metadata: { name },
      spec: {
        request: readFileSync(out).toString("base64"),
        signerName: "kubernetes.io/kube-apiserver-client-kubelet",
        usages: ["digital signature", "client auth"],
      },
    },
  });
}

const condition = async (name: string) =>
  (await admin.request<Csr>("GET", `${CSRS}/${name}`)).status?.conditions?.find(
    (c) => c.type === "Approved" || c.type === "Denied",
  );
const decided = (name: string) => until(`CSR ${name} decided`, () => condition(name));

/** The node's client, once its certificate is issued. */
async function asNode(csr: string, keyFile: string): Promise<KubeClient> {
  const pem = await until(
    `CSR ${csr} issued`,
    async () => (await admin.request<Csr>("GET", `${CSRS}/${csr}`)).status?.certificate,
  );
  const cert = path.join(work, `${csr}.crt`);
  writeFileSync(cert, Buffer.from(pem, "base64"));
  return clientOf(await cp.writeKubeconfig(path.join(work, `${csr}.kubeconfig`), { cert, key: keyFile }));
}

const register = (node: KubeClient, name: string, group?: string) =>
  node
    .request("POST", "/api/v1/nodes", {
      body: { apiVersion: "v1", kind: "Node", metadata: { name, labels: group ? { [NODE_KEYS.group]: group } : {} } },
    })
    .then(
      () => "registered",
      (e: unknown) => (e instanceof KubeStatusError ? `${e.status} ${e.message}` : Promise.reject(e)),
    );
const reads = (c: KubeClient, group: string) =>
  c.request("GET", `${API}/nodegroupbundles/${group}`).then(
    () => 200,
    (e: unknown) => (e instanceof KubeStatusError ? e.status : Promise.reject(e)),
  );
const records = async () =>
  (
    await admin.request<{ data?: Record<string, string> }>(
      "GET",
      `/api/v1/namespaces/${NAMESPACE}/configmaps/${CONFIGMAPS.nodeGroups}`,
    )
  ).data ?? {};

// The admission policy takes effect a moment after it is applied: wait until it refuses.
{
  const probe = await clientOf((await cp.mintNode("policy-probe")).kubeconfig);
  await until("the node-group policy refuses an unrecorded registration", async () =>
    /403 .*none recorded/.test(await register(probe, "policy-probe", "worker")),
  );
  await admin.request("DELETE", "/api/v1/nodes/policy-probe").catch(() => undefined);
}

const workerKey = key();

t.test("a worker token joins worker-1: approved, recorded, registered in worker, reads worker only", async (t) => {
  await ask(await token("worker"), "worker-1-boot", "worker-1", workerKey);
  t.match(await decided("worker-1-boot"), {
    type: "Approved",
    message: /a new node name, for a bootstrap token of node group worker/,
  });
  t.equal((await records())["worker-1"], "worker", "the group is recorded for the name");
  const node = await asNode("worker-1-boot", workerKey);
  await until(
    "worker-1 registers in worker",
    async () => (await register(node, "worker-1", "worker")) === "registered",
  );
  t.equal(await reads(node, "worker"), 200);
  t.equal(await reads(node, "frontend"), 403);
});

t.test("a frontend token cannot take worker-1's name, and so never reads worker's bundle", async (t) => {
  const thief = key();
  await ask(await token("frontend"), "steal-worker-1", "worker-1", thief);
  const c = await decided("steal-worker-1");
  t.match(c, { type: "Denied", message: /Node worker-1 exists \(node group worker\).*delete the Node first/ });
  const csr = await admin.request<Csr>("GET", `${CSRS}/steal-worker-1`);
  t.notOk(csr.status?.certificate, "no certificate issued");
  t.notOk(
    csr.status?.conditions?.some((x) => x.type === "Approved"),
    "kube-controller-manager did not approve it either",
  );
});

t.test("a frontend token gets a new name, but cannot register that Node in worker", async (t) => {
  const k = key();
  await ask(await token("frontend"), "front-new-boot", "front-new", k);
  t.match(await decided("front-new-boot"), { type: "Approved", message: /bootstrap token of node group frontend/ });
  const node = await asNode("front-new-boot", k);
  const refused = await until("registering in worker is refused, naming the recorded group", async () => {
    const r = await register(node, "front-new", "worker");
    return /403 .*may register only in the node group its bootstrap token was for \(frontend\), not in worker/.test(r)
      ? r
      : undefined;
  });
  t.ok(refused);
  await until("it registers in frontend", async () => (await register(node, "front-new", "frontend")) === "registered");
  t.equal(await reads(node, "worker"), 403, "worker's bundle stays out of its reach");
  t.equal(await reads(node, "frontend"), 200);
  const after = await admin.request<{ metadata: { labels: Record<string, string> } }>("GET", "/api/v1/nodes/front-new");
  t.equal(after.metadata.labels[NODE_KEYS.group], "frontend");
});

t.test("the same machine re-bootstrapping with its key is let back in; another key, or group, is not", async (t) => {
  // worker-1's certificate was issued with workerKey: the approver recorded its public key.
  await ask(await token("worker"), "worker-1-again", "worker-1", workerKey);
  t.match(await decided("worker-1-again"), {
    type: "Approved",
    message: /Node worker-1 re-bootstrapping: the request carries the key of its newest client certificate/,
  });
  await ask(await token("worker"), "worker-1-newkey", "worker-1", key());
  t.match(await decided("worker-1-newkey"), { type: "Denied", message: /does not prove it is that machine/ });
  await ask(await token("frontend"), "worker-1-frontend-key", "worker-1", workerKey);
  t.match(await decided("worker-1-frontend-key"), {
    type: "Denied",
    message:
      /the key is Node worker-1's, but the bootstrap token is for node group frontend and the Node is in node group worker/,
  });
});

t.test("a name another group's bootstrap was just given is not given to a second group", async (t) => {
  await ask(await token("frontend"), "pending-1-front", "pending-1", key());
  t.match(await decided("pending-1-front"), { type: "Approved" });
  await ask(await token("worker"), "pending-1-worker", "pending-1", key());
  t.match(await decided("pending-1-worker"), {
    type: "Denied",
    message: /the name pending-1 was given to a bootstrap of node group frontend and no Node has it yet/,
  });
});

t.test("tokens of no group, of two groups, or Deckhouse's labelled ones", async (t) => {
  const k = key();
  await ask(await token(), "plain-boot", "plain-1", k);
  t.match(await decided("plain-boot"), { type: "Approved", message: /bootstrap token of no node group/ });
  const plain = await asNode("plain-boot", k);
  await until("no group recorded", async () =>
    /403 .*\(a token of no group\), not in worker/.test(await register(plain, "plain-1", "worker")),
  );
  t.equal(await register(plain, "plain-1"), "registered", "it may register without a group label");
  t.equal(await reads(plain, "worker"), 403);

  const two = await cp.mintBootstrapToken({
    extraGroups: [BOOTSTRAP_GROUP, `${BOOTSTRAP_GROUP}:worker`, `${BOOTSTRAP_GROUP}:frontend`],
  });
  const twoClient = await clientOf(await cp.writeKubeconfig(path.join(work, "two.kubeconfig"), { token: two }));
  await ask(twoClient, "two-groups", "two-1", key());
  t.match(await decided("two-groups"), {
    type: "Denied",
    message: /scoped to several node groups \(frontend, worker\)/,
  });

  // Deckhouse's hook: only its extra group, the node group in the Secret's label.
  await createSecret(admin, {
    apiVersion: "v1",
    kind: "Secret",
    type: "bootstrap.kubernetes.io/token",
    metadata: {
      name: "bootstrap-token-dkhs02",
      namespace: "kube-system",
      labels: { [BOOTSTRAP_TOKEN_GROUP_LABEL]: "worker" },
    },
    stringData: {
      "token-id": "dkhs02",
      "token-secret": "0123456789abcdef",
      expiration: new Date(Date.now() + 3600_000).toISOString().replace(/\.\d+Z$/, "Z"),
      "usage-bootstrap-authentication": "true",
      "auth-extra-groups": BOOTSTRAP_GROUP,
    },
  });
  const deckhouse = await clientOf(
    await cp.writeKubeconfig(path.join(work, "deckhouse.kubeconfig"), { token: "dkhs02.0123456789abcdef" }),
  );
  await ask(deckhouse, "deckhouse-boot", "worker-2", key());
  t.match(await decided("deckhouse-boot"), { type: "Approved", message: /bootstrap token of node group worker/ });
  t.equal((await records())["worker-2"], "worker", "its group comes from the token Secret's label");
});
