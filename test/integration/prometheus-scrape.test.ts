// A real Prometheus (Debian's prometheus package) run with the shipped configuration
// (cluster/deploy/monitoring/prometheus.yml and its rule file) against the real kube-apiserver:
// it scrapes the bundle server's pod (the controllers' Deckhouse-named series) and a node
// agent's authenticated endpoint, which the cluster context turned on
// (agent.metricsSecureAddress, followed from the applied bundle) and which checks Prometheus'
// ServiceAccount token with TokenReview and SubjectAccessReview; the shipped rules raise
// Deckhouse's alerts on what was scraped: a node left waiting for disruption approval, a Node no
// group manages, an agent whose early OOM cannot run.
//
// What differs from a Prometheus in the cluster, and only that: the Kubernetes discovery, which
// Debian's build lacks, is a file of the targets it would find in the real API server's objects
// (scripts/lib/prometheus.ts), kube-state-metrics' node conditions come from a stand-in reading
// the real Nodes, the token and CA files are the test's, the agents' port is a free one instead
// of 9650, and both intervals are 1 s.
import t from "tap";
import { spawnSync } from "node:child_process";
import { mkdir, mkdtemp, readFile, rename, rm, writeFile } from "node:fs/promises";
import { request as httpsRequest } from "node:https";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parse, stringify } from "yaml";
import { startResidentJobs } from "../../agent/commands/resident-jobs.ts";
import { KUBELET_SERVING_CERT } from "../../agent/metrics-secure.ts";
import { NAMESPACE, NODE_KEYS } from "../../bundles/names.ts";
import { PATHS } from "../../bundles/paths.ts";
import { KubeClient } from "../../lib/kube/client.ts";
import { loadKubeconfig } from "../../lib/kube/kubeconfig.ts";
import { issueCert } from "../../lib/pki.ts";
import { registerBundleServer } from "../../scripts/lib/bundle-server.ts";
import { freePort } from "../../scripts/lib/control-plane.ts";
import { withControlPlane } from "../../scripts/lib/control-plane-fixture.ts";
import { captureLogger } from "../../scripts/lib/early-oom.ts";
import {
  discoverNow,
  type ScrapeJob,
  startNodeConditionExporter,
  startPrometheus,
} from "../../scripts/lib/prometheus.ts";
import { until } from "../../scripts/lib/until.ts";

const MON = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../cluster/deploy/monitoring");
const SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount";
const hasPrometheus = spawnSync("sh", ["-c", "command -v prometheus"], { encoding: "utf8" }).stdout.trim() !== "";
if (!hasPrometheus) {
  t.comment("prometheus not found: install Debian's prometheus package (.ci/run does)");
  t.pass("skipped without prometheus");
  process.exit(0);
}

const NODE = "prom-node-1";
const UNMANAGED = "prom-unmanaged";
const cp = await withControlPlane(t);
const dir = await mkdtemp(path.join(os.tmpdir(), "bashible-prometheus-"));
t.teardown(() => rm(dir, { recursive: true, force: true }));

// The bundle server with its controllers (their series are on the leading replica's /metrics).
const server = await registerBundleServer(cp, { controllers: {}, logFile: path.join(dir, "server.log") });
t.teardown(() => server.app.stop());
const apply = server.apply;
await cp.kubectl(["apply", "-f", path.join(MON, "rbac.yaml")]);

// The pod discovery finds: the server as a Deployment's pod would show it (no kubelet runs here,
// so its status is written as one would write it).
await apply({ apiVersion: "v1", kind: "ServiceAccount", metadata: { name: "default", namespace: NAMESPACE } });
await apply({
  apiVersion: "v1",
  kind: "Pod",
  metadata: { name: "bashible-server-0", namespace: NAMESPACE, labels: { app: "bashible-server" } },
  spec: {
    automountServiceAccountToken: false,
    containers: [
      { name: "server", image: "bashible:test", ports: [{ name: "https", containerPort: server.app.port }] },
    ],
  },
});
await cp.kubectl([
  "patch",
  "pod",
  "bashible-server-0",
  "-n",
  NAMESPACE,
  "--subresource=status",
  "--type=merge",
  "-p",
  JSON.stringify({ status: { phase: "Running", podIP: "127.0.0.1", podIPs: [{ ip: "127.0.0.1" }] } }),
]);

