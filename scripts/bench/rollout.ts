// npm run bench -- rollout [--nodes 200] [--max-concurrent 10] [--apply-ms 200] [--rounds 3]
//
// A rolling update of one node group through the real update controller: kube-apiserver + etcd,
// `bashible server` as its own process (it renders and runs the controllers) authenticated as
// its ServiceAccount from cluster/deploy, N Node objects of group worker without kubelets, and
// a simulated agent per node in this process (one list + watch of the Nodes and of the
// checksums Secret): on a new checksum it asks (waiting-for-approval, dropping its checksum
// annotation), waits for `approved`, "applies" for --apply-ms, writes the new checksum. Each
// round changes the NodeGroup (kubelet.maxPods) and times until every node carries the new
// checksum with its update annotations cleared. The server's CPU comes from /proc; its API
// requests from the API server's audit log (only the server's ServiceAccount is audited).
import { spawn, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { pino } from "pino";
import { NODE_KEYS, SECRETS } from "../../bundles/names.ts";
import { Informer } from "../../lib/informer.ts";
import { startControlPlane } from "../lib/control-plane.ts";
import { prepareBundleServer } from "../lib/bundle-server.ts";
import { annotate, createNode } from "../lib/sim-nodes.ts";

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const NS = "d8-cloud-instance-manager";
const SA_USER = `system:serviceaccount:${NS}:bashible-server`;
const K = NODE_KEYS;

const { values } = parseArgs({
  options: {
    nodes: { type: "string" },
    "max-concurrent": { type: "string" },
    "apply-ms": { type: "string" },
    rounds: { type: "string" },
  },
});
const nodes = Number(values.nodes ?? 200);
const maxConcurrent = Number(values["max-concurrent"] ?? 10);
const applyMs = Number(values["apply-ms"] ?? 200);
const rounds = Number(values.rounds ?? 3);

function cpuSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(f[11]) + Number(f[12])) / 100;
}
const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

const AUDIT_POLICY = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    users: ["${SA_USER}"]
  - level: None
