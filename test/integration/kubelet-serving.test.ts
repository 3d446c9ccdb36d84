// The kubelet serving CSR approver against a real kube-apiserver and kube-controller-manager
// (its csrsigning controller issues what is approved). CSRs are created as the nodes themselves
// (client certificates system:node:<name>, the Node authorizer), as kubelets create them.
import t from "tap";
import { execFileSync } from "node:child_process";
import { X509Certificate } from "node:crypto";
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { pino } from "pino";
import { KubeletServingApprover, type Csr } from "../../cluster/controllers/kubelet-serving.ts";
import { KubeClient } from "../../lib/kube/client.ts";
import { loadKubeconfig } from "../../lib/kube/kubeconfig.ts";
import { createSecret, patchNodeStatus } from "../../lib/kube/api.ts";
import { NAMESPACE, NODE_KEYS, SECRETS } from "../../bundles/names.ts";
import { withControlPlane } from "../../scripts/lib/control-plane-fixture.ts";
import { until } from "../../scripts/lib/until.ts";

const CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
const tmp = mkdtempSync(path.join(os.tmpdir(), "bashible-csr-"));
t.teardown(() => rmSync(tmp, { recursive: true, force: true }));

const cp = await withControlPlane(t, { controllerManager: { controllers: ["csrsigning"] } });
const admin = cp.admin;

// What the approver logs, to wait for its "waits" decision instead of for time.
const lines: { msg?: string; csr?: string; reason?: string }[] = [];
const log = pino({ level: "info" }, { write: (s: string) => void lines.push(JSON.parse(s)) });
// The bundle context names an API server endpoint that no EndpointSlice lists (nodes dial it).
await admin.request("POST", "/api/v1/namespaces", {
  body: { apiVersion: "v1", kind: "Namespace", metadata: { name: NAMESPACE } },
});
await createSecret(admin, {
  apiVersion: "v1",
  kind: "Secret",
  metadata: { name: SECRETS.context, namespace: NAMESPACE },
  stringData: { [SECRETS.contextKey]: "apiserverEndpoints: ['10.0.0.10:6443', 'api.example.com:6443']\n" },
});
const approver = new KubeletServingApprover({ client: admin, log });
approver.start();
t.teardown(() => approver.stop());

/** A managed Node (group label) reporting these addresses. */
async function node(name: string, addresses: { type: string; address: string }[]): Promise<void> {
  await admin.request("POST", "/api/v1/nodes", {
    body: { apiVersion: "v1", kind: "Node", metadata: { name, labels: { [NODE_KEYS.group]: "worker" } } },
  });
  await patchNodeStatus(admin, name, { status: { addresses } });
}

let n = 0;
/** A PKCS#10 request made by openssl, base64 as the API wants it. */
function request(o: { cn: string; orgs?: string[]; san?: string; rsa?: boolean }): string {
  const dir = path.join(tmp, String(++n));
  mkdirSync(dir, { recursive: true });
  const subj = `${(o.orgs ?? ["system:nodes"]).map((g) => `/O=${g}`).join("")}/CN=${o.cn}`;
  const key = o.rsa ? ["-newkey", "rsa:2048"] : ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
  execFileSync("openssl", [
    "req",
    "-new",
    ...key,
    "-nodes",
    "-keyout",
    path.join(dir, "key.pem"),
    "-out",
    path.join(dir, "csr.pem"),
    "-subj",
    subj,
    ...(o.san ? ["-addext", `subjectAltName=${o.san}`] : []),
  ]);
  return readFileSync(path.join(dir, "csr.pem")).toString("base64");
}

const clients = new Map<string, KubeClient>();
async function asNode(name: string): Promise<KubeClient> {
  let c = clients.get(name);
  if (!c) {
    c = new KubeClient(await loadKubeconfig((await cp.mintNode(name)).kubeconfig));
    clients.set(name, c);
    t.teardown(() => c?.close());
  }
  return c;
}

async function submit(
  by: KubeClient,
  name: string,
  req: string,
  usages = ["digital signature", "server auth"],
): Promise<void> {
  await by.request("POST", CSRS, {
    body: {
      apiVersion: "certificates.k8s.io/v1",
      kind: "CertificateSigningRequest",
      metadata: { name },
      spec: { request: req, signerName: "kubernetes.io/kubelet-serving", usages },
    },
  });
}