// Two Nodes: one of group worker running the agent, one no group manages.
for (const [name, labels] of [
  [NODE, { [NODE_KEYS.group]: "worker" }],
  [UNMANAGED, {}],
] as const) {
  await apply({ apiVersion: "v1", kind: "Node", metadata: { name, labels } });
}

// Their addresses and Ready condition, as their kubelets would report them.
for (const name of [NODE, UNMANAGED]) {
  await cp.kubectl([
    "patch",
    "node",
    name,
    "--subresource=status",
    "--type=merge",
    "-p",
    JSON.stringify({
      status: {
        // The unmanaged Node's address has no agent listening: its target is down.
        addresses: [{ type: "InternalIP", address: name === NODE ? "127.0.0.1" : "127.0.0.2" }],
        conditions: [
          { type: "Ready", status: "True", reason: "KubeletReady", lastHeartbeatTime: new Date().toISOString() },
        ],
      },
    }),
  ]);
}
// Prometheus' own ServiceAccount, as Deckhouse's monitoring has it (rbac.yaml binds it for the
// agents' metrics); its discovery rights are what a Prometheus install grants itself.
await cp.kubectl(["create", "namespace", "d8-monitoring"]);
await cp.kubectl(["create", "serviceaccount", "prometheus", "-n", "d8-monitoring"]);
await cp.kubectl(["create", "clusterrole", "prometheus-discovery", "--verb=list,watch", "--resource=nodes,pods"]);
await cp.kubectl([
  "create",
  "clusterrolebinding",
  "prometheus-discovery",
  "--clusterrole=prometheus-discovery",
  "--serviceaccount=d8-monitoring:prometheus",
]);
await cp.kubectl(["create", "serviceaccount", "nosy", "-n", "default"]);
const nosy = (await cp.kubectl(["create", "token", "nosy", "-n", "default", "--duration=1h"])).trim();
const tokenFile = path.join(dir, "token");
await writeFile(
  tokenFile,
  (await cp.kubectl(["create", "token", "prometheus", "-n", "d8-monitoring", "--duration=1h"])).trim(),
);

// The node agent: the kubelet's credentials and serving certificate, and an applied bundle whose
// context turns the authenticated endpoint on at the Node's InternalIP. Early OOM runs over a
// /proc without PSI, so it reports itself unavailable (the early OOM alert's series).
const agentPort = await freePort();
const root = path.join(dir, "node");
const kubelet = new KubeClient(await loadKubeconfig((await cp.mintNode(NODE)).kubeconfig));
t.teardown(() => kubelet.close());
{
  const c = await issueCert(dir, "serving", cp.ca, {
    cn: `system:node:${NODE}`,
    orgs: ["system:nodes"],
    ips: ["127.0.0.1"],
  });
  const file = path.join(root, KUBELET_SERVING_CERT);
  await mkdir(path.dirname(file), { recursive: true });
  await writeFile(file, `${await readFile(c.cert, "utf8")}${await readFile(c.key, "utf8")}`, { mode: 0o600 });
  const checksum = "a".repeat(64);
  await mkdir(path.join(root, PATHS.bundles), { recursive: true });
  await writeFile(
    path.join(root, PATHS.bundles, `${checksum}.json`),
    JSON.stringify({ checksum, context: { agent: { metricsSecureAddress: `internal:${agentPort}` } } }),
  );
  await writeFile(`${path.join(root, PATHS.status)}.new`, JSON.stringify({ appliedChecksum: checksum }));
  await rename(`${path.join(root, PATHS.status)}.new`, path.join(root, PATHS.status));
  await mkdir(path.join(root, "proc"), { recursive: true });
}
const agentLog = captureLogger();
const jobs = await startResidentJobs({
  values: { "metrics-address": "off" },
  root,
  log: agentLog,
  nodeName: NODE,
  kube: () => kubelet,
});
t.teardown(() => jobs.stop());

