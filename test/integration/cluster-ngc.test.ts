// NodeGroupConfigurations through the real server render loop on a real kube-apiserver: Deckhouse's
// bundle names and Go templates render, a broken NGC freezes only the groups it selects (which
// keep their last good bundle) and says why in its status and an Event, and it recovers when
// fixed. Also: the context Secret under Deckhouse's name and the old one, and bootstrap tokens
// made and cleaned up as Deckhouse makes them.
import t from "tap";
import path from "node:path";
import { mkdir, readFile } from "node:fs/promises";
import { pino } from "pino";
import { parse } from "yaml";
import { withControlPlane } from "../../scripts/lib/control-plane-fixture.ts";
import { EXAMPLE_DIR } from "../../scripts/lib/bundle-server.ts";
import { createCA, issueCert } from "../../scripts/lib/pki.ts";
import { installCrds } from "../../cluster/crds/install.ts";
import { startBundleServer } from "../../cluster/server/app.ts";
import { createSecret, getSecret, list } from "../../lib/kube/api.ts";
import type { NodeGroupBundle } from "../../bundles/types.ts";
import { pruneExpiredTokens } from "../../cluster/server/bootstrap-secrets.ts";
import { KubeSource } from "../../cluster/sources/kube.ts";
import { BOOTSTRAP_TOKEN_GROUP_LABEL, SECRETS } from "../../bundles/names.ts";
import { until } from "../../scripts/lib/until.ts";

const cp = await withControlPlane(t);
await installCrds(cp.admin);
const NS = "d8-cloud-instance-manager";
const NGC = "/apis/deckhouse.io/v1alpha1/nodegroupconfigurations";
const log = pino({ level: "silent" });

const apply = (path: string, body: object) => cp.admin.request("POST", path, { body });
const put = async (name: string, spec: object) => {
  const cur = await cp.admin.request<{ metadata: { resourceVersion: string } }>("GET", `${NGC}/${name}`);
  await cp.admin.request("PUT", `${NGC}/${name}`, {
    body: {
      apiVersion: "deckhouse.io/v1alpha1",
      kind: "NodeGroupConfiguration",
      metadata: { name, resourceVersion: cur.metadata.resourceVersion },
      spec,
    },
  });
};
const ngc = (name: string, spec: object) =>
  apply(NGC, { apiVersion: "deckhouse.io/v1alpha1", kind: "NodeGroupConfiguration", metadata: { name }, spec });

await apply("/api/v1/namespaces", { apiVersion: "v1", kind: "Namespace", metadata: { name: NS } });
const context = parse(await readFile(path.join(EXAMPLE_DIR, "context.yaml"), "utf8")) as Record<string, unknown>;
// The project's earlier Secret name and key first: still read.
await createSecret(cp.admin, {
  apiVersion: "v1",
  kind: "Secret",
  metadata: { name: SECRETS.legacyContext, namespace: NS },
  stringData: { [SECRETS.legacyContextKey]: JSON.stringify({ ...context, kubernetesVersion: "1.33" }) },
});
for (const [name, nodeType] of [
  ["worker", "Static"],
  ["frontend", "CloudPermanent"],
]) {
  await apply("/apis/deckhouse.io/v1/nodegroups", {
    apiVersion: "deckhouse.io/v1",
    kind: "NodeGroup",
    metadata: { name },
    spec: { nodeType },
  });
}
// The Secret Deckhouse's node-manager left for frontend, as its template makes it.
await createSecret(cp.admin, {
  apiVersion: "v1",
  kind: "Secret",
  type: "Opaque",
  metadata: {
    name: "manual-bootstrap-for-frontend",
    namespace: NS,
    labels: { heritage: "deckhouse", module: "node-manager", team: "infra" },
  },
  stringData: {
    "bootstrap.sh": "#!/bin/bash\n# Deckhouse's\n",
    "cloud-config": "#cloud-config\n",
    apiserverEndpoints: "- 10.0.0.1:6443\n",
  },
});
await ngc("hello.sh", {
  nodeGroups: ["*"],
  bundles: ["*"],
  content: 'echo "hello from {{ .nodeGroup.name }} ({{ .runType }}, cri {{ .cri }})"\n',
});

const pki = path.join(cp.dir, "bundle-server");
await mkdir(pki, { recursive: true });
const ca = await createCA(pki, "ca");
const serving = await issueCert(pki, "serving", ca, {
  cn: "bashible-api",
  dnsNames: ["localhost"],
  ips: ["127.0.0.1"],
});
const app = await startBundleServer({
  log,
  kube: cp.admin,
  tls: { cert: await readFile(serving.cert), key: await readFile(serving.key) },
  host: "127.0.0.1",
  port: 0,
});
t.teardown(() => app.stop());

const bundle = (group: string) =>
  app.store.get("nodegroupbundles", group)?.object as unknown as NodeGroupBundle | undefined;
