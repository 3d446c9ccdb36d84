// cluster/deploy/ applied with the real kubectl to a real control plane, as an operator would,
// then the two replicas of its Deployment stood in for by two server processes (there is no
// container runtime on this side) that run with the Deployment's arguments and the
// ServiceAccount's own token: the aggregated API answers, the leader writes its Secrets and
// Leases, and the update controllers approve and drain a node, which proves the RBAC is enough.
import t from "tap";
import { execFileSync, spawn } from "node:child_process";
import { open, readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parse } from "yaml";
import { CONFIGMAPS, NODE_KEYS, SECRETS } from "../../bundles/names.ts";
import { BOOTSTRAP_GROUP } from "../../cluster/bootstrap-scope.ts";
import { KubeClient } from "../../lib/kube/client.ts";
import { loadKubeconfig } from "../../lib/kube/kubeconfig.ts";
import { getSecret, type KubeObject } from "../../lib/kube/api.ts";
import { MAIN } from "../../scripts/lib/cli.ts";
import { withControlPlane } from "../../scripts/lib/control-plane-fixture.ts";
import { prepareBundleServer, registerAPIService } from "../../scripts/lib/bundle-server.ts";
import { freePort } from "../../scripts/lib/control-plane.ts";
import { annotate, createNode, createPod, startKubeletSim } from "../../scripts/lib/sim-nodes.ts";
import { pino } from "pino";
import { until } from "../../scripts/lib/until.ts";

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const NS = "d8-cloud-instance-manager";
const K = NODE_KEYS;

const cp = await withControlPlane(t, {
  controllerManager: { controllers: ["serviceaccount", "disruption"] },
  extraApiserverArgs: ["--enable-aggregator-routing=false"],
});
const inputs = await prepareBundleServer(cp);

const get = <T = KubeObject>(p: string) => cp.admin.request<T>("GET", p);

t.test("kubectl applies the CRDs and cluster/deploy as they are", async (t) => {
  t.match(await cp.kubectl(["apply", "-f", path.join(REPO, "cluster/crds")]), /nodegroups.deckhouse.io/);
  const out = await cp.kubectl(["apply", "-k", path.join(REPO, "cluster/deploy")]);
  for (const what of [
    "namespace/d8-cloud-instance-manager",
    "serviceaccount/bashible-server",
    "deployment.apps/bashible-server",
    "service/bashible-api",
    "poddisruptionbudget.policy/bashible-server",
    "apiservice.apiregistration.k8s.io/v1alpha1.bashible.deckhouse.io",
    "clusterrole.rbac.authorization.k8s.io/bashible:server",
  ])
    t.match(out, what);
  const d = await get<{
    spec: {
      replicas: number;
      template: { spec: { nodeSelector: Record<string, string>; tolerations: { key: string }[] } };
    };
  }>(`/apis/apps/v1/namespaces/${NS}/deployments/bashible-server`);
  t.equal(d.spec.replicas, 2, "two replicas");
  t.same(d.spec.template.spec.nodeSelector, { "node-role.kubernetes.io/control-plane": "" }, "on masters");
  t.ok(d.spec.template.spec.tolerations.some((x) => x.key === "node-role.kubernetes.io/control-plane"));
  const pdb = await get<{ spec: { minAvailable: number } }>(
    `/apis/policy/v1/namespaces/${NS}/poddisruptionbudgets/bashible-server`,
  );
  t.equal(pdb.spec.minAvailable, 1, "one replica always up");
  // The operator's part: the serving certificate and the APIService's CA.
  await cp.kubectl([
    "create",
    "secret",
    "tls",
    "bashible-api-tls",
    "-n",
    NS,
    `--cert=${inputs.serving.cert}`,
    `--key=${inputs.serving.key}`,
  ]);
  const patch = JSON.stringify({ spec: { caBundle: Buffer.from(inputs.caPem).toString("base64") } });
  await cp.kubectl(["patch", "apiservice", "v1alpha1.bashible.deckhouse.io", "--type=merge", "-p", patch]);
  await cp.kubectl(["apply", "-k", path.join(REPO, "cluster/deploy")]);
  const svc = await get<{ spec: { caBundle?: string } }>(
    "/apis/apiregistration.k8s.io/v1/apiservices/v1alpha1.bashible.deckhouse.io",
  );
  t.ok(svc.spec.caBundle, "applying again keeps the caBundle");
  // What the kubelet serving approver reads and writes, as the ServiceAccount.
  const as = ["--as", `system:serviceaccount:${NS}:bashible-server`];
  for (const args of [
    ["get", "services/kubernetes", "-n", "default"],
    ["list", "endpointslices.discovery.k8s.io", "-n", "default"],
    ["watch", "certificatesigningrequests.certificates.k8s.io"],
    ["update", "certificatesigningrequests.certificates.k8s.io", "--subresource=approval"],
  ])
    t.match(await cp.kubectl(["auth", "can-i", ...args, ...as]), /^yes/, `the server may ${args.join(" ")}`);
});