const get = (name: string) => admin.request<Csr>("GET", `${CSRS}/${name}`);
const condition = async (name: string) => {
  const c = (await get(name)).status?.conditions?.find((x) => x.type === "Approved" || x.type === "Denied");
  return c as { type: string; message?: string } | undefined;
};
const decided = (name: string) => until(`CSR ${name} decided`, () => condition(name));

await node("n1", [
  { type: "InternalIP", address: "10.0.0.1" },
  { type: "InternalIP", address: "fd00:0:0::1" },
  { type: "Hostname", address: "n1" },
]);
await node("n2", [
  { type: "InternalIP", address: "10.0.0.2" },
  { type: "Hostname", address: "n2" },
]);
const n1 = await asNode("n1");

t.test("a kubelet's request for its own names and addresses is approved and signed", async (t) => {
  await submit(n1, "n1-good", request({ cn: "system:node:n1", san: "DNS:n1,IP:10.0.0.1,IP:fd00::1" }));
  t.match(await decided("n1-good"), { type: "Approved" });
  const issued = await until("the certificate issued", async () => (await get("n1-good")).status?.certificate);
  const cert = new X509Certificate(Buffer.from(issued, "base64"));
  t.match(cert.subjectAltName, /DNS:n1/);
  t.match(cert.subjectAltName, /IP Address:10\.0\.0\.1/);
  t.ok(cert.checkIssued(new X509Certificate(readFileSync(cp.ca.cert))), "signed by the cluster CA");
  const rsa = request({ cn: "system:node:n1", san: "DNS:n1,IP:10.0.0.1", rsa: true });
  await submit(n1, "n1-rsa", rsa, ["digital signature", "key encipherment", "server auth"]);
  t.match(await decided("n1-rsa"), { type: "Approved" }, "RSA keys add key encipherment");
});

t.test("another Node's address waits, saying whose; the API server's is denied", async (t) => {
  await submit(n1, "n1-steals", request({ cn: "system:node:n1", san: "DNS:n1,IP:10.0.0.2" }));
  await until("the approver says it waits", () =>
    lines.find((l) => l.csr === "n1-steals" && /10\.0\.0\.2 is also an address of Node n2/.test(l.reason ?? "")),
  );
  t.equal(await condition("n1-steals"), undefined, "still pending");
  // The kubernetes Service's cluster IP, which n1 claims in its own status.
  const svc = await admin.request<{ spec: { clusterIP: string } }>(
    "GET",
    "/api/v1/namespaces/default/services/kubernetes",
  );
  await patchNodeStatus(admin, "n1", {
    status: {
      addresses: [
        { type: "InternalIP", address: "10.0.0.1" },
        { type: "InternalIP", address: svc.spec.clusterIP },
        { type: "Hostname", address: "n1" },
      ],
    },
  });
  await submit(n1, "n1-api", request({ cn: "system:node:n1", san: `DNS:n1,IP:${svc.spec.clusterIP}` }));
  t.match(await decided("n1-api"), { type: "Denied", message: /is an address of the API server/ });
});

t.test("an address the Node does not report (yet) waits until it does", async (t) => {
  await submit(n1, "n1-new-ip", request({ cn: "system:node:n1", san: "DNS:n1,IP:10.0.0.11" }));
  await until("the approver says it waits", () =>
    lines.find(
      (l) => l.csr === "n1-new-ip" && /10\.0\.0\.11 not among the addresses Node n1 reports/.test(l.reason ?? ""),
    ),
  );
  t.equal(await condition("n1-new-ip"), undefined, "still pending");
  await patchNodeStatus(admin, "n1", {
    status: {
      addresses: [
        { type: "InternalIP", address: "10.0.0.1" },
        { type: "InternalIP", address: "10.0.0.11" },
        { type: "Hostname", address: "n1" },
      ],
    },
  });
  t.match(await decided("n1-new-ip"), { type: "Approved" }, "approved once the Node reports it");
});