const scriptOf = (group: string, step: string) => {
  const s = bundle(group)?.steps.find((x) => x.name === step);
  return s?.kind === "Script" ? s.spec : undefined;
};
const failed = async (name: string) => {
  const s = await status(name);
  return s.error ? s : undefined;
};
const status = async (name: string) =>
  (await cp.admin.request<{ status?: { error?: string; failedNodeGroups?: string[] } }>("GET", `${NGC}/${name}`))
    .status ?? {};
const events = async (name: string) =>
  (
    await list<{ reason: string; type: string; message: string; involvedObject: { kind: string; name: string } }>(
      cp.admin,
      "/api/v1/namespaces/default/events",
    )
  ).items.filter((e) => e.involvedObject.kind === "NodeGroupConfiguration" && e.involvedObject.name === name);

t.test("the context is read from the old Secret name, and Deckhouse's name wins once it exists", async (t) => {
  await until("both groups served", async () => bundle("worker") && bundle("frontend"));
  t.equal(bundle("worker")?.context.kubernetesVersion, "1.33", "from bashible-server-context/context.yaml");
  await createSecret(cp.admin, {
    apiVersion: "v1",
    kind: "Secret",
    metadata: { name: SECRETS.context, namespace: NS },
    stringData: { [SECRETS.contextKey]: JSON.stringify(context) },
  });
  await until("context from input.yaml", async () => bundle("worker")?.context.kubernetesVersion === "1.34");
  t.pass("bashible-apiserver-context/input.yaml is preferred");
});

t.test("a Go-template NGC renders with Deckhouse's context in every group it selects", async (t) => {
  t.equal(scriptOf("worker", "100_hello.sh")?.script, 'echo "hello from worker (Normal, cri Containerd)"\n');
  t.equal(scriptOf("frontend", "100_hello.sh")?.script, 'echo "hello from frontend (Normal, cri Containerd)"\n');
});

t.test("Deckhouse's bundle names select: ubuntu-lts is taken as written", async (t) => {
  await ngc("ubuntu-only.sh", {
    nodeGroups: ["frontend"],
    bundles: ["ubuntu-lts", "debian"],
    weight: 31,
    content: "true\n",
  });
  const spec = await until("the step", async () => scriptOf("frontend", "031_ubuntu-only.sh"));
  t.same(spec.bundles, ["debian", "ubuntu-lts"]);
  t.same(await status("ubuntu-only.sh"), {}, "no error in status");
});

t.test("a broken NGC freezes only the groups it selects, and says why", async (t) => {
  const workerBefore = bundle("worker")!.checksum;
  // One change that every group should get, and one broken script that selects worker only.
  await ngc("broken.sh", {
    nodeGroups: ["worker"],
    bundles: ["*"],
    content: 'echo start\n{{- template "helpers" . }}\necho end\n',
  });
  await put("hello.sh", { nodeGroups: ["*"], bundles: ["*"], content: 'echo "v2 {{ .nodeGroup.name }}"\n' });
  await until("frontend got v2", async () => scriptOf("frontend", "100_hello.sh")?.script === 'echo "v2 frontend"\n');
  t.pass("a group the broken NGC does not select renders as usual");
  t.equal(bundle("worker")!.checksum, workerBefore, "worker keeps its last good bundle");
  t.equal(scriptOf("worker", "100_hello.sh")?.script, 'echo "hello from worker (Normal, cri Containerd)"\n');

  const st = await until("status.error", () => failed("broken.sh"));
  t.match(
    st.error,
    /^NodeGroupConfiguration\/broken\.sh: spec\.content line 2: \{\{template "helpers" \.\}\}: template "helpers" not defined/,
  );
  t.same(st.failedNodeGroups, ["worker"]);
  const ev = await until("Warning Event", async () => (await events("broken.sh")).find((e) => e.type === "Warning"));
  t.equal(ev.reason, "BashibleRenderFailed");
  t.match(ev.message, /line 2: .*node groups worker keep their last good bundle/);
});

t.test("a bad bundle name is reported the same way, with the right names", async (t) => {
  await ngc("rhel-only.sh", { nodeGroups: ["frontend"], bundles: ["rhel"], content: "true\n" });
  const st = await until("status.error", () => failed("rhel-only.sh"));
  t.match(
    st.error,
    /unknown bundle 'rhel' in spec\.bundles \('rhel' is a family; its bundles are centos, redos and rosa\)/,
  );
  t.same(st.failedNodeGroups, ["frontend"]);
});

t.test("fixing the NGCs clears their status and lets the held groups move on", async (t) => {
  await put("broken.sh", { nodeGroups: ["worker"], bundles: ["*"], content: "echo fixed\n" });
  await put("rhel-only.sh", { nodeGroups: ["frontend"], bundles: ["centos", "redos", "rosa"], content: "true\n" });
  await until("worker got v2", async () => scriptOf("worker", "100_hello.sh")?.script === 'echo "v2 worker"\n');
  t.equal(scriptOf("worker", "100_broken.sh")?.script, "echo fixed\n");
  await until("status cleared", async () => (await status("broken.sh")).error === undefined);
  await until("status cleared", async () => (await status("rhel-only.sh")).error === undefined);
  t.ok(await until("Normal Event", async () => (await events("broken.sh")).find((e) => e.type === "Normal")));
});