`;

interface AuditLine {
  stage: string;
  verb: string;
  user: { username: string };
  objectRef?: { resource?: string; subresource?: string; name?: string };
  stageTimestamp: string;
}

async function auditCounts(file: string, from: number, to: number): Promise<Map<string, number>> {
  const counts = new Map<string, number>();
  for (const line of (await readFile(file, "utf8")).split("\n")) {
    if (!line) continue;
    const e = JSON.parse(line) as AuditLine;
    // Watches show as ResponseStarted when they open; everything else once, when complete.
    if (e.stage !== (e.verb === "watch" ? "ResponseStarted" : "ResponseComplete")) continue;
    const at = Date.parse(e.stageTimestamp);
    if (at < from || at > to || e.user.username !== SA_USER) continue;
    const r = e.objectRef;
    const key = `${e.verb} ${r?.resource ?? "?"}${r?.subresource ? `/${r.subresource}` : ""}`;
    counts.set(key, (counts.get(key) ?? 0) + 1);
  }
  return counts;
}

const log = pino({ level: "warn" });
const tmp = await mkdtemp(path.join(os.tmpdir(), "bashible-bench-rollout-"));
const auditFile = path.join(tmp, "audit.log");
const policyFile = path.join(tmp, "audit-policy.yaml");
await writeFile(policyFile, AUDIT_POLICY);
await writeFile(auditFile, "");
const cp = await startControlPlane({
  readyTimeoutSeconds: 120,
  extraApiserverArgs: [`--audit-policy-file=${policyFile}`, `--audit-log-path=${auditFile}`],
});
const children: ChildProcess[] = [];
try {
  const inputs = await prepareBundleServer(cp);
  await cp.kubectl([
    "patch",
    "nodegroup",
    "worker",
    "--type=merge",
    "-p",
    JSON.stringify({ spec: { update: { maxConcurrent } } }),
  ]);
  const token = (await cp.kubectl(["create", "token", "bashible-server", "-n", NS, "--duration=2h"])).trim();
  const kubeconfig = await cp.writeKubeconfig(path.join(cp.dir, "sa.kubeconfig"), { token });
  const server = spawn(
    process.execPath,
    [
      path.join(REPO, "agent/main.ts"),
      "server",
      `--kubeconfig=${kubeconfig}`,
      `--tls-cert-file=${inputs.serving.cert}`,
      `--tls-private-key-file=${inputs.serving.key}`,
      "--address=127.0.0.1",
      "--port=0",
      "--log-level=warn",
      "--log-format=json",
    ],
    { stdio: ["ignore", "inherit", "inherit"] },
  );
  children.push(server);

  // The simulated agents.
  let desired = "";
  const applying = new Set<string>();
  const asked = new Set<string>();
  let nodeInf: Informer | undefined;
  const secret = new Informer({
    client: cp.admin,
    path: `/api/v1/namespaces/${NS}/secrets`,
    fieldSelector: `metadata.name=${SECRETS.checksums}`,
    log,
    onEvent: () => {
      const s = secret.objects.get(`${NS}/${SECRETS.checksums}`);
      const v = (s?.data as Record<string, string> | undefined)?.worker;
      desired = v ? Buffer.from(v, "base64").toString() : "";
      for (const n of nodeInf?.objects.values() ?? []) step(n.metadata.name, n.metadata.annotations ?? {});
    },
  });
  const agentRequests = { count: 0 };
  const patch = (name: string, a: Record<string, string | null>) => {
    agentRequests.count++;
    return annotate(cp.admin, name, a).catch((err: Error) => console.error(`agent ${name}: ${err.message}`));
  };
  function step(name: string, a: Record<string, string>): void {
    if (!desired || a[K.checksum] === desired) return;
    const key = `${name}:${desired}`;
    if (a[K.approved] !== undefined) {
      if (applying.has(key)) return;
      applying.add(key);
      const target = desired;
      setTimeout(() => void patch(name, { [K.checksum]: target }), applyMs);
      return;
    }
    if (a[K.waitingForApproval] === undefined && !asked.has(key)) {
      asked.add(key);
      void patch(name, { [K.waitingForApproval]: "", [K.checksum]: null });
    }
  }
  nodeInf = new Informer({
    client: cp.admin,
    path: "/api/v1/nodes",
    labelSelector: `${K.group}=worker`,
    log,
    onEvent: (ev) => {
      if (ev.type === "ADDED" || ev.type === "MODIFIED")
        step(ev.object.metadata.name, ev.object.metadata.annotations ?? {});
    },
  });

  const deadline = Date.now() + 60_000;
  while (!desired) {
    if (!secret.synced) await secret.start().catch(() => undefined);
    const s = await cp.admin
      .request<{ data?: Record<string, string> }>("GET", `/api/v1/namespaces/${NS}/secrets/${SECRETS.checksums}`)
      .catch(() => undefined);
    if (s?.data?.worker) desired = Buffer.from(s.data.worker, "base64").toString();
    if (Date.now() > deadline) throw new Error("the server wrote no checksum within 60 s");
    if (!desired) await new Promise((r) => setTimeout(r, 200));
  }
  const t0 = Date.now();
  for (let i = 0; i < nodes; i += 20) {
    await Promise.all(
      Array.from({ length: Math.min(20, nodes - i) }, (_, k) =>
        createNode(cp.admin, `node-${String(i + k).padStart(4, "0")}`, "worker", {
          annotations: { [K.checksum]: desired },
        }),
      ),
    );
  }
  await nodeInf.start();
  console.log(
    `${nodes} Node objects of group worker created in ${((Date.now() - t0) / 1000).toFixed(1)} s; maxConcurrent ${maxConcurrent}, simulated apply ${applyMs} ms, ${rounds} rounds; server pid ${server.pid}`,
  );

  const done = () =>
    [...nodeInf.objects.values()].every((n) => {
      const a = n.metadata.annotations ?? {};
      return a[K.checksum] === desired && Object.keys(a).every((k) => !k.startsWith("update.node.deckhouse.io/"));
    });
  const results: { seconds: number; cpu: number; requests: number; counts: Map<string, number>; agent: number }[] = [];
  for (let r = 1; r <= rounds; r++) {
    const before = desired;
    const cpu0 = cpuSeconds(server.pid!);
    const agent0 = agentRequests.count;
    const start = Date.now();
    await cp.kubectl([
      "patch",
      "nodegroupconfiguration",
      "sysctl-tuning",
      "--type=merge",
      "-p",
      JSON.stringify({ spec: { content: `echo rollout ${r}\n` } }),
    ]);
    while (desired === before || !done()) {
      if (Date.now() - start > 30 * 60_000) throw new Error("rollout did not finish in 30 minutes");
      await new Promise((res) => setTimeout(res, 100));
    }
    const end = Date.now();
    // Let the last status write and Events land before counting.
    await new Promise((res) => setTimeout(res, 2000));
    const cpu = cpuSeconds(server.pid!) - cpu0;
    const counts = await auditCounts(auditFile, start, Date.now());
    const requests = [...counts.values()].reduce((a, b) => a + b, 0);
    results.push({ seconds: (end - start) / 1000, cpu, requests, counts, agent: agentRequests.count - agent0 });
    console.log(
      `round ${r}: ${(end - start) / 1000} s to ${nodes}/${nodes} nodes updated; server CPU ${cpu.toFixed(2)} s; server API requests ${requests} (${(requests / nodes).toFixed(2)} per node); agents' ${agentRequests.count - agent0}`,
    );
  }
  const last = results.at(-1)!;
  console.log("\nserver API requests in the last round, by verb and resource:");
  for (const [k, v] of [...last.counts].sort((a, b) => b[1] - a[1])) console.log(`  ${k.padEnd(40)} ${v}`);
  const ideal = Math.ceil(nodes / maxConcurrent) * (applyMs / 1000);
  console.log(
    `\nmedian of ${rounds}: ${median(results.map((x) => x.seconds)).toFixed(1)} s per rollout of ${nodes} nodes at maxConcurrent ${maxConcurrent} (the apply time alone, in ${Math.ceil(nodes / maxConcurrent)} waves, is ${ideal.toFixed(1)} s; ratio ${(median(results.map((x) => x.seconds)) / ideal).toFixed(2)}×)`,
  );
  console.log(
    `server CPU ${median(results.map((x) => x.cpu)).toFixed(2)} s per rollout (${((median(results.map((x) => x.cpu)) / nodes) * 1000).toFixed(1)} ms per node); API requests ${(median(results.map((x) => x.requests)) / nodes).toFixed(2)} per node (two transitions: approve, clear), agents ${(median(results.map((x) => x.agent)) / nodes).toFixed(2)} per node`,
  );
  nodeInf.stop();
  secret.stop();
} finally {
  for (const c of children) c.kill("SIGTERM");
  await cp.stop();
  await rm(tmp, { recursive: true, force: true });
}
