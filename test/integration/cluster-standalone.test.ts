// `bashible server --standalone` as a user runs it: its own certificates, callers with client
// certificates, inputs from a directory that it re-reads when a file changes.
import t from "tap";
import { spawn } from "node:child_process";
import { cp as copyDir, mkdtemp, readFile, writeFile, rm } from "node:fs/promises";
import https from "node:https";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createCA, issueCert } from "../../scripts/lib/pki.ts";

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const API = "/apis/bashible.deckhouse.io/v1alpha1";
const tmp = await mkdtemp(path.join(os.tmpdir(), "bashible-standalone-"));
t.teardown(() => rm(tmp, { recursive: true, force: true }));
const configDir = path.join(tmp, "config");
await copyDir(path.join(REPO, "examples/cluster"), configDir, { recursive: true });
await writeFile(
  path.join(configDir, "frontend.yaml"),
  "apiVersion: deckhouse.io/v1\nkind: NodeGroup\nmetadata: {name: frontend}\nspec: {nodeType: CloudEphemeral}\n",
);
const certDir = path.join(tmp, "certs");

const child = spawn(
  process.execPath,
  [
    path.join(REPO, "agent/main.ts"),
    "server",
    "--standalone",
    "--port",
    "0",
    "--address",
    "127.0.0.1",
    "--cert-dir",
    certDir,
    "--config-dir",
    configDir,
    "--log-format",
    "json",
  ],
  { stdio: ["ignore", "pipe", "inherit"] },
);
t.teardown(() => void child.kill("SIGTERM"));
let logs = "";
child.stdout.on("data", (d: Buffer) => (logs += d.toString()));
const port = await new Promise<number>((resolve, reject) => {
  const timer = setTimeout(() => reject(new Error(`server did not start:\n${logs}`)), 30_000);
  const check = () => {
    const m = logs.match(/"port":(\d+).*"msg":"bundle server listening"/);
    if (m) {
      clearTimeout(timer);
      resolve(Number(m[1]));
    } else setTimeout(check, 50);
  };
  check();
});

const ca = await readFile(path.join(certDir, "ca.crt"));
const signer = { cert: path.join(certDir, "ca.crt"), key: path.join(certDir, "ca.key") };
const nodeCert = await issueCert(tmp, "worker-1", signer, {
  cn: "system:node:worker-1",
  orgs: ["system:nodes"],
  client: true,
});
const strangerCA = await createCA(tmp, "stranger-ca");
const stranger = await issueCert(tmp, "stranger", strangerCA, { cn: "admin", orgs: ["system:masters"], client: true });
const admin = { cert: path.join(certDir, "admin.crt"), key: path.join(certDir, "admin.key") };

interface Res {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}
async function get(p: string, who?: { cert: string; key: string }, headers: Record<string, string> = {}): Promise<Res> {
  const opts = {
    ca,
    headers,
    ...(who ? { cert: await readFile(who.cert), key: await readFile(who.key) } : {}),
  };
  return new Promise((resolve, reject) => {
    https
      .get(`https://localhost:${port}${p}`, opts, (res) => {
        let body = "";
        res.on("data", (d: Buffer) => (body += d.toString()));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
      })
      .on("error", reject);
  });
}

t.test("the admin certificate it wrote reads every group", async (t) => {
  const r = await get(`${API}/nodegroupbundles`, admin);
  t.equal(r.status, 200);
  t.same(
    JSON.parse(r.body).items.map((i: { metadata: { name: string } }) => i.metadata.name),
    ["frontend", "worker"],
  );
});

t.test("a node certificate reads its own group (from the Node objects in the dir) and no other", async (t) => {
  const own = await get(`${API}/nodegroupbundles/worker`, nodeCert);
  t.equal(own.status, 200);
  const other = await get(`${API}/nodegroupbundles/frontend`, nodeCert);
  t.equal(other.status, 403);
  t.equal(JSON.parse(other.body).kind, "Status");
});

t.test("no certificate, or one from another CA, is refused with 401", async (t) => {
  t.equal((await get(`${API}/nodegroupbundles/worker`)).status, 401);
  const r = await get(`${API}/nodegroupbundles/worker`, stranger);
  t.equal(r.status, 401);
  t.match(JSON.parse(r.body).message, /not issued by a trusted CA/);
});

t.test("an unchanged bundle answers 304 to its ETag", async (t) => {
  const first = await get(`${API}/nodegroupbundles/worker`, nodeCert);
  const etag = String(first.headers.etag);
  const again = await get(`${API}/nodegroupbundles/worker`, nodeCert, { "If-None-Match": etag });
  t.equal(again.status, 304);
  t.equal(again.body, "");
});

t.test("editing the config dir reaches a watching node within seconds; a broken file changes nothing", async (t) => {
  const before = JSON.parse((await get(`${API}/nodegroupbundles/worker`, nodeCert)).body);
  const events: { type: string; object: { checksum: string } }[] = [];
  const req = https.get(
    `https://localhost:${port}${API}/nodegroupbundles?watch=1&fieldSelector=metadata.name%3Dworker&resourceVersion=${before.metadata.resourceVersion}`,
    { ca, cert: await readFile(nodeCert.cert), key: await readFile(nodeCert.key) },
    (res) => {
      let buf = "";
      res.on("data", (d: Buffer) => {
        buf += d.toString();
        const lines = buf.split("\n");
        buf = lines.pop() ?? "";
        for (const l of lines) if (l) events.push(JSON.parse(l));
      });
    },
  );
  t.teardown(() => req.destroy());
  await new Promise((r) => setTimeout(r, 300));
  t.same(events, [], "resuming from the current resourceVersion sends nothing");

  const ngc = path.join(configDir, "ngc-sysctl.yaml");
  await writeFile(ngc, (await readFile(ngc, "utf8")).replace("vm.swappiness = 1", "vm.swappiness = 5"));
  const started = Date.now();
  while (!events.length && Date.now() - started < 5000) await new Promise((r) => setTimeout(r, 50));
  t.equal(events[0]?.type, "MODIFIED");
  t.not(events[0]?.object.checksum, before.checksum);

  await writeFile(path.join(configDir, "zz-broken.yaml"), "kind: NodeGroup\nmetadata: [oops\n");
  await new Promise((r) => setTimeout(r, 600));
  const after = await get(`${API}/nodegroupbundles/worker`, nodeCert);
  t.equal(JSON.parse(after.body).checksum, events[0]?.object.checksum, "still serving the last good bundle");
  t.match(logs, /cannot re-read the config dir/);
});

t.test("health and metrics need no certificate", async (t) => {
  t.equal((await get("/readyz")).status, 200);
  const m = await get("/metrics");
  t.match(m.body, /bashible_server_renders_total \d+/);
  t.match(m.body, /bashible_server_requests_total\{code="403",http="1.1",resource="nodegroupbundles",verb="get"\} 1/);
});
