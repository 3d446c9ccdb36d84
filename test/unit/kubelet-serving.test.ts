// The kubelet serving CSR decision alone (cluster/controllers/kubelet-serving.ts), for what the
// API server does not let a test create: a node asking with another node's common name (the
// NodeRestriction admission refuses it first), and the address comparisons.
import t from "tap";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { canonicalAddress, judge, type Csr } from "../../cluster/controllers/kubelet-serving.ts";

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
const owners = (...nodes: ReturnType<typeof node>[]) => {
  const m = new Map<string, Set<string>>();
  for (const nd of nodes)
    for (const a of nd.status.addresses) {
      const k = canonicalAddress(a.address);
      m.set(k, new Set([...(m.get(k) ?? []), nd.metadata.name]));
    }
  return m;
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

t.test("an IPv4-mapped IPv6 address is not the IPv4 address the Node reports", async (t) => {
  const n1 = node("n1", "10.0.0.1");
  t.match(judge(csr("system:node:n1", "IP:::ffff:10.0.0.1"), n1, owners(n1)), { verdict: "wait" });
});

t.test("a node outside every node group waits; its address held by a managed Node is denied", async (t) => {
  const other = node("n2", "10.0.0.2");
  t.match(judge(csr("system:node:n1", "IP:10.0.0.9"), undefined, owners(other)), {
    verdict: "wait",
    reason: /Node n1 is not a registered node of a node group/,
  });
  t.match(judge(csr("system:node:n1", "IP:10.0.0.2"), undefined, owners(other)), {
    verdict: "deny",
    reason: /10\.0\.0\.2 is an address of Node n2/,
  });
});

t.test("a request whose bytes are not a CSR is denied with the parser's reason", async (t) => {
  const c = csr("system:node:n1", "DNS:n1");
  c.spec.request = Buffer.from("not a certificate request").toString("base64");
  t.match(judge(c, node("n1", "n1"), owners()), { verdict: "deny", reason: /not a valid PKCS#10 CSR: malformed CSR/ });
});