// Manual approval, and the agent's node reported a disruption it needs: it waits for an operator.
await cp.kubectl([
  "patch",
  "nodegroup",
  "worker",
  "--type=merge",
  "-p",
  '{"spec":{"disruptions":{"approvalMode":"Manual"}}}',
]);
await cp.kubectl(["annotate", "node", NODE, `${NODE_KEYS.approved}=`, `${NODE_KEYS.disruptionRequired}=`]);
const conditions = await startNodeConditionExporter(cp.admin);
t.teardown(() => conditions.stop());

// The shipped configuration, changed only where a Prometheus outside the cluster must be told.
const shipped = parse(await readFile(path.join(MON, "prometheus.yml"), "utf8")) as {
  rule_files: string[];
  scrape_configs: (ScrapeJob & {
    authorization?: { credentials_file?: string };
    tls_config?: { ca_file?: string };
    relabel_configs: { replacement?: string }[];
  })[];
};
const inCluster = (file: string | undefined) =>
  file?.replace(`${SA_DIR}/token`, tokenFile).replace(`${SA_DIR}/ca.crt`, cp.ca.cert);
let portReplaced = false;
for (const job of shipped.scrape_configs) {
  if (job.authorization?.credentials_file)
    job.authorization.credentials_file = inCluster(job.authorization.credentials_file);
  if (job.tls_config?.ca_file) job.tls_config.ca_file = inCluster(job.tls_config.ca_file);
  for (const r of job.relabel_configs) {
    if (r.replacement !== "$1:9650") continue;
    r.replacement = `$1:${agentPort}`;
    portReplaced = true;
  }
}
await discoverNow(cp.admin, shipped.scrape_configs, dir);
// The shipped rules as they are, and one group again with D8NodeIsUnmanaged's 10 minutes
// dropped, so the test sees it fire as well as pend.
const rules = parse(await readFile(path.join(MON, shipped.rule_files[0]!), "utf8")) as {
  groups: { name: string; rules: { alert?: string; for?: string }[] }[];
};
const unmanagedGroup = structuredClone(rules.groups.find((g) => g.rules.some((r) => r.alert === "D8NodeIsUnmanaged"))!);
unmanagedGroup.name = `${unmanagedGroup.name}-now`;
for (const r of unmanagedGroup.rules) delete r.for;
await writeFile(path.join(dir, "now.rules.yaml"), stringify({ groups: [unmanagedGroup] }));
const prom = await startPrometheus(dir, {
  global: { scrape_interval: "1s", evaluation_interval: "1s" },
  rule_files: [path.join(MON, shipped.rule_files[0]!), path.join(dir, "now.rules.yaml")],
  scrape_configs: [
    ...shipped.scrape_configs,
    { job_name: "kube-state-metrics", static_configs: [{ targets: [conditions.address] }] },
  ],
});
t.teardown(() => prom.stop());

t.test("the bundle server's pod is scraped: the controllers' Deckhouse-named series", async (t) => {
  const up = await prom.upTarget("bashible-server", (l) => l.pod === "bashible-server-0");
  t.equal(up.lastError, "", "scraped with Prometheus' token, which may get /metrics");
  // Anyone else who reaches the pod: nothing.
  const scrape = (token?: string) =>
    new Promise<number>((resolve, reject) => {
      const req = httpsRequest(
        {
          host: "127.0.0.1",
          port: server.app.port,
          path: "/metrics",
          ca: server.caPem,
          servername: "localhost",
          agent: false,
          headers: token ? { authorization: `Bearer ${token}` } : {},
        },
        (res) => {
          res.resume();
          resolve(res.statusCode ?? 0);
        },
      );
      req.on("error", reject);
      req.end();
    });
  t.equal(await scrape(), 401, "no token");
  t.equal(await scrape("garbage"), 401, "a token the API server does not accept");
  t.equal(await scrape(nosy), 403, "a ServiceAccount not granted get on /metrics");
  const unmanaged = await until("d8_unmanaged_nodes_on_cluster from the server", async () => {
    const r = await prom.query(`d8_unmanaged_nodes_on_cluster{job="bashible-server"}`);
    return r.length > 0 && r;
  });
  t.same(
    unmanaged.map((s) => [s.metric.node, s.value[1]]),
    [[UNMANAGED, "1"]],
    "the Node without a group, and only it",
  );
  const waiting = await until("the node's update state", async () => {
    const r = await prom.query(`node_group_node_status{job="bashible-server",node="${NODE}"} == 1`);
    return r.length > 0 && r;
  });
  t.same(
    waiting.map((s) => [s.metric.node_group, s.metric.status]),
    [["worker", "WaitingForManualDisruptionApproval"]],
  );
});

