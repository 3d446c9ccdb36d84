// `bashible server`: the cluster-side bundle server (bashible.deckhouse.io/v1alpha1).
import { existsSync } from "node:fs";
import { chmod, readFile } from "node:fs/promises";
import os from "node:os";
import v8 from "node:v8";
import { EXIT, UsageError, type Command } from "../../lib/cli.ts";
import { KubeClient } from "../../lib/kube/client.ts";
import { loadKubeconfig } from "../../lib/kube/kubeconfig.ts";
import { inClusterConnection } from "../in-cluster.ts";
import { startBundleServer } from "./app.ts";
import { LEASES, NAMESPACE, SECRETS } from "../../bundles/names.ts";
import { installCrds } from "../crds/install.ts";
import { CONTROLLER_FLAGS, CONTROLLER_FLAGS_HELP, controllerSettings } from "../controllers/command.ts";
import { asset } from "../../lib/assets.ts";
import * as fencingCtl from "../controllers/fencing.ts";
import { DEFAULT_LISTENER_LIMITS } from "../listener-limits.ts";
import { defaultStateDir, privateDirectory, UnsafeDirectoryError } from "./private-dir.ts";

/** Standalone without given certificates: a CA, a serving certificate and an admin client certificate. */
async function selfSigned(dir: string, hosts: string[]) {
  const { createCA, issueCert } = await import("../../lib/pki.ts");
  let certDir: string;
  try {
    certDir = await privateDirectory(dir);
  } catch (err) {
    if (err instanceof UnsafeDirectoryError) throw new UsageError(`--cert-dir ${dir}: ${err.message}`);
    throw err;
  }
  const ca = await createCA(certDir, "ca", "bashible-server-ca");
  const dnsNames = hosts.filter((h) => !/^[\d.]+$|:/.test(h));
  const ips = hosts.filter((h) => /^[\d.]+$|:/.test(h));
  const serving = await issueCert(certDir, "serving", ca, { cn: "bashible-server", dnsNames, ips });
  const admin = await issueCert(certDir, "admin", ca, { cn: "admin", orgs: ["system:masters"], client: true });
  // openssl writes with the umask; the directory already keeps others out, the keys say so too.
  for (const key of [ca.key, serving.key, admin.key]) await chmod(key, 0o600);
  return { certDir, ca, serving, admin };
}

/** kube-system/extension-apiserver-authentication: requestheader-client-ca-file and -allowed-names. */
async function frontProxyFromCluster(kube: KubeClient): Promise<{ ca: Buffer; allowedNames: string[] | undefined }> {
  const where = "ConfigMap kube-system/extension-apiserver-authentication";
  let cm: { data?: Record<string, string> };
  try {
    cm = await kube.request("GET", "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication");
  } catch (err) {
    throw new UsageError(
      `no --requestheader-client-ca-file, and cannot read ${where}: ${(err as Error).message} (bind Role extension-apiserver-authentication-reader, see cluster/deploy/rbac.yaml)`,
    );
  }
  const ca = cm.data?.["requestheader-client-ca-file"];
  if (!ca)
    throw new UsageError(`${where} has no requestheader-client-ca-file: the API server runs without a front proxy`);
  let allowedNames: string[] | undefined;
  try {
    const names = JSON.parse(cm.data?.["requestheader-allowed-names"] ?? "[]") as string[];
    allowedNames = names.length ? names : undefined;
  } catch {
    throw new UsageError(`${where}: requestheader-allowed-names is not a JSON list`);
  }
  return { ca: Buffer.from(ca), allowedNames };
}

