// A real control plane on loopback: etcd + kube-apiserver with TLS, RBAC + Node authorizer,
// NodeRestriction, bootstrap-token auth, service-account keys and the front-proxy flags an
// aggregated API needs. Used by the tap fixture and by the demo; every instance has its own
// directory and random ports, so several run side by side.
import { spawn, execFile, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { createServer } from "node:net";
import { get as httpsGet } from "node:https";
import { mkdtemp, mkdir, readFile, rm, writeFile, open } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { KubeClient } from "../../lib/kube/client.ts";
import { loadKubeconfig } from "../../lib/kube/kubeconfig.ts";
import { createSecret } from "../../lib/kube/api.ts";
import { createCA, createKeyPair, issueCert, type CertFiles } from "./pki.ts";

const execFileP = promisify(execFile);
const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");

export interface NodeIdentity {
  name: string;
  kubeconfig: string;
  cert: string;
  key: string;
}

export interface ControlPlane {
  dir: string;
  server: string;
  binDir: string;
  ca: CertFiles;
  frontProxyCA: CertFiles;
  frontProxyClient: CertFiles;
  adminKubeconfig: string;
  admin: KubeClient;
  /** A client certificate for `system:node:<name>` in `system:nodes`, with its kubeconfig. */
  mintNode(name: string): Promise<NodeIdentity>;
  /** A bootstrap token Secret in kube-system; returns `<id>.<secret>`. */
  mintBootstrapToken(opts?: { extraGroups?: string[]; ttlSeconds?: number }): Promise<string>;
  /** Writes a kubeconfig for arbitrary credentials against this API server. */
  writeKubeconfig(file: string, user: { cert?: string; key?: string; token?: string }): Promise<string>;
  kubectl(args: string[], opts?: { kubeconfig?: string; input?: string }): Promise<string>;
  /** The kube-controller-manager's log file, when one was started (StartOptions.controllerManager). */
  controllerManagerLog?: string;
  /**
   * A control-plane outage: kube-apiserver stops (SIGTERM, as a static pod's container is
   * stopped), etcd and the other components stay. startApiServer() starts it again with the same
   * flags, port and certificates and resolves once /readyz answers.
   */
  stopApiServer(): Promise<void>;
  startApiServer(): Promise<void>;
  stop(): Promise<void>;
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      srv.close(() => (typeof addr === "object" && addr ? resolve(addr.port) : reject(new Error("no port"))));
    });
  });
}

/** Builds (first time) or finds the upstream binaries; see scripts/test-binaries.sh. */
export async function binaries(): Promise<string> {
  const { stdout } = await execFileP("bash", [path.join(REPO, "scripts/test-binaries.sh")], {
    maxBuffer: 16 << 20,
    timeout: 60 * 60 * 1000,
  });
  return stdout.trim().split("\n").pop() ?? "";
}

const children = new Set<ChildProcess>();
process.on("exit", () => {
  for (const c of children) c.kill("SIGKILL");
});

async function startProcess(bin: string, args: string[], logFile: string): Promise<ChildProcess> {
  const log = await open(logFile, "a");
  const child = spawn(bin, args, { stdio: ["ignore", log.fd, log.fd] });
  await log.close();
  children.add(child);
  child.once("exit", () => children.delete(child));
  return child;
}

async function tail(file: string, bytes = 3000): Promise<string> {
  const text = await readFile(file, "utf8").catch(() => "");
  return text.slice(-bytes);
}

/** GET url (TLS not verified: a component's self-signed serving certificate) answers 200. */
function healthy(url: string): Promise<boolean> {
  return new Promise((resolve) => {
    const req = httpsGet(url, { rejectUnauthorized: false, timeout: 2000 }, (res) => {
      res.resume();
      resolve(res.statusCode === 200);
    });
    req.once("error", () => resolve(false));
    req.once("timeout", () => req.destroy());
  });
}

async function stopProcess(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((r) => child.once("exit", () => r()));
  child.kill("SIGTERM");
  const t = setTimeout(() => child.kill("SIGKILL"), 5000);
  await exited;
  clearTimeout(t);
}

function kubeconfigYaml(server: string, caFile: string, user: { cert?: string; key?: string; token?: string }): string {
  const u = [
    user.cert ? `    client-certificate: ${user.cert}` : "",
    user.key ? `    client-key: ${user.key}` : "",
    user.token ? `    token: ${user.token}` : "",
  ].filter(Boolean);
  return `apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: ${server}
    certificate-authority: ${caFile}
users:
- name: user
  user:
${u.join("\n")}
contexts:
- name: local
  context: {cluster: local, user: user}
current-context: local
`;
}