// (A node asking with another node's common name is refused by the API server's NodeRestriction
// already; test/unit/kubelet-serving.test.ts covers the approver's own check.)
t.test("requests that are not a kubelet's serving certificate are denied with the reason", async (t) => {
  const cases: [string, KubeClient, string, RegExp, string[]?][] = [
    [
      "n1-orgs",
      n1,
      request({ cn: "system:node:n1", orgs: ["system:masters"], san: "DNS:n1" }),
      /organization must be exactly/,
    ],
    [
      "n1-service",
      n1,
      request({ cn: "system:node:n1", san: "DNS:n1,DNS:kubernetes.default.svc" }),
      /not the node's name n1/,
    ],
    ["n1-wildcard", n1, request({ cn: "system:node:n1", san: "DNS:*.n1" }), /no wildcards/],
    ["n1-email", n1, request({ cn: "system:node:n1", san: "DNS:n1,email:a@b.c" }), /e-mail, URI or other names/],
    ["n1-no-san", n1, request({ cn: "system:node:n1" }), /names no DNS name or IP address/],
    [
      "n1-client-usage",
      n1,
      request({ cn: "system:node:n1", san: "DNS:n1" }),
      /are not a kubelet serving certificate's/,
      ["digital signature", "client auth"],
    ],
    ["admin-asks", admin, request({ cn: "system:node:n1", san: "DNS:n1" }), /not by a node/],
  ];
  for (const [name, by, req, reason, usages] of cases) {
    await submit(by, name, req, usages);
    t.match(await decided(name), { type: "Denied", message: reason }, name);
  }
});

t.test("a Node named like a Service gets no name a pod would take for that Service", async (t) => {
  await node("kubernetes", [{ type: "InternalIP", address: "10.0.0.21" }]);
  const k8s = await asNode("kubernetes");
  await submit(k8s, "kubernetes-short", request({ cn: "system:node:kubernetes", san: "DNS:kubernetes,IP:10.0.0.21" }));
  t.match(await decided("kubernetes-short"), {
    type: "Denied",
    message: /kubernetes is the name of Service default\/kubernetes/,
  });
  await submit(k8s, "kubernetes-ns", request({ cn: "system:node:kubernetes", san: "DNS:kubernetes.default" }));
  t.match(await decided("kubernetes-ns"), { type: "Denied", message: /the form <service>\.<namespace>/ });

  await admin.request("POST", "/api/v1/namespaces", {
    body: { apiVersion: "v1", kind: "Namespace", metadata: { name: "vault" } },
  });
  await admin.request("POST", "/api/v1/namespaces/vault/services", {
    body: { apiVersion: "v1", kind: "Service", metadata: { name: "vault" }, spec: { ports: [{ port: 8200 }] } },
  });
  await node("vault", [{ type: "InternalIP", address: "10.0.0.22" }]);
  const vault = await asNode("vault");
  await submit(vault, "vault-ns", request({ cn: "system:node:vault", san: "DNS:vault.vault" }));
  t.match(await decided("vault-ns"), { type: "Denied", message: /the form <service>\.<namespace>/ });
  await submit(vault, "vault-short", request({ cn: "system:node:vault", san: "DNS:vault,IP:10.0.0.22" }));
  t.match(await decided("vault-short"), { type: "Denied", message: /vault is the name of Service vault\/vault/ });
});

t.test("an API endpoint the bundle context names is denied though no EndpointSlice lists it", async (t) => {
  await node("n3", [
    { type: "InternalIP", address: "10.0.0.3" },
    { type: "InternalIP", address: "10.0.0.10" },
  ]);
  const n3 = await asNode("n3");
  await submit(n3, "n3-endpoint", request({ cn: "system:node:n3", san: "DNS:n3,IP:10.0.0.10" }));
  t.match(await decided("n3-endpoint"), {
    type: "Denied",
    message: /10\.0\.0\.10 is an address of the API server or another endpoint of the cluster/,
  });
  await submit(n3, "n3-own", request({ cn: "system:node:n3", san: "DNS:n3,IP:10.0.0.3" }));
  t.match(await decided("n3-own"), { type: "Approved" }, "its own address and name are approved");
});
