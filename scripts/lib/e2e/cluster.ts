// The cluster side of the end-to-end scenario, everything real and on this machine:
//   - etcd, kube-apiserver and kube-controller-manager (CSR signing with the cluster CA; renewals
//     of kubelet client certificates approved by it; bootstrap client CSRs NOT: kubeadm's
//     nodeclient binding is left out, as cluster/deploy/kubelet-bootstrap-rbac.yaml says, and the
//     bundle server's kubelet client approver decides them), kube-apiserver listening on 0.0.0.0
//     so a node in its own network namespace reaches it over its veth;
//   - the CRDs, the server's RBAC, the kubelet bootstrap RBAC and the admission policies from
//     cluster/deploy, the context Secret;
//   - `bashible server` from the server image (`npm run image`'s code, built from the same dist/),
//     run by containerd on this machine as the Deployment's pod runs it (its user, a read-only
//     root, no capabilities, its credentials mounted read-only), registered as the aggregated
//     API: writers, update controllers and the fencing controller on;
//   - a real OCI registry (docker-registry, loopback only) holding the registry packages
//     `npm run package` built, behind the registry-packages proxy (listening on 0.0.0.0, its
//     certificate issued by the cluster CA, as nodes verify it with the bundle's CA);
//   - NodeGroup `worker` (Static, fencing Watchdog; the machines' network is the cluster's
//     internal one), a NodeUser, one NodeGroupConfiguration (the bridge CNI); bootstrap tokens may read Nodes (the
//     hostname uniqueness check), as kubeadm grants its own.
// Nodes reach the API server and the proxy as CONTROL_PLANE_HOST (both certificates carry the
// name; a node maps it to its veth's host address in /etc/hosts) and nothing else: etcd, the
// registry, the bundle server and kube-controller-manager listen on loopback.
import type { ChildProcess } from "node:child_process";
import { generateKeyPairSync, randomUUID } from "node:crypto";
import { chmod, chown, mkdir, readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import { pino } from "pino";
import { parse, stringify } from "yaml";
import { installCrds } from "../../../cluster/crds/install.ts";
import { startPackagesProxy, type PackagesProxy } from "../../../cluster/packages-proxy/server.ts";
import { CONTEXT_KEY, CONTEXT_SECRET } from "../../../cluster/sources/kube.ts";
import { NAMESPACE, SECRETS } from "../../../bundles/names.ts";
import { getSecret } from "../../../lib/kube/api.ts";
import type { BuiltPackage } from "../../package.ts";
import { registerAPIService } from "../bundle-server.ts";
import { startRegistry, type Registry } from "../registry.ts";
import { startHostContainerd } from "../containerd-host.ts";
import { buildImage, IMAGE_NAME, IMAGE_UID } from "../../image.ts";
import { type ControlPlane, freePort, startControlPlane } from "../control-plane.ts";
import { until } from "../until.ts";
import { createCA, issueCert } from "../pki.ts";
import { VM_NETWORK } from "../vm-node.ts";
import { PAUSE_IMAGE } from "./images.ts";

/** The name nodes dial for the API server and the registry-packages proxy. */
export const CONTROL_PLANE_HOST = "control-plane.e2e.bashible.test";
export const GROUP = "worker";
export const PACKAGES_REPOSITORY = "deckhouse/packages";
export const NODE_USER = "e2e-operator";
/** The network the machines' veths are in (each a /30 of it). */
export const NODE_NETWORK = "10.213.0.0/16";

/** The bridge network pods on the node get (host-local IPAM). */
export const POD_SUBNET = "10.244.0.0/24";

/** An OpenSSH public key line for a fresh ed25519 key. */
export function sshPublicKey(comment: string): string {
  const { publicKey } = generateKeyPairSync("ed25519");
  const raw = publicKey.export({ format: "der", type: "spki" }).subarray(-32);
  const str = (b: Buffer) => Buffer.concat([Buffer.from([0, 0, 0, b.length]), b]);
  const blob = Buffer.concat([str(Buffer.from("ssh-ed25519")), str(raw)]);
  return `ssh-ed25519 ${blob.toString("base64")} ${comment}`;
}

export interface E2eCluster {
  cp: ControlPlane;
  /** `ctr run` of the server's container: it exits when the container does. */
  server: ChildProcess;
  registry: Registry;
  proxy: PackagesProxy;
  /** host:port as nodes dial them. */
  apiEndpoint: string;
  proxyEndpoint: string;
  /** The bundle server's log (pino JSON lines: the container's stdout and stderr). */
  serverLog: string;
  /** The NodeUser's first key. */
  userKey: string;
  apply(obj: unknown): Promise<void>;
  /** bootstrap.sh from Secret d8-cloud-instance-manager/manual-bootstrap-for-worker, once it exists. */
  bootstrapScript(): Promise<string>;
  /**
   * Another agent release for every node: pushed to the registry and pinned in the cluster's
   * context, as an operator's upgrade of the cluster side does. Returns its manifest digest.
   */
  publishAgent(p: BuiltPackage): Promise<string>;
  /** The checksum Secret's value for the group. */
  groupChecksum(): Promise<string | undefined>;
  stop(): Promise<void>;
}

/** A kubeconfig with its files' contents inside (a pod gets one file, not the paths of this machine). */
async function selfContainedKubeconfig(file: string): Promise<string> {
  const kc = parse(await readFile(file, "utf8")) as {
    clusters: { cluster: Record<string, string> }[];
    users: { user: Record<string, string> }[];
  };
  const embed = async (o: Record<string, string>, key: string) => {
    const p = o[key];
    if (p === undefined) return;
    o[`${key}-data`] = (await readFile(p)).toString("base64");
    delete o[key];
  };
  for (const c of kc.clusters) await embed(c.cluster, "certificate-authority");
  for (const u of kc.users) {
    await embed(u.user, "client-certificate");
    await embed(u.user, "client-key");
  }
  return stringify(kc);
}

/** NodeGroup `worker`; `spec` replaces whole fields of the spec (disruptions, update, …). */
export function nodeGroup(kubelet: Record<string, unknown> = {}, spec: Record<string, unknown> = {}): unknown {
  return {
    apiVersion: "deckhouse.io/v1",
    kind: "NodeGroup",
    metadata: { name: GROUP },
    spec: {
      nodeType: "Static",
      disruptions: { approvalMode: "Automatic" },
      kubelet: { maxPods: 50, ...kubelet },
      fencing: { mode: "Watchdog" },
      nodeTemplate: { labels: { "e2e.bashible.test/role": "worker" } },
      ...spec,
    },
  };
}

export function nodeUser(keys: string[]): unknown {
  return {
    apiVersion: "deckhouse.io/v1",
    kind: "NodeUser",
    metadata: { name: NODE_USER },
    spec: {
      uid: 1901,
      sshPublicKeys: keys,
      // `openssl passwd -6 -salt e2esalt e2e-password`
      passwordHash: "$6$e2esalt$eiyQKA2xKGckUJD1pbp/M.0jfnw5cLCERafvgBVYQyhtcshY8BUUv4liqePBc4Nvv57m2SkvPC1BHxOGbWIi..",
      isSudoer: true,
      nodeGroups: [GROUP],
    },
  };
}

/** The bridge CNI configuration, written by a NodeGroupConfiguration script as clusters ship a CNI. */
export const CNI_CONFIGURATION = {
  apiVersion: "deckhouse.io/v1alpha1",
  kind: "NodeGroupConfiguration",
  metadata: { name: "e2e-bridge-cni" },
  spec: {
    weight: 45,
    nodeGroups: [GROUP],
    bundles: ["*"],
    content: `# The pod network: one bridge on the node, addresses from host-local.
mkdir -p /etc/cni/net.d
cat >/etc/cni/net.d/.10-bridge.conflist.new <<'EOF'
{
  "cniVersion": "0.4.0",
  "name": "e2e-bridge",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "${POD_SUBNET}" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    }
  ]
}
EOF
mv -f /etc/cni/net.d/.10-bridge.conflist.new /etc/cni/net.d/10-bridge.conflist
`,
  },
};

export async function startE2eCluster(o: {
  dir: string;
  /** The agent build (`dist/`) whose `bashible server` runs the cluster side. */
  dist: string;
  packages: BuiltPackage[];
  log?: (line: string) => void;
  /** Also run kube-scheduler (a fleet's Deployments need one). */
  scheduler?: boolean;
  /** More `bashible server` flags (the fleet's shortened fencing timings). */
  serverArgs?: string[];
}): Promise<E2eCluster> {
  const say = o.log ?? (() => undefined);
  const stops: (() => Promise<void>)[] = [];
  const stop = async () => {
    for (const s of stops.reverse()) await s().catch(() => undefined);
  };
  try {
    say("control plane: etcd, kube-apiserver (0.0.0.0), kube-controller-manager");
    const cp = await startControlPlane({
      parentDir: o.dir,
      bindAddress: "0.0.0.0",
      serverNames: [CONTROL_PLANE_HOST],
      controllerManager: true,
      // The kubelet's serving certificate is verified, as a production cluster does: `kubectl
      // logs` works only once the approver approved it and kube-controller-manager signed it.
      verifyKubeletServing: true,
      ...(o.scheduler ? { scheduler: true } : {}),
    });
    stops.push(() => cp.stop());
    const apply = async (obj: unknown) => {
      await cp.kubectl(["apply", "-f", "-"], { input: JSON.stringify(obj) });
    };
    const apiEndpoint = `${CONTROL_PLANE_HOST}:${new URL(cp.server).port}`;

    say("registry with the packages, registry-packages proxy (0.0.0.0)");
    const registry = await startRegistry({ parentDir: o.dir });
    stops.push(() => registry.stop());
    const packages: Record<string, { digest: string; repository: string }> = {};
    for (const p of o.packages) {
      const pushed = await registry.pushOciLayout(PACKAGES_REPOSITORY, p.dir);
      packages[p.name] = { digest: pushed.digest, repository: PACKAGES_REPOSITORY };
    }
    const pki = path.join(o.dir, "pki");
    await mkdir(pki, { recursive: true });
    const proxyCert = await issueCert(pki, "registry-packages-proxy", cp.ca, {
      cn: "registry-packages-proxy",
      dnsNames: [CONTROL_PLANE_HOST],
      ips: ["127.0.0.1"],
    });
    const proxyToken = `e2e-${randomUUID()}`;
    const proxy = await startPackagesProxy(
      {
        upstream: { url: registry.url },
        cacheDir: path.join(o.dir, "proxy-cache"),
        token: proxyToken,
        tls: { cert: await readFile(proxyCert.cert, "utf8"), key: await readFile(proxyCert.key, "utf8") },
        log: pino({ level: "info" }, pino.destination({ dest: path.join(o.dir, "packages-proxy.log"), sync: true })),
      },
      { host: "0.0.0.0" },
    );
    stops.push(() => proxy.close());
    const proxyEndpoint = `${CONTROL_PLANE_HOST}:${proxy.port}`;

    say("CRDs, RBAC, context, NodeGroup, NodeUser, NodeGroupConfiguration");
    await installCrds(cp.admin);
    await apply({ apiVersion: "v1", kind: "Namespace", metadata: { name: NAMESPACE } });
    const deploy = path.resolve(import.meta.dirname, "../../../cluster/deploy");
    for (const f of ["rbac.yaml", "fencing-rbac.yaml", "kubelet-bootstrap-rbac.yaml", "node-group-label-policy.yaml"]) {
      await cp.kubectl(["apply", "-f", path.join(deploy, f)]);
    }
    const agentVersion = o.packages.find((p) => p.name === "bashible")?.version;
    if (!agentVersion) throw new Error("the packages lack the agent (bashible)");
    const context = {
      clusterUUID: randomUUID(),
      kubernetesVersion: "1.34",
      apiserverEndpoints: [apiEndpoint],
      clusterCA: await readFile(cp.ca.cert, "utf8"),
      packagesProxy: { endpoints: [proxyEndpoint], token: proxyToken },
      images: { pause: PAUSE_IMAGE },
      // The machines' networks (scripts/lib/nspawn-node.ts and vm-node.ts: a /30 of one each):
      // 000_discover_node_ip picks the address in them, as a StaticClusterConfiguration's
      // internalNetworkCIDRs say.
      internalNetworkCIDRs: [NODE_NETWORK, VM_NETWORK],
      packages,
      agent: { package: "bashible", version: agentVersion },
    };
    const writeContext = () =>
      apply({
        apiVersion: "v1",
        kind: "Secret",
        metadata: { name: CONTEXT_SECRET, namespace: NAMESPACE },
        stringData: { [CONTEXT_KEY]: JSON.stringify(context) },
      });
    await writeContext();
    const userKey = sshPublicKey("e2e-operator@first");
    await apply(nodeGroup());
    await apply(nodeUser([userKey]));
    await apply(CNI_CONFIGURATION);

    say("bashible server from its image in containerd: aggregated API, writers, update and fencing controllers");
    const serverPki = path.join(o.dir, "bundle-server");
    await mkdir(serverPki, { recursive: true });
    const serverCA = await createCA(serverPki, "ca", "bashible-server-ca");
    const serving = await issueCert(serverPki, "serving", serverCA, {
      cn: "bashible-api",
      dnsNames: [`bashible-api.${NAMESPACE}.svc`, "localhost"],
      ips: ["127.0.0.1"],
    });
    // What the pod gets from its Secret volumes: the credentials, readable by the image's user.
    const secrets = path.join(serverPki, "secrets");
    await mkdir(path.join(secrets, "tls"), { recursive: true });
    const files = {
      kubeconfig: await selfContainedKubeconfig(cp.adminKubeconfig),
      "tls/tls.crt": await readFile(serving.cert, "utf8"),
      "tls/tls.key": await readFile(serving.key, "utf8"),
    };
    for (const [rel, content] of Object.entries(files)) {
      await writeFile(path.join(secrets, rel), content, { mode: 0o400 });
      await chown(path.join(secrets, rel), IMAGE_UID, IMAGE_UID);
    }
    for (const d of [secrets, path.join(secrets, "tls")]) {
      await chown(d, IMAGE_UID, IMAGE_UID);
      await chmod(d, 0o500);
    }
    const image = await buildImage({ dist: o.dist, out: path.join(o.dir, "server-image") });
    const containerd = await startHostContainerd(path.join(o.dir, "containerd"));
    stops.push(() => containerd.stop());
    const ref = await containerd.importLayout(image.dir, IMAGE_NAME);
    const serverLog = path.join(o.dir, "bashible-server.log");
    const serverPort = await freePort();
    // An id of its own: runc names the container's cgroup after it, and other end-to-end runs on
    // this machine run theirs at the same time ("container with given ID already exists").
    const serverId = `bashible-server-${randomUUID().slice(0, 8)}`;
    const server = await containerd.run({
      id: serverId,
      image: ref,
      // hostNetwork, as a control-plane static pod: the API server reaches it on loopback.
      netHost: true,
      mounts: [{ src: secrets, dst: "/etc/bashible" }],
      args: [
        "server",
        "--kubeconfig",
        "/etc/bashible/kubeconfig",
        "--address",
        "127.0.0.1",
        "--port",
        String(serverPort),
        "--tls-cert-file",
        "/etc/bashible/tls/tls.crt",
        "--tls-private-key-file",
        "/etc/bashible/tls/tls.key",
        "--log-format",
        "json",
        ...(o.serverArgs ?? []),
      ],
      logFile: serverLog,
    });
    stops.push(() => containerd.stopContainer(serverId));
    await registerAPIService(cp, serverPort, await readFile(serverCA.cert, "utf8")).catch(async (err) => {
      const log = (await readFile(serverLog, "utf8").catch(() => "")).slice(-3000);
      const state =
        server.exitCode !== null || server.signalCode ? `exited ${server.exitCode ?? server.signalCode}` : "running";
      throw new Error(
        `${(err as Error).message.split("\n")[0]}\nbashible server (container ${state}) log:\n${log}\ncontainerd:\n${containerd.log().slice(-2000)}`,
      );
    });

    const cluster: E2eCluster = {
      cp,
      server,
      registry,
      proxy,
      apiEndpoint,
      proxyEndpoint,
      serverLog,
      userKey,
      apply,
      bootstrapScript: () =>
        until(
          `Secret manual-bootstrap-for-${GROUP}`,
          async () => {
            const s = await getSecret(cp.admin, NAMESPACE, `manual-bootstrap-for-${GROUP}`);
            const b64 = (s.data as Record<string, string> | undefined)?.["bootstrap.sh"];
            return b64 ? Buffer.from(b64, "base64").toString("utf8") : undefined;
          },
          60_000,
          200,
        ),
      async publishAgent(p) {
        if (p.name !== "bashible") throw new Error(`publishAgent: ${p.name} is not the agent's package`);
        const pushed = await registry.pushOciLayout(PACKAGES_REPOSITORY, p.dir);
        context.packages.bashible = { digest: pushed.digest, repository: PACKAGES_REPOSITORY };
        context.agent = { package: "bashible", version: p.version };
        await writeContext();
        return pushed.digest;
      },
      async groupChecksum() {
        const s = await getSecret(cp.admin, NAMESPACE, SECRETS.checksums).catch(() => undefined);
        const v = (s?.data as Record<string, string> | undefined)?.[GROUP];
        return v ? Buffer.from(v, "base64").toString("utf8") : undefined;
      },
      stop,
    };
    return cluster;
  } catch (err) {
    await stop();
    throw err;
  }
}