export interface StartOptions {
  /** Parent directory for the instance's files (default: the OS temp dir). */
  parentDir?: string;
  /** Seconds to wait for /readyz. */
  readyTimeoutSeconds?: number;
  extraApiserverArgs?: string[];
  /**
   * Also run kube-controller-manager (PodDisruptionBudget status, CSR signing, garbage
   * collection, …). `controllers` is its --controllers list (default "*"); tests with Node
   * objects but no kubelets leave out nodelifecycle, which would mark them NotReady.
   */
  controllerManager?: boolean | { controllers?: string[]; extraArgs?: string[] };
  /**
   * Also run kube-scheduler (the admin's credentials, no leader election): pods of a Deployment
   * get nodes, as in a cluster. Off by default: most tests name the node (spec.nodeName).
   */
  scheduler?: boolean;
  /**
   * Where kube-apiserver listens (default 127.0.0.1). A node in its own network namespace
   * reaches the host on its veth's host address, so an end-to-end test listens on 0.0.0.0.
   */
  bindAddress?: string;
  /** More DNS names in the API server's serving certificate (a name nodes resolve to the host). */
  serverNames?: string[];
  /**
   * The RBAC kubeadm sets up for kubelet TLS bootstrap: bootstrap tokens (group
   * system:bootstrappers) may create CSRs and have client CSRs auto-approved, nodes
   * (system:nodes) have their renewals auto-approved (kube-controller-manager's csrapproving).
   */
  kubeletBootstrapRbac?: boolean;
  /**
   * The API server verifies kubelets' serving certificates against the cluster CA
   * (`--kubelet-certificate-authority`), as production clusters do: `kubectl logs`/`exec` then
   * work only for a kubelet whose serving CSR was approved and signed.
   */
  verifyKubeletServing?: boolean;
}

/** kubeadm's bindings for kubelet TLS bootstrap (its "bootstrap-token" phase), as one YAML stream. */
export const KUBELET_BOOTSTRAP_RBAC = [
  ["kubeadm:kubelet-bootstrap", "system:node-bootstrapper", "system:bootstrappers"],
  [
    "kubeadm:node-autoapprove-bootstrap",
    "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
    "system:bootstrappers",
  ],
  [
    "kubeadm:node-autoapprove-certificate-rotation",
    "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
    "system:nodes",
  ],
]
  .map(
    ([name, role, group]) => `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "${name}"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "${role}"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: "${group}"}]
`,
  )
  .join("---\n");