t.test("manual bootstrap tokens look like Deckhouse's and carry the group scope", async (t) => {
  const s = await until("manual-bootstrap-for-worker", async () =>
    getSecret(cp.admin, NS, "manual-bootstrap-for-worker"),
  );
  const script = Buffer.from((s.data as Record<string, string>)["bootstrap.sh"]!, "base64").toString();
  const id = script.match(/'([a-z0-9]{6})\.[a-z0-9]{16}'/)?.[1];
  t.ok(id, "bootstrap.sh carries a token");
  const token = await getSecret(cp.admin, "kube-system", `bootstrap-token-${id}`);
  const data = Object.fromEntries(
    Object.entries(token.data as Record<string, string>).map(([k, v]) => [k, Buffer.from(v, "base64").toString()]),
  );
  t.equal(token.metadata.labels?.[BOOTSTRAP_TOKEN_GROUP_LABEL], "worker");
  t.equal(
    data["auth-extra-groups"],
    "system:bootstrappers:d8-node-manager,system:bootstrappers:d8-node-manager:worker",
  );
  t.equal(data["usage-bootstrap-authentication"], "true");
  t.equal(data["usage-bootstrap-signing"], "true");
  // Deckhouse's hook (order_bootstrap_token.go) writes these six keys, type bootstrap.kubernetes.io/token.
  t.equal((token as { type?: string }).type, "bootstrap.kubernetes.io/token");
  t.same(
    Object.keys(data).sort(),
    [
      "auth-extra-groups",
      "description",
      "expiration",
      "token-id",
      "token-secret",
      "usage-bootstrap-authentication",
      "usage-bootstrap-signing",
    ],
    "Deckhouse's keys, and a description for kubeadm token list",
  );
  t.match(data.expiration, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/, "RFC 3339, as Go's time.RFC3339 writes it");
  t.same(
    Object.keys(s.data as object).sort(),
    ["apiserverEndpoints", "bootstrap.sh", "cloud-config"],
    "Deckhouse's keys",
  );
  t.equal((s as { type?: string }).type, "Opaque");

  const source = new KubeSource(cp.admin, log, { namespace: NS });
  t.equal(await source.tokenGroupOf(id!), "worker", "the server finds a token's group from its label");
  t.equal(await source.tokenGroupOf("zzzzzz"), undefined);
});

t.test("CloudPermanent groups get a manual-bootstrap Secret too, and Deckhouse's is taken over", async (t) => {
  // As Deckhouse does (all but CloudEphemeral): dhctl reads a CloudPermanent group's cloud-config there.
  const s = await until("Deckhouse's Secret rewritten", async () => {
    const got = await getSecret(cp.admin, NS, "manual-bootstrap-for-frontend");
    return got.metadata.labels?.heritage === "bashible" ? got : undefined;
  });
  const data = s.data as Record<string, string>;
  t.same(Object.keys(data).sort(), ["apiserverEndpoints", "bootstrap.sh", "cloud-config"]);
  const script = Buffer.from(data["bootstrap.sh"]!, "base64").toString();
  t.notMatch(script, /Deckhouse's/, "the script is this server's");
  t.match(script, /'[a-z0-9]{6}\.[a-z0-9]{16}'/, "with a token for frontend");
  t.same(s.metadata.labels, {
    heritage: "bashible",
    team: "infra",
    "bashible.deckhouse.io/manual-bootstrap": "true",
    "node.deckhouse.io/group": "frontend",
  });
});

t.test("expired bootstrap tokens are deleted, Deckhouse's and ours", async (t) => {
  const past = new Date(Date.now() - 60_000).toISOString().replace(/\.\d+Z$/, "Z");
  for (const [id, label] of [
    ["aaaaaa", BOOTSTRAP_TOKEN_GROUP_LABEL],
    ["bbbbbb", "bashible.deckhouse.io/bootstrap-token-for"],
  ] as const) {
    await createSecret(cp.admin, {
      apiVersion: "v1",
      kind: "Secret",
      type: "bootstrap.kubernetes.io/token",
      metadata: { name: `bootstrap-token-${id}`, namespace: "kube-system", labels: { [label]: "worker" } },
      stringData: { "token-id": id, "token-secret": "0123456789abcdef", expiration: past },
    });
  }
  const unrelated = await cp.mintBootstrapToken({ ttlSeconds: 1 });
  await new Promise((r) => setTimeout(r, 1100));
  const live = await pruneExpiredTokens(cp.admin, Date.now(), log);
  const names = (await list(cp.admin, "/api/v1/namespaces/kube-system/secrets")).items.map((s) => s.metadata.name);
  t.notOk(names.includes("bootstrap-token-aaaaaa"));
  t.notOk(names.includes("bootstrap-token-bbbbbb"));
  t.ok(
    names.includes(`bootstrap-token-${unrelated.split(".")[0]}`),
    "tokens without a node-group label are not ours to delete",
  );
  t.ok(
    live.every((x) => Date.parse(x.expiration) > Date.now()),
    "what is left is valid",
  );
});
