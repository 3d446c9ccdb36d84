// The kubelet serving CSR decision alone (cluster/controllers/kubelet-serving.ts), for what the
// API server does not let a test create: a node asking with another node's common name (the
// NodeRestriction admission refuses it first), and the address comparisons.
import t from "tap";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { canonicalAddress, judge, type Csr, type Known } from "../../cluster/controllers/kubelet-serving.ts";

const tmp = mkdtempSync(path.join(os.tmpdir(), "bashible-csr-unit-"));
t.teardown(() => rmSync(tmp, { recursive: true, force: true }));

let n = 0;
function csr(cn: string, san: string, user = "system:node:n1"): Csr {
  const out = path.join(tmp, `${++n}.csr`);
  execFileSync("openssl", [
    "req",
    "-new",
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
    "-keyout",
    path.join(tmp, `${n}.key`),
    "-out",
    out,
    "-subj",
    `/O=system:nodes/CN=${cn}`,
    "-addext",
    `subjectAltName=${san}`,
  ]);
  return {
    metadata: { name: `c${n}` },
    spec: {
      request: readFileSync(out).toString("base64"),
      signerName: "kubernetes.io/kubelet-serving",
      username: user,
      groups: ["system:nodes", "system:authenticated"],
      usages: ["server auth", "digital signature"],
    },
  };
}

const node = (name: string, ...addresses: string[]) => ({
  metadata: { name },
  status: { addresses: addresses.map((address) => ({ type: "InternalIP", address })) },
});
/**
 * What the approver knows: the managed Nodes' addresses; the API server at 10.96.0.1 and
 * 192.168.0.10, the context's endpoints 10.0.0.10 and api.example.com; Services `kubernetes`
 * (default) and `vault` (vault); no Service named n1 or n2.
 */
const owners = (...nodes: ReturnType<typeof node>[]): Known => {
  const m = new Map<string, Set<string>>();
  for (const nd of nodes)
    for (const a of nd.status.addresses) {
      const k = canonicalAddress(a.address) ?? a.address;
      m.set(k, new Set([...(m.get(k) ?? []), nd.metadata.name]));
    }
  return {
    addressOwners: m,
    endpoints: { ips: new Set(["10.96.0.1", "192.168.0.10", "10.0.0.10"]), names: new Set(["api.example.com"]) },
    services: new Map([
      ["n1", null],
      ["n2", null],
      ["api", null],
      ["kubernetes", "default/kubernetes"],
      ["vault", "vault/vault"],
    ]),
  };
};

t.test("the common name must be the requesting node", async (t) => {
  const v = judge(csr("system:node:n2", "DNS:n2"), node("n1", "n1"), owners(node("n1", "n1")));
  t.match(v, { verdict: "deny", reason: /common name "system:node:n2" is not the requester system:node:n1/ });
});

t.test("addresses compare in one spelling: IPv6 forms and DNS case", async (t) => {
  const n1 = node("n1", "fd00:0:0:0::1", "N1.example.com");
  t.match(judge(csr("system:node:n1", "IP:fd00::1,DNS:n1.EXAMPLE.com"), n1, owners(n1)), {
    verdict: "approve",
    node: "n1",
  });
  t.equal(canonicalAddress("FD00:0000::0001"), "fd00::1");
});

t.test("an IPv4-mapped IPv6 address is the IPv4 address it maps", async (t) => {
  t.equal(canonicalAddress("::ffff:10.0.0.5"), "10.0.0.5");
  const n1 = node("n1", "10.0.0.1");
  const n2 = node("n2", "10.0.0.5");
  t.match(judge(csr("system:node:n1", "IP:::ffff:10.0.0.1"), n1, owners(n1)), { verdict: "approve" });
  t.match(judge(csr("system:node:n1", "IP:::ffff:10.0.0.5"), n1, owners(n1, n2)), {
    verdict: "wait",
    reason: /10\.0\.0\.5 is also an address of Node n2/,
  });
});

t.test("an IPv6 zone never crashes the approver: refused in a CSR, ignored in a status", async (t) => {
  t.equal(canonicalAddress("fe80::1%eth0"), undefined);
  const n1 = node("n1", "fe80::1%eth0", "10.0.0.1");
  t.doesNotThrow(() => owners(n1));
  t.match(judge(csr("system:node:n1", "DNS:fe80::1%x"), n1, owners(n1)), { verdict: "deny", reason: /not a DNS name/ });
  t.match(judge(csr("system:node:n1", "IP:fe80::1"), n1, owners(n1)), { verdict: "deny", reason: /link-local/ });
});