export async function startControlPlane(opts: StartOptions = {}): Promise<ControlPlane> {
  const binDir = await binaries();
  const dir = await mkdtemp(path.join(opts.parentDir ?? os.tmpdir(), "bashible-cp-"));
  const pki = path.join(dir, "pki");
  await mkdir(pki, { recursive: true });
  const procs: ChildProcess[] = [];
  const stop = async () => {
    for (const p of procs.reverse()) await stopProcess(p);
    admin?.close();
    await rm(dir, { recursive: true, force: true });
  };
  let admin: KubeClient | undefined;
  try {
    const [ca, frontProxyCA, sa] = await Promise.all([
      createCA(pki, "ca", "kubernetes"),
      createCA(pki, "front-proxy-ca", "front-proxy-ca"),
      createKeyPair(pki, "sa"),
    ]);
    const [serving, adminCert, frontProxyClient, kubeletClient] = await Promise.all([
      issueCert(pki, "apiserver", ca, {
        cn: "kube-apiserver",
        dnsNames: [
          "localhost",
          "kubernetes",
          "kubernetes.default",
          "kubernetes.default.svc",
          ...(opts.serverNames ?? []),
        ],
        ips: ["127.0.0.1", "10.96.0.1"],
      }),
      issueCert(pki, "admin", ca, { cn: "kubernetes-admin", orgs: ["system:masters"], client: true }),
      issueCert(pki, "front-proxy-client", frontProxyCA, { cn: "front-proxy-client", client: true }),
      // What the API server shows kubelets (logs, exec): kubeadm's identity for it.
      issueCert(pki, "apiserver-kubelet-client", ca, {
        cn: "kube-apiserver-kubelet-client",
        orgs: ["system:masters"],
        client: true,
      }),
    ]);

    const [etcdClientPort, etcdPeerPort, apiPort] = await Promise.all([freePort(), freePort(), freePort()]);
    const etcdLog = path.join(dir, "etcd.log");
    procs.push(
      await startProcess(
        path.join(binDir, "etcd"),
        [
          "--name=default",
          `--data-dir=${path.join(dir, "etcd")}`,
          `--listen-client-urls=http://127.0.0.1:${etcdClientPort}`,
          `--advertise-client-urls=http://127.0.0.1:${etcdClientPort}`,
          `--listen-peer-urls=http://127.0.0.1:${etcdPeerPort}`,
          `--initial-advertise-peer-urls=http://127.0.0.1:${etcdPeerPort}`,
          `--initial-cluster=default=http://127.0.0.1:${etcdPeerPort}`,
          "--unsafe-no-fsync",
          "--log-level=warn",
        ],
        etcdLog,
      ),
    );

    const apiLog = path.join(dir, "kube-apiserver.log");
    const server = `https://127.0.0.1:${apiPort}`;
    const apiArgs = [
      `--etcd-servers=http://127.0.0.1:${etcdClientPort}`,
      `--bind-address=${opts.bindAddress ?? "127.0.0.1"}`,
      "--advertise-address=127.0.0.1",
      `--secure-port=${apiPort}`,
      `--cert-dir=${path.join(dir, "apiserver-certs")}`,
      `--tls-cert-file=${serving.cert}`,
      `--tls-private-key-file=${serving.key}`,
      `--client-ca-file=${ca.cert}`,
      "--authorization-mode=Node,RBAC",
      "--enable-admission-plugins=NodeRestriction",
      "--enable-bootstrap-token-auth=true",
      `--service-account-key-file=${sa.pub}`,
      `--service-account-signing-key-file=${sa.priv}`,
      "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
      "--service-cluster-ip-range=10.96.0.0/12",
      "--allow-privileged=true",
      // Front proxy: the API server forwards aggregated-API requests with this client
      // certificate and the user in these headers.
      `--requestheader-client-ca-file=${frontProxyCA.cert}`,
      "--requestheader-allowed-names=front-proxy-client",
      "--requestheader-username-headers=X-Remote-User",
      "--requestheader-group-headers=X-Remote-Group",
      "--requestheader-extra-headers-prefix=X-Remote-Extra-",
      `--proxy-client-cert-file=${frontProxyClient.cert}`,
      `--proxy-client-key-file=${frontProxyClient.key}`,
      // Route aggregated APIs through the Service (not its Endpoints): on loopback the
      // bundle server is reached through an ExternalName Service "localhost", which
      // endpoint routing refuses (and Endpoints refuse loopback IPs).
      "--enable-aggregator-routing=false",
      // Kubelets as kubeadm has the API server reach them: by address (node names need not
      // resolve here), with a client certificate their webhook authorization accepts.
      `--kubelet-client-certificate=${kubeletClient.cert}`,
      `--kubelet-client-key=${kubeletClient.key}`,
      "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname",
      ...(opts.verifyKubeletServing ? [`--kubelet-certificate-authority=${ca.cert}`] : []),
      "--v=1",
      ...(opts.extraApiserverArgs ?? []),
    ];
    const apiserver = { proc: await startProcess(path.join(binDir, "kube-apiserver"), apiArgs, apiLog) };
    procs.push(apiserver.proc);

    const adminKubeconfig = path.join(dir, "admin.kubeconfig");
    await writeFile(adminKubeconfig, kubeconfigYaml(server, ca.cert, adminCert));
    admin = new KubeClient(await loadKubeconfig(adminKubeconfig), { timeoutMs: 5000 });

    const client = admin;
    const apiReady = async () => {
      const deadline = Date.now() + (opts.readyTimeoutSeconds ?? 90) * 1000;
      for (;;) {
        const [etcd, api] = [procs[0], apiserver.proc];
        for (const [p, log, what] of [
          [etcd, etcdLog, "etcd"],
          [api, apiLog, "kube-apiserver"],
        ] as const) {
          if (p && p.exitCode !== null) throw new Error(`${what} exited with ${p.exitCode}:\n${await tail(log)}`);
        }
        const res = await client.raw("GET", "/readyz").catch(() => undefined);
        if (res?.status === 200) return;
        if (Date.now() > deadline) throw new Error(`kube-apiserver not ready in time:\n${await tail(apiLog)}`);
        await new Promise((r) => setTimeout(r, 250));
      }
    };
    await apiReady();

    /**
     * A component on the admin's credentials, serving its /healthz on a free loopback port:
     * started, and waited for until that answers. `exitHint` follows its name when it exits.
     */
    const startComponent = async (bin: string, args: string[], log: string, exitHint = "") => {
      const port = await freePort();
      const proc = await startProcess(
        path.join(binDir, bin),
        [
          `--kubeconfig=${adminKubeconfig}`,
          `--authentication-kubeconfig=${adminKubeconfig}`,
          `--authorization-kubeconfig=${adminKubeconfig}`,
          "--bind-address=127.0.0.1",
          `--secure-port=${port}`,
          ...args,
        ],
        log,
      );
      procs.push(proc);
      const deadline = Date.now() + (opts.readyTimeoutSeconds ?? 90) * 1000;
      for (;;) {
        if (proc.exitCode !== null)
          throw new Error(`${bin} exited with ${proc.exitCode}${exitHint}:\n${await tail(log)}`);
        if (await healthy(`https://127.0.0.1:${port}/healthz`)) return;
        if (Date.now() > deadline) throw new Error(`${bin} not healthy in time:\n${await tail(log)}`);
        await new Promise((r) => setTimeout(r, 250));
      }
    };

    let controllerManagerLog: string | undefined;
    if (opts.controllerManager) {
      const cm = opts.controllerManager === true ? {} : opts.controllerManager;
      controllerManagerLog = path.join(dir, "kube-controller-manager.log");
      await startComponent(
        "kube-controller-manager",
        [
          `--cert-dir=${path.join(dir, "controller-manager-certs")}`,
          "--leader-elect=false",
          `--controllers=${(cm.controllers ?? ["*"]).join(",")}`,
          `--service-account-private-key-file=${sa.priv}`,
          `--root-ca-file=${ca.cert}`,
          `--cluster-signing-cert-file=${ca.cert}`,
          `--cluster-signing-key-file=${ca.key}`,
          "--use-service-account-credentials=false",
          "--v=1",
          ...(cm.extraArgs ?? []),
        ],
        controllerManagerLog,
      );
    }

    if (opts.scheduler)
      await startComponent(
        "kube-scheduler",
        ["--leader-elect=false", "--v=1"],
        path.join(dir, "kube-scheduler.log"),
        " (scripts/test-binaries.sh builds it)",
      );

    const cp: ControlPlane = {
      dir,
      controllerManagerLog,
      server,
      binDir,
      ca,
      frontProxyCA,
      frontProxyClient,
      adminKubeconfig,
      admin,
      async writeKubeconfig(file, user) {
        await writeFile(file, kubeconfigYaml(server, ca.cert, user), { mode: 0o600 });
        return file;
      },
      async stopApiServer() {
        await stopProcess(apiserver.proc);
      },
      async startApiServer() {
        if (apiserver.proc.exitCode === null && apiserver.proc.signalCode === null) return;
        const old = apiserver.proc;
        apiserver.proc = await startProcess(path.join(binDir, "kube-apiserver"), apiArgs, apiLog);
        procs[procs.indexOf(old)] = apiserver.proc;
        await apiReady();
      },
      async mintNode(name) {
        const ndir = path.join(dir, "nodes", name);
        await mkdir(ndir, { recursive: true });
        const c = await issueCert(ndir, "kubelet-client", ca, {
          cn: `system:node:${name}`,
          orgs: ["system:nodes"],
          client: true,
        });
        const kubeconfig = await cp.writeKubeconfig(path.join(ndir, "kubelet.conf"), c);
        return { name, kubeconfig, cert: c.cert, key: c.key };
      },
      async mintBootstrapToken(o = {}) {
        const id = randomBytes(3).toString("hex");
        const secret = randomBytes(8).toString("hex");
        const expiration = new Date(Date.now() + (o.ttlSeconds ?? 3600) * 1000).toISOString().replace(/\.\d+Z$/, "Z");
        await createSecret(admin as KubeClient, {
          apiVersion: "v1",
          kind: "Secret",
          type: "bootstrap.kubernetes.io/token",
          metadata: { name: `bootstrap-token-${id}`, namespace: "kube-system" },
          stringData: {
            "token-id": id,
            "token-secret": secret,
            expiration,
            "usage-bootstrap-authentication": "true",
            ...(o.extraGroups?.length ? { "auth-extra-groups": o.extraGroups.join(",") } : {}),
          },
        });
        return `${id}.${secret}`;
      },
      async kubectl(args, o = {}) {
        return new Promise((resolve, reject) => {
          const child = execFile(
            path.join(binDir, "kubectl"),
            [`--kubeconfig=${o.kubeconfig ?? adminKubeconfig}`, ...args],
            { maxBuffer: 64 << 20 },
            (err, stdout, stderr) =>
              err ? reject(new Error(`kubectl ${args.join(" ")}: ${stderr || err.message}`)) : resolve(stdout),
          );
          // A kubectl that exits before reading its input (EPIPE) fails with its stderr above.
          child.stdin?.on("error", () => undefined);
          if (o.input !== undefined) child.stdin?.end(o.input);
        });
      },
      stop,
    };
    if (opts.kubeletBootstrapRbac) await cp.kubectl(["apply", "-f", "-"], { input: KUBELET_BOOTSTRAP_RBAC });
    return cp;
  } catch (err) {
    await stop();
    throw err;
  }
}