const command: Command = {
  summary: "serve node group bundles (bashible.deckhouse.io aggregated API)",
  usage: "[--config-dir DIR | --kubeconfig FILE | --in-cluster] [--standalone] [options]",
  help: `Renders NodeGroupBundles from NodeGroup, NodeGroupConfiguration and NodeUser objects plus the
cluster context and serves nodegroupbundles, bashibles and bootstrap (get, list, watch).

Inputs (one of):
      --config-dir DIR        YAML/JSON files with those objects, Node objects and a ClusterContext
                              (default when no cluster is given: the bundled examples/cluster)
      --kubeconfig FILE       list + watch them through the Kubernetes API; context from Secret
                              ${NAMESPACE}/${SECRETS.context}, key ${SECRETS.contextKey}
                              (or the older ${SECRETS.legacyContext}, key ${SECRETS.legacyContextKey})
      --in-cluster            the same with the pod's service account
      --install-crds          install or update the deckhouse.io CRDs first (needs --kubeconfig);
                              refuses, changing nothing, if one exists that it did not install
                              (no label heritage=bashible, e.g. Deckhouse's)
      --force-crds            with --install-crds: replace such CRDs too
      --conversion-ca-file FILE
                              with --install-crds: the CA of this server's certificate, for the
                              NodeGroup conversion webhook (POST /convert through Service
                              bashible-api). Default: the caBundle the CRD or APIService
                              v1alpha1.bashible.deckhouse.io already has
      --no-manage-secrets     with a cluster: a read-only replica: no Secrets, Events, controllers or
                              leader election; serves what it renders

Replicas (with a cluster): every replica serves; the checksums and manual-bootstrap Secrets and
render Events are written by the holder of Lease ${LEASES.server}, the update controllers run on
the holder of Lease ${LEASES.controllers} (see docs/controllers.md).
      --no-controllers        do not run the update controllers here (run \`bashible controllers\`)
${CONTROLLER_FLAGS_HELP}

Serving:
      --address ADDR          listen address (default 0.0.0.0)
      --port N                listen port (default 9443; 0 picks one, logged)
      --tls-cert-file FILE    serving certificate (PEM); --tls-private-key-file FILE its key
      --requestheader-client-ca-file FILE
                              front-proxy CA: requests with its client certificate carry the user
                              in X-Remote-User / X-Remote-Group (aggregated API mode). Default with
                              a cluster: from ConfigMap kube-system/extension-apiserver-authentication
      --requestheader-allowed-names LIST
                              allowed front-proxy CNs, comma-separated (default front-proxy-client)
      --client-ca-file FILE   CA for user client certificates (CN = user, O = groups)
      --standalone            no front proxy: users authenticate with client certificates. Without
                              --tls-cert-file, writes a CA, serving and admin client certificate to
                              --cert-dir and trusts that CA
      --cert-dir DIR          where --standalone writes its certificates: a directory only this
                              user can reach (created 0700; a link, a foreign owner or a mode that
                              lets others in is refused). Default: $STATE_DIRECTORY/certs under
                              systemd, /var/lib/bashible-server as root, else
                              \${XDG_STATE_HOME:-~/.local/state}/bashible-server
      --reuse-port            share the port with other server processes on this host
      --max-connections N     concurrent connections, TLS handshakes included (default ${DEFAULT_LISTENER_LIMITS.maxConnections});
                              a handshake has ${DEFAULT_LISTENER_LIMITS.handshakeTimeoutMs / 1000} s, the first request ${DEFAULT_LISTENER_LIMITS.firstRequestTimeoutMs / 1000} s, an idle
                              connection ${DEFAULT_LISTENER_LIMITS.idleTimeoutMs / 1000} s

${fencingCtl.FENCING_CONTROLLER_HELP}

See docs/cluster.md for the formats and the authorization model.`,
  options: {
    "config-dir": { type: "string" },
    kubeconfig: { type: "string" },
    "in-cluster": { type: "boolean" },
    "install-crds": { type: "boolean" },
    "force-crds": { type: "boolean" },
    "conversion-ca-file": { type: "string" },
    "no-manage-secrets": { type: "boolean" },
    "no-controllers": { type: "boolean" },
    "reuse-port": { type: "boolean" },
    "max-connections": { type: "string" },
    ...CONTROLLER_FLAGS,
    namespace: { type: "string" },
    address: { type: "string" },
    port: { type: "string" },
    "tls-cert-file": { type: "string" },
    "tls-private-key-file": { type: "string" },
    "requestheader-client-ca-file": { type: "string" },
    "requestheader-allowed-names": { type: "string" },
    "client-ca-file": { type: "string" },
    standalone: { type: "boolean" },
    "cert-dir": { type: "string" },
    ...fencingCtl.FENCING_CONTROLLER_OPTIONS,
  },
  async run({ values, log }) {
    // Measured (docs/benchmarks.md): with 10,000 watches open, V8's default heap growth let
    // poll garbage pile up to ~300 MB RSS; sizing for memory keeps it under 200 MB for ~5%
    // more CPU. Heap growth decisions read this flag as they happen, so setting it now works.
    v8.setFlagsFromString("--optimize-for-size");
    const v = values as Record<string, string | boolean | undefined>;
    const str = (k: string) => v[k] as string | undefined;
    const port = Number(str("port") ?? "9443");
    if (!Number.isInteger(port) || port < 0 || port > 65535)
      throw new UsageError(`--port '${str("port")}' is not a port`);
    const address = str("address") ?? "0.0.0.0";
    const maxConnections = Number(str("max-connections") ?? DEFAULT_LISTENER_LIMITS.maxConnections);
    if (!Number.isInteger(maxConnections) || maxConnections < 1)
      throw new UsageError(`--max-connections '${str("max-connections")}' is not a positive whole number`);
    const settings = controllerSettings(v);

    let kube: KubeClient | undefined;
    // Five watches (inputs, checksums Secret) hold connections; writes and lookups need more.
    const clientOpts = { userAgent: "bashible-server", maxSockets: 32 };
    if (str("kubeconfig")) kube = new KubeClient(await loadKubeconfig(str("kubeconfig")!), clientOpts);
    else if (v["in-cluster"]) kube = new KubeClient(await inClusterConnection(), clientOpts);
    let fencingTimings: ReturnType<typeof fencingCtl.fencingTimingsFromFlags>;
    try {
      fencingTimings = fencingCtl.fencingTimingsFromFlags(v); // refuses unsafe timings before anything starts
    } catch (err) {
      throw new UsageError((err as Error).message);
    }
    const configDir = str("config-dir") ?? (kube ? undefined : asset("examples/cluster"));
    if (configDir && !existsSync(configDir)) throw new UsageError(`--config-dir ${configDir} does not exist`);
    if (v["force-crds"] && !v["install-crds"]) throw new UsageError("--force-crds goes with --install-crds");
    if (v["conversion-ca-file"] && !v["install-crds"]) {
      throw new UsageError("--conversion-ca-file goes with --install-crds");
    }
    if (v["install-crds"]) {
      if (!kube) throw new UsageError("--install-crds needs --kubeconfig or --in-cluster");
      const caFile = str("conversion-ca-file");
      let caBundle: string | undefined;
      if (caFile) {
        try {
          caBundle = await readFile(caFile, "utf8");
        } catch (err) {
          throw new UsageError(`--conversion-ca-file ${caFile}: ${(err as Error).message}`);
        }
      }
      await installCrds(kube, { force: v["force-crds"] === true, conversion: caBundle ? { caBundle } : {} });
      log.info("CRDs installed");
    }

    const read = async (k: string) => {
      const f = str(k);
      if (!f) return undefined;
      try {
        return await readFile(f);
      } catch (err) {
        throw new UsageError(`--${k} ${f}: ${(err as Error).message}`);
      }
    };
    let cert = await read("tls-cert-file");
    let key = await read("tls-private-key-file");
    let clientCA = await read("client-ca-file");
    let requestHeaderCA: Buffer | undefined = await read("requestheader-client-ca-file");
    let allowedNames = str("requestheader-allowed-names")?.split(",").filter(Boolean);
    if (!requestHeaderCA && !clientCA && kube && !v.standalone) {
      // As an aggregated API server does: the front proxy's CA and names from the ConfigMap the
      // API server publishes (readable through Role extension-apiserver-authentication-reader).
      const fromCluster = await frontProxyFromCluster(kube);
      requestHeaderCA = fromCluster.ca;
      allowedNames ??= fromCluster.allowedNames;
      log.info({ allowedNames }, "front-proxy CA from kube-system/extension-apiserver-authentication");
    }
    if (!!cert !== !!key) throw new UsageError("--tls-cert-file and --tls-private-key-file go together");
    if (!cert) {
      if (!v.standalone) throw new UsageError("--tls-cert-file is required (or --standalone for a self-signed one)");
      const pki = await selfSigned(str("cert-dir") ?? defaultStateDir(), ["localhost", "127.0.0.1", os.hostname()]);
      const certDir = pki.certDir;
      cert = await readFile(pki.serving.cert);
      key = await readFile(pki.serving.key);
      if (!clientCA) clientCA = await readFile(pki.ca.cert);
      log.info(
        { ca: pki.ca.cert, adminCert: pki.admin.cert, adminKey: pki.admin.key },
        `standalone: certificates written to ${certDir}; sign client certificates with ${pki.ca.cert} (CN = user, O = groups)`,
      );
    }
    if (!requestHeaderCA && !clientCA) {
      throw new UsageError(
        "no way to authenticate callers: give --requestheader-client-ca-file and/or --client-ca-file",
      );
    }

    const app = await startBundleServer({
      log,
      configDir,
      kube,
      namespace: str("namespace") ?? NAMESPACE,
      tls: { cert, key: key! },
      requestHeader: requestHeaderCA
        ? {
            caPems: [requestHeaderCA],
            allowedNames: allowedNames?.length ? allowedNames : ["front-proxy-client"],
          }
        : undefined,
      clientCAPems: clientCA ? [clientCA] : undefined,
      host: address,
      port,
      manageSecrets: !v["no-manage-secrets"],
      controllers: v["no-controllers"]
        ? false
        : { controller: { evictionRetryMs: settings.evictionRetryMs, drainTimeoutMs: settings.drainTimeoutMs } },
      lease: { leaseDurationSeconds: settings.leaseDurationSeconds },
      reusePort: v["reuse-port"] === true,
      limits: { maxConnections },
    });
    const fencing =
      kube && !v["no-controllers"] && !v["no-fencing-controller"]
        ? fencingCtl.startFencingController({
            client: kube,
            log,
            timings: fencingTimings,
            lease: { durationSeconds: settings.leaseDurationSeconds },
          })
        : undefined;
    await new Promise<void>((resolve) => {
      const stop = () => resolve();
      process.once("SIGTERM", stop);
      process.once("SIGINT", stop);
    });
    log.info("stopping");
    await fencing?.stop();
    await app.stop();
    kube?.close();
    return EXIT.ok;
  },
};

export default command;
