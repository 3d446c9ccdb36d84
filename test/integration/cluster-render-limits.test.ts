// The server never serves a bundle its nodes would refuse, on a real kube-apiserver: 1001
// NodeUsers, or 40 NodeGroupConfigurations of 250 kB (a 9.5 MB bundle), keep the group on its
// last good bundle (the checksums Secret too), with a Warning Event on the NodeGroup naming the
// limit; back within the limit, the group renders again. What is served is what the agent accepts.
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
import { NAMESPACE, SECRETS } from "../../bundles/names.ts";
import { MAX_NODE_USERS } from "../../bundles/steps/node-users.ts";
import { acceptBundle } from "../../bundles/verify.ts";
import { until } from "../../scripts/lib/until.ts";

const cp = await withControlPlane(t);
await installCrds(cp.admin);
const post = (p: string, body: object) => cp.admin.request("POST", p, { body });
const USERS = "/apis/deckhouse.io/v1/nodeusers";
const NGCS = "/apis/deckhouse.io/v1alpha1/nodegroupconfigurations";
await post("/api/v1/namespaces", { apiVersion: "v1", kind: "Namespace", metadata: { name: NAMESPACE } });
const context = parse(await readFile(path.join(EXAMPLE_DIR, "context.yaml"), "utf8")) as Record<string, unknown>;
await createSecret(cp.admin, {
  apiVersion: "v1",
  kind: "Secret",
  metadata: { name: SECRETS.context, namespace: NAMESPACE },
  stringData: { [SECRETS.contextKey]: JSON.stringify(context) },
});
await post("/apis/deckhouse.io/v1/nodegroups", {
  apiVersion: "deckhouse.io/v1",
  kind: "NodeGroup",
  metadata: { name: "worker" },
  spec: { nodeType: "Static" },
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
  log: pino({ level: "silent" }),
  kube: cp.admin,
  tls: { cert: await readFile(serving.cert), key: await readFile(serving.key) },
  host: "127.0.0.1",
  port: 0,
});
t.teardown(() => app.stop());

/** What a node downloads, checked as the agent checks it. */
const served = () => {
  const e = app.store.get("nodegroupbundles", "worker");
  return e ? acceptBundle(e.json, "the server") : undefined;
};
const secretChecksum = async () => {
  const v = ((await getSecret(cp.admin, NAMESPACE, SECRETS.checksums)).data as Record<string, string>).worker;
  return v ? Buffer.from(v, "base64").toString() : undefined;
};
const warning = (pattern: RegExp) =>
  until(`a Warning Event on NodeGroup worker matching ${pattern}`, async () =>
    (
      await list<{ reason: string; type: string; message: string; involvedObject: { kind: string; name: string } }>(
        cp.admin,
        "/api/v1/namespaces/default/events",
      )
    ).items.find((e) => e.involvedObject.kind === "NodeGroup" && e.type === "Warning" && pattern.test(e.message)),
  );
/** Runs `f` over `items` a few at a time (thousands of objects, without thousands of sockets). */
async function batched(items: string[], f: (x: string) => Promise<unknown>): Promise<void> {
  for (let i = 0; i < items.length; i += 50) await Promise.all(items.slice(i, i + 50).map(f));
}

const first = await until("worker served", async () => served()?.checksum);
await until("the Secret names it", async () => (await secretChecksum()) === first);

const userCount = (b: ReturnType<typeof served>) =>
  (b?.steps.find((s) => s.kind === "NodeUsers")?.spec as { users: unknown[] } | undefined)?.users.length;
const nodeUser = (i: number) => ({
  apiVersion: "deckhouse.io/v1",
  kind: "NodeUser",
  metadata: { name: `u${i}` },
  spec: { uid: 2000 + i, sshPublicKeys: [], isSudoer: false, nodeGroups: ["worker"] },
});

t.test(
  `${MAX_NODE_USERS + 1} NodeUsers: the group keeps its last good bundle and the NodeGroup says why`,
  async (t) => {
    const names = Array.from({ length: MAX_NODE_USERS }, (_, i) => `u${i}`);
    await batched(names, (name) => post(USERS, nodeUser(Number(name.slice(1)))));
    const good = await until("1000 users served", async () =>
      userCount(served()) === MAX_NODE_USERS ? served() : undefined,
    );
    t.pass(`${MAX_NODE_USERS} users render and the agent's check accepts them`);
    await until("the Secret names it", async () => (await secretChecksum()) === good.checksum);

    await post(USERS, nodeUser(MAX_NODE_USERS));
    const ev = await warning(/1001 NodeUsers select node group worker/);
    t.equal(ev.reason, "BashibleRenderFailed");
    t.match(ev.message, `a bundle carries at most ${MAX_NODE_USERS}`);
    t.match(ev.message, /nodes keep the last good bundle/);
    t.equal(served()?.checksum, good.checksum, "still serving the last good bundle, which the agent accepts");
    t.equal(await secretChecksum(), good.checksum, "the checksums Secret stays");

    await cp.admin.request("DELETE", `${USERS}/u0`);
    const next = await until("renders again without u0", async () => {
      const b = served();
      return b && b.checksum !== good.checksum ? b : undefined;
    });
    t.equal(userCount(next), MAX_NODE_USERS, "back within the limit, the group moves on");
    await batched([...names.slice(1), `u${MAX_NODE_USERS}`], (name) => cp.admin.request("DELETE", `${USERS}/${name}`));
  },
);

t.test("40 NodeGroupConfigurations of 250 kB: held back the same way, the largest named", async (t) => {
  await until("back to no users", async () => userCount(served()) === 0);
  const scripts = () => served()?.steps.filter((s) => s.kind === "Script").length;
  const ngc = (name: string) =>
    post(NGCS, {
      apiVersion: "deckhouse.io/v1alpha1",
      kind: "NodeGroupConfiguration",
      metadata: { name },
      spec: { weight: 200, nodeGroups: ["worker"], bundles: ["*"], content: `# ${"x".repeat(250_000 - 3)}\n` },
    });
  const names = Array.from({ length: 40 }, (_, i) => `big-${String(i).padStart(2, "0")}.sh`);
  await batched(names.slice(0, 33), ngc);
  // 33 fit (8.25 MB); from 34 on none does, so no render in between can be served.
  const good = await until("33 of them (8.25 MB) served", async () => (scripts() === 33 ? served() : undefined));
  await until("the Secret names it", async () => (await secretChecksum()) === good.checksum);

  await batched(names.slice(33), ngc);
  const ev = await warning(/its bundle would be 9\.\d MiB, over the 8\.0 MiB a node accepts/);
  t.match(ev.message, /the largest parts: NodeGroupConfiguration\/big-\d\d\.sh/);
  t.equal(served()?.checksum, good.checksum, "the last good bundle stays served");
  t.equal(await secretChecksum(), good.checksum, "and named by the Secret");

  await batched(names.slice(30), (name) => cp.admin.request("DELETE", `${NGCS}/${name}`));
  const next = await until("renders again with 30 of them", async () => (scripts() === 30 ? served() : undefined));
  t.pass("back within the limit (7.5 MB), served and accepted by the agent's check");
  await until("and the Secret names it", async () => (await secretChecksum()) === next.checksum);
});