t.test("the Deployment's two replicas, as processes with its arguments and its ServiceAccount", async (t) => {
  const token = (await cp.kubectl(["create", "token", "bashible-server", "-n", NS, "--duration=1h"])).trim();
  const kubeconfig = await cp.writeKubeconfig(path.join(cp.dir, "bashible-server.kubeconfig"), { token });
  // The mounted Secret bashible-api-tls.
  const tls = await getSecret(cp.admin, NS, "bashible-api-tls");
  const files: Record<string, string> = {};
  for (const k of ["tls.crt", "tls.key"]) {
    files[k] = path.join(cp.dir, `mounted-${k}`);
    await writeFile(files[k], Buffer.from((tls.data as Record<string, string>)[k]!, "base64"), { mode: 0o600 });
  }
  const manifest = parse(await readFile(path.join(REPO, "cluster/deploy/deployment.yaml"), "utf8")) as {
    spec: { template: { spec: { containers: { args: string[] }[] } } };
  };
  const port = await freePort();
  const args = manifest.spec.template.spec.containers[0]!.args.map((a) =>
    a === "--in-cluster"
      ? `--kubeconfig=${kubeconfig}`
      : a
          .replace("/etc/bashible/tls/tls.crt", files["tls.crt"]!)
          .replace("/etc/bashible/tls/tls.key", files["tls.key"]!)
          .replace("--port=9443", `--port=${port}`),
  );
  for (const pod of ["bashible-server-a", "bashible-server-b"]) {
    const out = await open(path.join(cp.dir, `${pod}.log`), "a");
    const child = spawn(
      process.execPath,
      [MAIN, ...args, "--address=127.0.0.1", "--reuse-port", "--eviction-retry=0.5"],
      {
        stdio: ["ignore", out.fd, out.fd],
        env: { ...process.env, POD_NAME: pod },
      },
    );
    await out.close();
    t.teardown(() => void child.kill("SIGTERM"));
  }
  // No pods behind the Service here: point it at the processes.
  await cp.kubectl(["delete", "service", "bashible-api", "-n", NS]);
  await registerAPIService(cp, port, inputs.caPem);

  const yaml = await cp.kubectl(["get", "nodegroupbundles", "worker", "-o", "yaml"]);
  t.match(yaml, /kind: NodeGroupBundle/, "the aggregated API answers");

  // The NodeGroup conversion webhook as deployed: the operator's caBundle patch (and here the
  // processes' port), then a v1alpha2 Hybrid group the provider configuration lists reads as
  // CloudPermanent, which needs the ServiceAccount to read that Secret.
  const conversion = {
    spec: {
      conversion: {
        webhook: {
          clientConfig: { caBundle: Buffer.from(inputs.caPem).toString("base64"), service: { port } },
        },
      },
    },
  };
  await cp.kubectl(["patch", "crd", "nodegroups.deckhouse.io", "--type=merge", "-p", JSON.stringify(conversion)]);
  await cp.kubectl(["apply", "-f", "-"], {
    input: JSON.stringify({
      apiVersion: "v1",
      kind: "List",
      items: [
        {
          apiVersion: "v1",
          kind: "Secret",
          metadata: { name: "d8-provider-cluster-configuration", namespace: "kube-system" },
          stringData: { "cloud-provider-cluster-configuration.yaml": "nodeGroups:\n- name: front\n" },
        },
        {
          apiVersion: "deckhouse.io/v1alpha2",
          kind: "NodeGroup",
          metadata: { name: "front" },
          spec: { nodeType: "Hybrid" },
        },
      ],
    }),
  });
  t.equal(
    await cp.kubectl(["get", "nodegroups.v1.deckhouse.io", "front", "-o", "jsonpath={.spec.nodeType}"]),
    "CloudPermanent",
    "converted by the deployed server under its ServiceAccount",
  );
  const sum = await until("checksums written by the leader", async () => {
    const s = await getSecret(cp.admin, NS, SECRETS.checksums);
    const v = (s.data as Record<string, string> | undefined)?.worker;
    return v ? Buffer.from(v, "base64").toString() : undefined;
  });
  await until("the manual-bootstrap Secret", () => getSecret(cp.admin, NS, "manual-bootstrap-for-worker"));
  for (const lease of ["bashible-server", "bashible-controllers"]) {
    const l = await get<{ spec: { holderIdentity: string } }>(
      `/apis/coordination.k8s.io/v1/namespaces/${NS}/leases/${lease}`,
    );
    t.match(l.spec.holderIdentity, /^bashible-server-[ab]_/, `${lease} held by a replica, named after its pod`);
  }

  // The update controllers under the ServiceAccount: approve, drain (evict), approve the disruption.
  // A wait that gives up quotes what the replicas logged last (which one led, what it did).
  const replicasLog = async () => {
    const tails = await Promise.all(
      ["bashible-server-a", "bashible-server-b"].map(async (pod) => {
        const text = await readFile(path.join(cp.dir, `${pod}.log`), "utf8").catch(() => "");
        return `--- ${pod}.log (last lines)\n${text.split("\n").slice(-40).join("\n")}`;
      }),
    );
    return tails.join("\n");
  };
  const controllersDo = <T>(what: string, probe: () => Promise<T | undefined | false>) =>
    until(what, probe).catch(async (err: Error) => {
      throw new Error(`${err.message}\n${await replicasLog()}`);
    });
  const kubelet = startKubeletSim(cp.admin, pino({ level: "silent" }));
  t.teardown(() => kubelet.stop());
  await createNode(cp.admin, "worker-1", "worker");
  await until("ServiceAccount", () => get("/api/v1/namespaces/default/serviceaccounts/default"));
  await createPod(cp.admin, "default", "app", "worker-1");
  await annotate(cp.admin, "worker-1", { [K.waitingForApproval]: "" });
  const ann = async () => (await get("/api/v1/nodes/worker-1")).metadata.annotations ?? {};
  await controllersDo("approved", async () => (await ann())[K.approved] !== undefined);
  await annotate(cp.admin, "worker-1", { [K.disruptionRequired]: "" });
  await controllersDo("drained and approved", async () => (await ann())[K.disruptionApproved] !== undefined);
  t.equal((await ann())[K.drained], "bashible");
  const pods = await cp.admin.request<{ items: { metadata: { deletionTimestamp?: string } }[] }>(
    "GET",
    "/api/v1/namespaces/default/pods",
  );
  t.same(pods.items, [], "the pod was evicted");
  await annotate(cp.admin, "worker-1", { [K.checksum]: sum });
  await controllersDo("finished", async () => (await ann())[K.approved] === undefined);
  const ng = await controllersDo("NodeGroup status", async () => {
    const o = await get<{ status?: { upToDate?: number } }>("/apis/deckhouse.io/v1/nodegroups/worker");
    return o.status?.upToDate === 1 ? o : undefined;
  });
  t.ok(ng, "status written");
  const events = await cp.kubectl(["get", "events", "-n", "default", "--field-selector=involvedObject.name=worker-1"]);
  t.match(events, /BashibleUpdateApproved/);
  t.match(events, /BashibleDrained/);

  // The kubelet client approver under the ServiceAccount: a worker token's bootstrap CSR for a
  // new name is approved and its group recorded where the admission policy reads it.
  const bootToken = await cp.mintBootstrapToken({ extraGroups: [BOOTSTRAP_GROUP, `${BOOTSTRAP_GROUP}:worker`] });
  const booting = new KubeClient(
    await loadKubeconfig(await cp.writeKubeconfig(path.join(cp.dir, "boot.kubeconfig"), { token: bootToken })),
  );
  t.teardown(() => booting.close());
  const csrFile = path.join(cp.dir, "worker-9.csr");
  execFileSync("openssl", [
    "req",
    "-new",
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
    "-keyout",
    path.join(cp.dir, "worker-9.key"),
    "-out",
    csrFile,
    "-subj",
    "/O=system:nodes/CN=system:node:worker-9",
  ]);
  await booting.request("POST", "/apis/certificates.k8s.io/v1/certificatesigningrequests", {
    body: {
      apiVersion: "certificates.k8s.io/v1",
      kind: "CertificateSigningRequest",
      metadata: { name: "worker-9-boot" },
      spec: {
        request: (await readFile(csrFile)).toString("base64"),
        signerName: "kubernetes.io/kube-apiserver-client-kubelet",
        usages: ["digital signature", "client auth"],
      },
    },
  });
  const approved = await until("the bootstrap CSR approved by the ServiceAccount", async () => {
    const c = await get<{ status?: { conditions?: { type: string; message?: string }[] } }>(
      "/apis/certificates.k8s.io/v1/certificatesigningrequests/worker-9-boot",
    );
    return c.status?.conditions?.find((x) => x.type === "Approved");
  });
  t.match(approved.message, /bootstrap token of node group worker/);
  const cm = await get<{ data?: Record<string, string> }>(
    `/api/v1/namespaces/${NS}/configmaps/${CONFIGMAPS.nodeGroups}`,
  );
  t.equal(cm.data?.["worker-9"], "worker", "the group recorded for the admission policy");
});
