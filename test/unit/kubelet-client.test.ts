// The kubelet client (bootstrap) CSR decision alone (cluster/controllers/kubelet-client.ts): the
// request's form, which the API server checks too for this signer, and the name rules.
import t from "tap";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { judgeBootstrap, readClientRequest } from "../../cluster/controllers/kubelet-client.ts";
import type { Csr } from "../../cluster/controllers/csr-approval.ts";

const tmp = mkdtempSync(path.join(os.tmpdir(), "bashible-client-csr-"));
t.teardown(() => rmSync(tmp, { recursive: true, force: true }));
let n = 0;
function csr(subj: string, o: { san?: string; usages?: string[] } = {}): Csr {
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
    subj,
    ...(o.san ? ["-addext", `subjectAltName=${o.san}`] : []),
  ]);
  return {
    metadata: { name: `c${n}` },
    spec: {
      request: readFileSync(out).toString("base64"),
      signerName: "kubernetes.io/kube-apiserver-client-kubelet",
      username: "system:bootstrap:abcdef",
      groups: ["system:bootstrappers"],
      usages: o.usages ?? ["digital signature", "client auth"],
    },
  };
}

t.test("the form of a kubelet client request", async (t) => {
  const ok = readClientRequest(csr("/O=system:nodes/CN=system:node:worker-1"));
  t.match(ok, { node: "worker-1", key: /^[A-Za-z0-9+/]{43}=$/ });
  t.match(readClientRequest(csr("/O=system:nodes/CN=worker-1")), { deny: /not system:node:<node name>/ });
  t.match(readClientRequest(csr("/O=system:nodes/CN=system:node:Bad_Name")), { deny: /not system:node:<node name>/ });
  t.match(readClientRequest(csr("/O=system:masters/CN=system:node:w")), { deny: /organization must be exactly/ });
  t.match(readClientRequest(csr("/O=system:nodes/CN=system:node:w", { san: "DNS:w" })), { deny: /names no DNS names/ });
  t.match(
    readClientRequest(csr("/O=system:nodes/CN=system:node:w", { usages: ["server auth", "digital signature"] })),
    {
      deny: /not a kubelet client certificate's/,
    },
  );
});

t.test("who may take a name", async (t) => {
  const req = { node: "worker-1", key: "K1" };
  t.match(judgeBootstrap(req, { tokenGroup: "worker" }), { verdict: "approve", group: "worker" }, "a new name");
  t.match(
    judgeBootstrap(req, { tokenGroup: "worker", recordedGroup: "worker" }),
    { verdict: "approve" },
    "its own group's",
  );
  t.match(judgeBootstrap(req, { tokenGroup: "frontend", recordedGroup: "worker" }), {
    verdict: "deny",
    reason: /given to a bootstrap of node group worker/,
  });
  t.match(judgeBootstrap(req, { tokenGroup: "worker", existing: { group: "worker" } }), {
    verdict: "deny",
    reason: /Node worker-1 exists .* does not prove it is that machine/,
  });
  t.match(judgeBootstrap(req, { tokenGroup: "worker", existing: { group: "worker" }, recordedKey: "K2" }), {
    verdict: "deny",
  });
  t.match(judgeBootstrap(req, { tokenGroup: "worker", existing: { group: "worker" }, recordedKey: "K1" }), {
    verdict: "approve",
    because: /re-bootstrapping/,
  });
  t.match(judgeBootstrap(req, { tokenGroup: "", existing: { group: "worker" }, recordedKey: "K1" }), {
    verdict: "deny",
    reason: /token is for no node group and the Node is in node group worker/,
  });
  t.match(judgeBootstrap(req, { tokenGroup: "", existing: { group: "" }, recordedKey: "K1" }), { verdict: "approve" });
});
