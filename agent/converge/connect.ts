// Which credentials reach the cluster, in Deckhouse's order: the kubelet's client certificate
// through the local API proxy (kubelet.conf, normally https://127.0.0.1:6445), then the same
// certificate against the API servers the last bundle listed; before the kubelet exists, the
// bootstrap token and CA that bootstrap.sh left in /var/lib/bashible. Always TLS-verified.
import { KubeClient } from "../../lib/kube/client.ts";
import { bootstrapConnection, loadKubeconfig, type KubeConnection } from "../../lib/kube/kubeconfig.ts";
import type { Host } from "../../host/host.ts";
import { PATHS } from "../../bundles/paths.ts";

export interface ConnectOptions {
  /** Explicit kubeconfig (a path on this machine, not under --root). */
  kubeconfig?: string;
  /** API servers for the bootstrap shape (https://host:port). */
  servers?: string[];
  /** host:port endpoints from the last good bundle. */
  fallbackEndpoints?: string[];
  timeoutMs?: number;
}

export class NoCredentialsError extends Error {
  override name = "NoCredentialsError";
}

const asUrl = (endpoint: string) => (endpoint.startsWith("https://") ? endpoint : `https://${endpoint}`);

export async function clusterConnections(host: Host, o: ConnectOptions): Promise<KubeConnection[]> {
  if (o.kubeconfig) return [await loadKubeconfig(o.kubeconfig)];
  const fallbacks = (o.fallbackEndpoints ?? []).map(asUrl);
  if (await host.exists(PATHS.kubeletKubeconfig)) {
    const primary = await loadKubeconfig(PATHS.kubeletKubeconfig, { root: host.root });
    const rest = fallbacks
      .filter((s) => s !== primary.server)
      .map((server) => ({ ...primary, server, source: `${primary.source} via ${server}` }));
    return [primary, ...rest];
  }
  if (await host.exists(PATHS.bootstrapToken)) {
    const servers = [...(o.servers ?? []).map(asUrl), ...fallbacks];
    if (!servers.length) {
      throw new NoCredentialsError("bootstrap token present but no API server known; pass --server https://HOST:PORT");
    }
    return Promise.all(servers.map((s) => bootstrapConnection(s, PATHS.bootstrapToken, PATHS.bootstrapCA, host.root)));
  }
  throw new NoCredentialsError(
    `no cluster credentials: neither ${PATHS.kubeletKubeconfig} nor ${PATHS.bootstrapToken} exists under ${host.root}; pass --kubeconfig, or --bundle FILE for local mode`,
  );
}

export async function clusterClients(host: Host, o: ConnectOptions): Promise<KubeClient[]> {
  return (await clusterConnections(host, o)).map((c) => new KubeClient(c, { timeoutMs: o.timeoutMs ?? 10_000 }));
}