t.test("names: the node's own only, no wildcard, no Service name", async (t) => {
  const n1 = node("n1", "10.0.0.1");
  const k = owners(n1);
  t.match(judge(csr("system:node:n1", "DNS:n1,DNS:n1.example.com,IP:10.0.0.1"), n1, k), { verdict: "approve" });
  t.match(judge(csr("system:node:n1", "DNS:*.example.com"), n1, k), { verdict: "deny", reason: /no wildcards/ });
  t.match(judge(csr("system:node:n1", "DNS:vault.vault"), n1, k), {
    verdict: "deny",
    reason: /not the node's name n1/,
  });
  t.match(judge(csr("system:node:n1", "DNS:n1.svc"), n1, k), { verdict: "deny", reason: /Service or Pod name/ });
  t.match(judge(csr("system:node:n1", "DNS:n1."), n1, k), { verdict: "deny", reason: /not a DNS name/ });
});

t.test("the API server's addresses are refused; unknown, everything waits", async (t) => {
  const n1 = node("n1", "10.0.0.1", "10.96.0.1");
  t.match(judge(csr("system:node:n1", "IP:10.96.0.1"), n1, owners(n1)), {
    verdict: "deny",
    reason: /10\.96\.0\.1 is an address of the API server/,
  });
  t.match(judge(csr("system:node:n1", "IP:10.0.0.1"), n1, { ...owners(n1), endpoints: undefined }), {
    verdict: "wait",
    reason: /API server's addresses are not known/,
  });
  t.match(judge(csr("system:node:n1", "IP:127.0.0.1"), n1, owners(n1)), { verdict: "deny", reason: /loopback/ });
});

t.test("a node outside every node group waits, and so does an address another Node reports", async (t) => {
  const other = node("n2", "10.0.0.2");
  t.match(judge(csr("system:node:n1", "IP:10.0.0.9"), undefined, owners(other)), {
    verdict: "wait",
    reason: /Node n1 is not a registered node of a node group/,
  });
  t.match(judge(csr("system:node:n1", "IP:10.0.0.2"), undefined, owners(other)), {
    verdict: "wait",
    reason: /10\.0\.0\.2 is also an address of Node n2/,
  });
});

t.test("a request whose bytes are not a CSR is denied with the parser's reason", async (t) => {
  const c = csr("system:node:n1", "DNS:n1");
  c.spec.request = Buffer.from("not a certificate request").toString("base64");
  t.match(judge(c, node("n1", "n1"), owners()), { verdict: "deny", reason: /not a valid PKCS#10 CSR: malformed CSR/ });
});

t.test("a node named like a Service gets no name a pod would take for that Service", async (t) => {
  const k8s = node("kubernetes", "10.0.0.7");
  const k = owners(k8s);
  t.match(judge(csr("system:node:kubernetes", "DNS:kubernetes", "system:node:kubernetes"), k8s, k), {
    verdict: "deny",
    reason: /kubernetes is the name of Service default\/kubernetes/,
  });
  t.match(judge(csr("system:node:kubernetes", "DNS:kubernetes.default", "system:node:kubernetes"), k8s, k), {
    verdict: "deny",
    reason: /the form <service>\.<namespace>/,
  });
  const vault = node("vault", "10.0.0.8");
  t.match(judge(csr("system:node:vault", "DNS:vault.vault", "system:node:vault"), vault, owners(vault)), {
    verdict: "deny",
    reason: /the form <service>\.<namespace>/,
  });
  for (const name of ["n1.default.svc", "n1.default.svc.cluster.local", "n1.ns.pod.cluster.local"]) {
    const n1 = node("n1", "10.0.0.1");
    t.match(
      judge(csr("system:node:n1", `DNS:${name}`), n1, owners(n1)),
      { verdict: "deny", reason: /svc or pod/ },
      name,
    );
  }
  const n1 = node("n1", "10.0.0.1");
  t.match(judge(csr("system:node:n1", "DNS:n1,DNS:n1.dc1.example.com"), n1, owners(n1)), { verdict: "approve" });
  t.match(judge(csr("system:node:n1", "DNS:n1"), n1, { ...owners(n1), services: new Map() }), {
    verdict: "wait",
    reason: /cannot tell yet whether n1 is a Service's name/,
  });
});

t.test("the context's endpoints are refused, by address and by name", async (t) => {
  const n1 = node("n1", "10.0.0.1", "10.0.0.10");
  t.match(judge(csr("system:node:n1", "DNS:n1,IP:10.0.0.10"), n1, owners(n1)), {
    verdict: "deny",
    reason: /10\.0\.0\.10 is an address of the API server or another endpoint/,
  });
  const api = node("api", "10.0.0.3");
  t.match(judge(csr("system:node:api", "DNS:api.example.com", "system:node:api"), api, owners(api)), {
    verdict: "deny",
    reason: /api\.example\.com is an endpoint of the cluster/,
  });
});
