// Two `bashible server` processes behind the real aggregator (both listen on one port with
// SO_REUSEPORT, as two pods behind one Service): every replica serves; only the holder of
// Lease bashible-server writes the checksums Secret. Three times, an input changes and the
// leader is SIGKILLed right after (while it renders, or just after it wrote); the other takes
// the writes over within 15 s, and nodes watching and polling through the aggregator never see
// a checksum go back to an older one.
import t from "tap";
import { spawn, type ChildProcess } from "node:child_process";
import { open } from "node:fs/promises";
import path from "node:path";
import { SECRETS } from "../../bundles/names.ts";
import { KubeClient } from "../../lib/kube/client.ts";
import { loadKubeconfig } from "../../lib/kube/kubeconfig.ts";
import { getSecret } from "../../lib/kube/api.ts";
import { isGone, KubeStatusError } from "../../lib/kube/errors.ts";
import { MAIN } from "../../scripts/lib/cli.ts";
import { withControlPlane } from "../../scripts/lib/control-plane-fixture.ts";
import { prepareBundleServer, registerAPIService } from "../../scripts/lib/bundle-server.ts";
import { freePort } from "../../scripts/lib/control-plane.ts";
import { until } from "../../scripts/lib/until.ts";

const API = "/apis/bashible.deckhouse.io/v1alpha1";
const NS = "d8-cloud-instance-manager";
const cp = await withControlPlane(t, { extraApiserverArgs: ["--enable-aggregator-routing=false"] });
const inputs = await prepareBundleServer(cp);
const port = await freePort();

const procs = new Map<number, ChildProcess>();
let started = 0;
async function startServer(): Promise<ChildProcess> {
  const out = await open(path.join(cp.dir, `server-${++started}.log`), "a");
  const child = spawn(
    process.execPath,
    [
      MAIN,
      "server",
      `--kubeconfig=${cp.adminKubeconfig}`,
      `--tls-cert-file=${inputs.serving.cert}`,
      `--tls-private-key-file=${inputs.serving.key}`,
      `--requestheader-client-ca-file=${cp.frontProxyCA.cert}`,
      "--address=127.0.0.1",
      `--port=${port}`,
      "--reuse-port",
      "--no-controllers",
      "--log-format=json",
    ],
    { stdio: ["ignore", out.fd, out.fd] },
  );
  await out.close();
  procs.set(child.pid!, child);
  child.once("exit", () => procs.delete(child.pid!));
  t.teardown(() => void child.kill("SIGKILL"));
  return child;
}

const secretChecksum = async () => {
  const s = await getSecret(cp.admin, NS, SECRETS.checksums);
  const v = (s.data as Record<string, string> | undefined)?.worker;
  return v ? Buffer.from(v, "base64").toString() : undefined;
};
const leaderPid = async () => {
  const l = await cp.admin.request<{ spec?: { holderIdentity?: string } }>(
    "GET",
    `/apis/coordination.k8s.io/v1/namespaces/${NS}/leases/bashible-server`,
  );
  const pid = Number(l.spec?.holderIdentity?.split("_")[1]);
  return procs.has(pid) ? pid : undefined;
};

await startServer();
await startServer();
await registerAPIService(cp, port, inputs.caPem);
const first = await until("the first checksum written", secretChecksum);

// Nodes of group worker, each as the agent does it: a watch resumed from its last
// resourceVersion (relist on 410), and a poller asking for "not older than" what it has.
const abort = new AbortController();
t.teardown(() => abort.abort());
await cp.kubectl(["apply", "-f", "-"], {
  input: JSON.stringify({
    apiVersion: "v1",
    kind: "List",
    items: [1, 2, 3].map((i) => ({
      apiVersion: "v1",
      kind: "Node",
      metadata: { name: `worker-${i}`, labels: { "node.deckhouse.io/group": "worker" } },
    })),
  }),
});
interface Observer {
  name: string;
  seen: string[];
}
const observers: Observer[] = [];
for (const i of [1, 2, 3]) {
  const client = new KubeClient(await loadKubeconfig((await cp.mintNode(`worker-${i}`)).kubeconfig));
  t.teardown(() => client.close());
  const watcher: Observer = { name: `worker-${i} watch`, seen: [] };
  observers.push(watcher);
  void (async () => {
    let rv: string | undefined;
    while (!abort.signal.aborted) {
      try {
        for await (const ev of client.watch<{ checksum: string; metadata: { resourceVersion: string } }>(
          `${API}/nodegroupbundles`,
          { fieldSelector: "metadata.name=worker", resourceVersion: rv, timeoutSeconds: 30, signal: abort.signal },
        )) {
          rv = ev.object.metadata.resourceVersion;
          if (ev.type === "ADDED" || ev.type === "MODIFIED") watcher.seen.push(ev.object.checksum);
        }
      } catch (err) {
        if (isGone(err)) rv = undefined;
        await new Promise((r) => setTimeout(r, 100));
      }
    }
  })();
  const poller: Observer = { name: `worker-${i} poll`, seen: [] };
  observers.push(poller);
  void (async () => {
    let rv: string | undefined;
    while (!abort.signal.aborted) {
      try {
        const b = await client.request<{ checksum: string; metadata: { resourceVersion: string } }>(
          "GET",
          `${API}/nodegroupbundles/worker`,
          { query: { resourceVersion: rv }, timeoutMs: 5000, signal: abort.signal },
        );
        rv = b.metadata.resourceVersion;
        if (poller.seen.at(-1) !== b.checksum) poller.seen.push(b.checksum);
      } catch (err) {
        // 503/504 while a replica dies or catches up: ask again.
        if (!(err instanceof KubeStatusError) && !abort.signal.aborted) await new Promise((r) => setTimeout(r, 100));
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  })();
}
await until("every node has the first checksum", async () => observers.every((o) => o.seen.includes(first)));

const order = [first];
for (const round of [1, 2, 3]) {
  t.test(`round ${round}: an input changes, the leader dies, the other replica takes over`, async (t) => {
    const pid = await until("a leader among the processes", leaderPid);
    await cp.kubectl([
      "patch",
      "nodegroupconfiguration",
      "sysctl-tuning",
      "--type=merge",
      "-p",
      JSON.stringify({ spec: { content: `echo round ${round}\n` } }),
    ]);
    await new Promise((r) => setTimeout(r, Math.floor(Math.random() * 40)));
    const killedAt = Date.now();
    procs.get(pid)!.kill("SIGKILL");
    await startServer();
    const previous = order.at(-1);
    const next = await until("a new checksum in the Secret", async () => {
      const c = await secretChecksum();
      return c !== previous ? c : undefined;
    });
    const tookMs = Date.now() - killedAt;
    t.ok(tookMs < 15_000, `writes taken over ${tookMs} ms after the kill`);
    order.push(next);
    const newLeader = await until("a leader", leaderPid);
    t.not(newLeader, pid, "another process leads");
    await until("every node has the new checksum", async () => observers.every((o) => o.seen.includes(next)));
    t.pass(`all ${observers.length} observers have it`);
  });
}

t.test("no node saw a checksum go back", async (t) => {
  for (const o of observers) {
    const idx = o.seen.map((c) => order.indexOf(c));
    t.notOk(idx.includes(-1), `${o.name}: only checksums the Secret held (${idx.join(" ")})`);
    t.ok(
      idx.every((v, i) => i === 0 || v >= idx[i - 1]!),
      `${o.name}: in order, never back (${idx.join(" ")})`,
    );
  }
  abort.abort();
});
