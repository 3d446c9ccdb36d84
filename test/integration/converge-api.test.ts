// The agent fetching its bundle from the real aggregated API (kube-apiserver → bundle server):
// with the kubelet's identity, with a group-scoped bootstrap token, against a wrong CA or a
// server that is down, and the daemon reacting to a change published by the server.
import t from "tap";
import { mkdir, readFile, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { startStack } from "../../scripts/lib/stack.ts";
import { bashible, bashibleDaemon, waitFor } from "../../scripts/lib/cli.ts";
import { sandbox } from "../../scripts/lib/bundle.ts";
import { freePort } from "../../scripts/lib/control-plane.ts";
import { createCA } from "../../scripts/lib/pki.ts";
import * as api from "../../lib/kube/api.ts";
import { requireRoot } from "../fixtures/root.ts";

await requireRoot("the agent sets root ownership on what it writes");

const stack = await startStack();
t.teardown(() => stack.stop());
const { cp } = stack;
const served = () => stack.served("one");
const kubeletNode = (name: string) => stack.kubeletNode(name);

async function nodeRoot(name: string): Promise<string> {
  const root = await sandbox("ID=debian\nVERSION_ID=12\n", name);
  await mkdir(path.join(root, "var/lib/bashible"), { recursive: true });
  await writeFile(path.join(root, "var/lib/bashible/first_run"), "");
  return root;
}

const applied = (root: string) =>
  readFile(path.join(root, "var/lib/bashible/configuration_checksum"), "utf8").then(
    (s) => s.trim(),
    () => "",
  );

t.test("with the kubelet's identity the agent fetches its group's bundle and applies it", async (t) => {
  const sum = await served();
  const n = await kubeletNode("api-1");
  const r = await bashible(["once", "--root", n.root, "--kubeconfig", n.kubeconfig]);
  t.equal(r.status, 0, r.stdout + r.stderr);
  t.equal(await applied(n.root), sum, "the served checksum is the applied one");
  t.equal(await readFile(path.join(n.root, "hello"), "utf8"), "one\n");
  t.equal(
    await readFile(path.join(n.root, "var/cache/registrypackages/bashible/digest"), "utf8").then((s) => s.trim()),
    stack.agentDigest,
    "the agent package came through the proxy, verified",
  );
  t.ok(await readFile(path.join(n.root, "opt/deckhouse/bin/bashible")), "and its install ran");
  const p = await bashible(["plan", "--root", n.root, "--kubeconfig", n.kubeconfig]);
  t.equal(p.status, 0, "in sync");
  t.match(p.stdout, /nodegroupbundles\/worker/);
});

t.test("before the kubelet: a bootstrap token of the node's group works, another group's is refused", async (t) => {
  const sum = await served();
  const root = await nodeRoot("api-2");
  const token = await cp.mintBootstrapToken({ extraGroups: ["system:bootstrappers:d8-node-manager:worker"] });
  await writeFile(path.join(root, "var/lib/bashible/bootstrap-token"), `${token}\n`);
  await writeFile(path.join(root, "var/lib/bashible/ca.crt"), await readFile(cp.ca.cert));
  const args = ["once", "--root", root, "--server", cp.server, "--node-name", "api-2", "--node-group", "worker"];
  const r = await bashible(args);
  t.equal(r.status, 0, r.stdout + r.stderr);
  t.equal(await applied(root), sum);
  t.notMatch(r.stdout + r.stderr, new RegExp(token.split(".")[1] as string), "the token never reaches the log");

  const other = await nodeRoot("api-3");
  const foreign = await cp.mintBootstrapToken({ extraGroups: ["system:bootstrappers:d8-node-manager:frontend"] });
  await writeFile(path.join(other, "var/lib/bashible/bootstrap-token"), foreign);
  await writeFile(path.join(other, "var/lib/bashible/ca.crt"), await readFile(cp.ca.cert));
  const refused = await bashible([
    "once",
    "--root",
    other,
    "--server",
    cp.server,
    "--node-name",
    "api-3",
    "--node-group",
    "worker",
  ]);
  t.equal(refused.status, 1);
  t.match(refused.stdout + refused.stderr, /403/);
  t.equal(await applied(other), "", "nothing applied");
});

t.test("a wrong CA or a server that is down: the last good bundle stays and status says why", async (t) => {
  const n = await kubeletNode("api-4");
  t.equal((await bashible(["once", "--root", n.root, "--kubeconfig", n.kubeconfig])).status, 0);
  const good = await applied(n.root);

  const otherCA = await createCA(path.dirname(n.kubeconfig), "other-ca");
  const wrongCA = path.join(path.dirname(n.kubeconfig), "wrong-ca.conf");
  await writeFile(wrongCA, (await readFile(n.kubeconfig, "utf8")).replace(cp.ca.cert, otherCA.cert));
  const r1 = await bashible(["once", "--root", n.root, "--kubeconfig", wrongCA, "--node-group", "worker"]);
  t.equal(r1.status, 0, "keeps running the last good bundle");
  t.match(r1.stdout, /TLS failure/);
  let st = JSON.parse((await bashible(["status", "--root", n.root, "--json"])).stdout);
  t.match(st.fetchError.message, /TLS failure/);
  t.equal(await applied(n.root), good);

  const down = path.join(path.dirname(n.kubeconfig), "down.conf");
  await writeFile(
    down,
    (await readFile(n.kubeconfig, "utf8")).replace(cp.server, `https://127.0.0.1:${await freePort()}`),
  );
  const r2 = await bashible(["once", "--root", n.root, "--kubeconfig", down]);
  t.equal(r2.status, 0);
  st = JSON.parse((await bashible(["status", "--root", n.root, "--json"])).stdout);
  t.match(st.fetchError.message, /refused/);
  t.equal(await applied(n.root), good);
  const human = await bashible(["status", "--root", n.root]);
  t.match(human.stdout, /fetch problem: .*refused/);
});

t.test("the daemon starts applying a change the server publishes within seconds", async (t) => {
  const n = await kubeletNode("api-5");
  const d = bashibleDaemon(["--root", n.root, "--kubeconfig", n.kubeconfig, "--tick", "3600"]);
  t.teardown(() => void d.kill("SIGKILL"));
  await waitFor("first converge", async () =>
    (await readFile(path.join(n.root, "hello"), "utf8").catch(() => "")) === "one\n" ? true : undefined,
  );
  // The first run's end as the cluster sees it: the checksum annotation, written in the same
  // patch that clears the approval annotations. Approving before that would be cleared.
  await waitFor("the first run to finish", async () => {
    const sum = await applied(n.root);
    const node = await api.getNode(cp.admin, "api-5");
    return sum && node.metadata.annotations?.["node.deckhouse.io/configuration-checksum"] === sum ? true : undefined;
  });
  // Later runs wait for approval: approve as the controller would.
  await api.patchNode(cp.admin, "api-5", { metadata: { annotations: { "update.node.deckhouse.io/approved": "" } } });
  await stack.setScript("two");
  await waitFor(
    "the change applied",
    async () => ((await readFile(path.join(n.root, "hello"), "utf8").catch(() => "")) === "two\n" ? true : undefined),
    15_000,
  );
  t.pass("applied after the server published it, without waiting for the minute tick");
  const exited = new Promise((r) => d.once("exit", r));
  d.kill("SIGTERM");
  t.equal(await exited, 0);
});

t.test(
  "kubelet.conf points at the local API proxy; when it is down, the endpoints of the last bundle serve",
  async (t) => {
    const n = await kubeletNode("api-6");
    t.equal((await bashible(["once", "--root", n.root, "--kubeconfig", n.kubeconfig])).status, 0, "first run");
    // The kubelet's files, where a node has them, with kubelet.conf aimed at a local API proxy
    // that is not running.
    const proxyDown = `https://127.0.0.1:${await freePort()}`;
    const id = path.dirname(n.kubeconfig);
    await mkdir(path.join(n.root, "etc/kubernetes/pki"), { recursive: true });
    await mkdir(path.join(n.root, "var/lib/kubelet/pki"), { recursive: true });
    await writeFile(path.join(n.root, "etc/kubernetes/pki/ca.crt"), await readFile(cp.ca.cert));
    await writeFile(
      path.join(n.root, "var/lib/kubelet/pki/kubelet-client-current.pem"),
      Buffer.concat([
        await readFile(path.join(id, "kubelet-client.crt")),
        await readFile(path.join(id, "kubelet-client.key")),
      ]),
    );
    await writeFile(
      path.join(n.root, "etc/kubernetes/kubelet.conf"),
      `apiVersion: v1
kind: Config
clusters: [{name: d8, cluster: {server: "${proxyDown}", certificate-authority: /etc/kubernetes/pki/ca.crt}}]
users: [{name: kubelet, user: {client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem, client-key: /var/lib/kubelet/pki/kubelet-client-current.pem}}]
contexts: [{name: kubelet@d8, context: {cluster: d8, user: kubelet}}]
current-context: kubelet@d8
`,
    );
    await rm(path.join(n.root, "var/lib/bashible/configuration_checksum"));
    await api.patchNode(cp.admin, "api-6", { metadata: { annotations: { "update.node.deckhouse.io/approved": "" } } });
    const r = await bashible(["once", "--root", n.root, "--log-format", "json"]);
    t.equal(r.status, 0, r.stdout + r.stderr);
    const current = JSON.parse(
      (await cp.admin.raw("GET", "/apis/bashible.deckhouse.io/v1alpha1/nodegroupbundles/worker")).body.toString(),
    ) as { checksum: string };
    t.equal(await applied(n.root), current.checksum, "applied through the fallback endpoint");
    const st = JSON.parse((await bashible(["status", "--root", n.root, "--json"])).stdout);
    t.notOk(st.fetchError, "the fetch succeeded");
  },
);

t.test("the daemon switches from the bootstrap token to kubelet.conf when it appears", async (t) => {
  const n = await kubeletNode("api-7");
  // A machine still joining has no Node yet (the kubelet registers it once it has its
  // certificate); one that exists would be another machine's name, which the join refuses.
  await cp.kubectl(["delete", "node", "api-7"]);
  const token = await cp.mintBootstrapToken({ extraGroups: ["system:bootstrappers:d8-node-manager:worker"] });
  await writeFile(path.join(n.root, "var/lib/bashible/bootstrap-token"), token);
  await writeFile(path.join(n.root, "var/lib/bashible/ca.crt"), await readFile(cp.ca.cert));
  const d = bashibleDaemon([
    "--root",
    n.root,
    "--server",
    cp.server,
    "--node-name",
    "api-7",
    "--node-group",
    "worker",
    "--tick",
    "1",
  ]);
  let out = "";
  d.stdout?.on("data", (c) => (out += c));
  d.stderr?.on("data", (c) => (out += c));
  t.teardown(() => void d.kill("SIGKILL"));
  // A first converge of every step: seconds, more on a loaded machine; the daemon's log is
  // quoted if it never comes.
  await waitFor("a converge with the token", async () => ((await applied(n.root)) ? true : undefined), 90_000).catch(
    (err: Error) => {
      throw new Error(`${err.message}; the daemon said:\n${out.slice(-4000)}`);
    },
  );
  // The kubelet came up: its kubeconfig appears (here the node identity the fixture minted).
  await mkdir(path.join(n.root, "etc/kubernetes"), { recursive: true });
  const id = path.dirname(n.kubeconfig);
  await writeFile(
    path.join(n.root, "etc/kubernetes/kubelet.conf"),
    `apiVersion: v1
kind: Config
clusters: [{name: d8, cluster: {server: "${cp.server}", certificate-authority-data: "${(await readFile(cp.ca.cert)).toString("base64")}"}}]
users: [{name: kubelet, user: {client-certificate-data: "${(await readFile(path.join(id, "kubelet-client.crt"))).toString("base64")}", client-key-data: "${(await readFile(path.join(id, "kubelet-client.key"))).toString("base64")}"}}]
contexts: [{name: k, context: {cluster: d8, user: kubelet}}]
current-context: k
`,
  );
  await waitFor(
    "credentials reloaded",
    () => (out.includes("cluster credentials reloaded") ? true : undefined),
    15_000,
  );
  t.match(out, /kubelet\.conf/, "now through kubelet.conf");
  t.notMatch(out, new RegExp(token.split(".")[1] as string), "the token never reaches the log");
});
