// The pod's own credentials (service account token and CA), for the cluster-side commands.
import { readFile } from "node:fs/promises";
import path from "node:path";
import { UsageError } from "../lib/cli.ts";
import type { KubeConnection } from "../lib/kube/kubeconfig.ts";

const SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount";

export async function inClusterConnection(): Promise<KubeConnection> {
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
