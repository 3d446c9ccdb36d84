// `bashible server`: the cluster-side bundle server (bashible.deckhouse.io/v1alpha1).
import { existsSync } from "node:fs";
import { mkdir, readFile } from "node:fs/promises";
import os from "node:os";
import v8 from "node:v8";
import path from "node:path";
import { EXIT, UsageError, type Command } from "../lib/cli.ts";
import { KubeClient } from "../lib/kube/client.ts";
import { loadKubeconfig, type KubeConnection } from "../lib/kube/kubeconfig.ts";
import { startBundleServer } from "./app.ts";
import { NAMESPACE } from "./checksums.ts";
import { installCrds } from "./crds/install.ts";
import { asset } from "../lib/assets.ts";

const SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount";

async function inClusterConnection(): Promise<KubeConnection> {
  const host = process.env.KUBERNETES_SERVICE_HOST;
  const port = process.env.KUBERNETES_SERVICE_PORT ?? "443";
  if (!host)
    throw new UsageError("not in a cluster (KUBERNETES_SERVICE_HOST unset); pass --kubeconfig or --config-dir");
  return {
    server: `https://${host.includes(":") ? `[${host}]` : host}:${port}`,
    ca: await readFile(path.join(SA_DIR, "ca.crt")),
    token: (await readFile(path.join(SA_DIR, "token"), "utf8")).trim(),
    source: SA_DIR,
  };
}

/** Standalone without given certificates: a CA, a serving certificate and an admin client certificate. */
async function selfSigned(certDir: string, hosts: string[]) {
  const { createCA, issueCert } = await import("../lib/pki.ts");
  await mkdir(certDir, { recursive: true, mode: 0o700 });
  const ca = await createCA(certDir, "ca", "bashible-server-ca");
  const dnsNames = hosts.filter((h) => !/^[\d.]+$|:/.test(h));
  const ips = hosts.filter((h) => /^[\d.]+$|:/.test(h));
  const serving = await issueCert(certDir, "serving", ca, { cn: "bashible-server", dnsNames, ips });
  const admin = await issueCert(certDir, "admin", ca, { cn: "admin", orgs: ["system:masters"], client: true });
  return { ca, serving, admin };
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
                              ${NAMESPACE}/bashible-apiserver-context, key input.yaml
                              (or the older bashible-server-context, key context.yaml)
      --in-cluster            the same with the pod's service account
      --install-crds          install or update the deckhouse.io CRDs first (needs --kubeconfig);
                              refuses, changing nothing, if one exists that it did not install
                              (no label heritage=bashible, e.g. Deckhouse's)
      --force-crds            with --install-crds: replace such CRDs too
      --no-manage-secrets     with a cluster: do not write checksums/bootstrap Secrets or Events

Serving:
      --address ADDR          listen address (default 0.0.0.0)
      --port N                listen port (default 9443; 0 picks one, logged)
      --tls-cert-file FILE    serving certificate (PEM); --tls-private-key-file FILE its key
      --requestheader-client-ca-file FILE
                              front-proxy CA: requests with its client certificate carry the user
                              in X-Remote-User / X-Remote-Group (aggregated API mode)
      --requestheader-allowed-names LIST
                              allowed front-proxy CNs, comma-separated (default front-proxy-client)
      --client-ca-file FILE   CA for user client certificates (CN = user, O = groups)
      --standalone            no front proxy: users authenticate with client certificates. Without
                              --tls-cert-file, writes a CA, serving and admin client certificate to
                              --cert-dir (default $TMPDIR/bashible-server) and trusts that CA
      --cert-dir DIR          where --standalone writes its certificates

See docs/cluster.md for the formats and the authorization model.`,
  options: {
    "config-dir": { type: "string" },
    kubeconfig: { type: "string" },
    "in-cluster": { type: "boolean" },
    "install-crds": { type: "boolean" },
    "force-crds": { type: "boolean" },
    "no-manage-secrets": { type: "boolean" },
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

    let kube: KubeClient | undefined;
    if (str("kubeconfig"))
      kube = new KubeClient(await loadKubeconfig(str("kubeconfig")!), { userAgent: "bashible-server" });
    else if (v["in-cluster"]) kube = new KubeClient(await inClusterConnection(), { userAgent: "bashible-server" });
    const configDir = str("config-dir") ?? (kube ? undefined : asset("examples/cluster"));
    if (configDir && !existsSync(configDir)) throw new UsageError(`--config-dir ${configDir} does not exist`);
    if (v["force-crds"] && !v["install-crds"]) throw new UsageError("--force-crds goes with --install-crds");
    if (v["install-crds"]) {
      if (!kube) throw new UsageError("--install-crds needs --kubeconfig or --in-cluster");
      await installCrds(kube, { force: v["force-crds"] === true });
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
    const requestHeaderCA = await read("requestheader-client-ca-file");
    if (!!cert !== !!key) throw new UsageError("--tls-cert-file and --tls-private-key-file go together");
    if (!cert) {
      if (!v.standalone) throw new UsageError("--tls-cert-file is required (or --standalone for a self-signed one)");
      const certDir = str("cert-dir") ?? path.join(os.tmpdir(), "bashible-server");
      const pki = await selfSigned(certDir, ["localhost", "127.0.0.1", os.hostname()]);
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
            allowedNames: (str("requestheader-allowed-names") ?? "front-proxy-client").split(",").filter(Boolean),
          }
        : undefined,
      clientCAPems: clientCA ? [clientCA] : undefined,
      host: address,
      port,
      manageSecrets: !v["no-manage-secrets"],
    });
    await new Promise<void>((resolve) => {
      const stop = () => resolve();
      process.once("SIGTERM", stop);
      process.once("SIGINT", stop);
    });
    log.info("stopping");
    await app.stop();
    kube?.close();
    return EXIT.ok;
  },
};

export default command;