t.test("the node agent is found by its Node, authenticated, and labelled for the alerts", async (t) => {
  t.ok(portReplaced, "the agents' job points at the agent's port (the shipped file says 9650)");
  const up = await prom.upTarget("bashible-agent", (l) => l.node === NODE);
  t.equal(up.labels.node_group, "worker", "node_group from the Node's label");
  t.equal(up.labels.instance, NODE, "instance is the Node's name, as Kubernetes discovery sets it");
  const rss = await prom.query(`process_resident_memory_bytes{job="bashible-agent",node="${NODE}"}`);
  t.ok(Number(rss[0]?.value[1]) > 0, "the agent's own series, read with Prometheus' token");
  t.ok(
    agentLog.lines.some((l) => l.msg === `authenticated metrics follow the cluster's setting: internal:${agentPort}`),
    "opened on the cluster's setting, not a flag",
  );
  t.notOk(JSON.stringify(agentLog.lines).includes(await readFile(tokenFile, "utf8")), "no token in the agent's log");
  const other = await until("the unmanaged Node's target to be scraped", async () => {
    const found = (await prom.targets()).find((x) => x.scrapePool === "bashible-agent" && x.labels.node === UNMANAGED);
    return found && found.health !== "unknown" && found;
  });
  t.equal(other.health, "down", "a Node whose agent serves no authenticated endpoint is a down target");
});

t.test("the shipped rules raise Deckhouse's alerts on the scraped series", async (t) => {
  const alert = (name: string, state?: string) =>
    until(`${name}${state ? ` ${state}` : ""}`, async () =>
      (await prom.alerts()).find((a) => a.labels.alertname === name && (!state || a.state === state)),
    );
  const approval = await alert("NodeRequiresDisruptionApprovalForUpdate", "firing");
  t.same([approval.labels.node, approval.labels.node_group], [NODE, "worker"], "the node left waiting for approval");
  t.match(
    approval.annotations.description,
    `kubectl annotate node ${NODE} update.node.deckhouse.io/disruption-approved=`,
  );

  const pending = await alert("D8NodeIsUnmanaged", "pending");
  t.equal(pending.labels.node, UNMANAGED, "the shipped rule pends for its 10 minutes, on the unmanaged Node");
  const firing = await alert("D8NodeIsUnmanaged", "firing");
  t.equal(firing.labels.severity_level, "9");
  t.match(firing.annotations.summary, `The ${UNMANAGED} Node is not managed by the node-manager.`);
  t.match(firing.annotations.description, `kubectl label node ${UNMANAGED} node.deckhouse.io/group=<group>`);

  const eo = await alert("EarlyOOMPodIsNotReady");
  t.equal(eo.labels.node, NODE, "joined on the node label the agents' job adds");
  t.ok(["pending", "firing"].includes(eo.state), `raised (${eo.state}; it fires after its 3 minutes)`);
  t.notOk(
    (await prom.alerts()).some((a) => a.labels.node === NODE && a.labels.alertname === "D8NodeIsUnmanaged"),
    "the managed Node raises no unmanaged alert",
  );
});
