// Every address the cluster side serves on and nodes dial: the kubernetes Service's cluster IPs
// and its EndpointSlices (the API server as pods reach it), and the endpoints in the bundle
// context (the API servers nodes dial, which need not be in any EndpointSlice, the
// registry-packages proxy, the registry). A kubelet serving certificate signed by the cluster CA
// for one of these would let its node pose as that endpoint, so none may be named in one.
import { parse } from "yaml";
import type { KubeClient } from "../../lib/kube/client.ts";
import { isNotFound } from "../../lib/kube/errors.ts";
import { NAMESPACE, SECRETS } from "../../bundles/names.ts";

export interface ClusterEndpoints {
  /** As given; the caller puts them into its own canonical spelling. */
  ips: string[];
  /** Host names (lowercase) of endpoints given by name. */
  names: string[];
}

/** `host:port` or `[v6]:port` → host. */
function hostOf(endpoint: string): string | undefined {
  const m = /^\[([^\]]+)\]:\d+$/.exec(endpoint) ?? /^([^:]+):\d+$/.exec(endpoint);
  return m?.[1]?.toLowerCase();
}

const isIp = (h: string) => /^[\d.]+$/.test(h) || h.includes(":");

/** The context's endpoints, from Deckhouse's Secret name or the older one (whichever exists). */
async function contextEndpoints(client: KubeClient, namespace: string): Promise<string[]> {
  for (const [name, key] of [
    [SECRETS.context, SECRETS.contextKey],
    [SECRETS.legacyContext, SECRETS.legacyContextKey],
  ] as const) {
    let secret: { data?: Record<string, string> };
    try {
      secret = await client.request("GET", `/api/v1/namespaces/${namespace}/secrets/${name}`);
    } catch (err) {
      if (isNotFound(err)) continue;
      throw err;
    }
    const text = secret.data?.[key];
    if (!text) continue;
    const ctx = (parse(Buffer.from(text, "base64").toString("utf8")) ?? {}) as {
      apiserverEndpoints?: unknown;
      packagesProxy?: { endpoints?: unknown };
      registry?: { address?: unknown };
    };
    const list = (v: unknown) => (Array.isArray(v) ? v.filter((x): x is string => typeof x === "string") : []);
    const registry = typeof ctx.registry?.address === "string" ? [ctx.registry.address] : [];
    return [...list(ctx.apiserverEndpoints), ...list(ctx.packagesProxy?.endpoints), ...registry];
  }
  return [];
}

export async function clusterEndpoints(client: KubeClient, namespace = NAMESPACE): Promise<ClusterEndpoints> {
  const [svc, slices, context] = await Promise.all([
    client.request<{ spec?: { clusterIPs?: string[]; clusterIP?: string } }>(
      "GET",
      "/api/v1/namespaces/default/services/kubernetes",
    ),
    client.request<{ items?: { endpoints?: { addresses?: string[] }[] }[] }>(
      "GET",
      "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
      { query: { labelSelector: "kubernetes.io/service-name=kubernetes" } },
    ),
    contextEndpoints(client, namespace),
  ]);
  const ips = [
    ...(svc.spec?.clusterIPs ?? [svc.spec?.clusterIP ?? ""]),
    ...(slices.items ?? []).flatMap((s) => (s.endpoints ?? []).flatMap((e) => e.addresses ?? [])),
  ].filter(Boolean);
  const names: string[] = [];
  for (const e of context) {
    // A registry address may carry no port: take it as the host then.
    const host = hostOf(e) ?? e.toLowerCase();
    (isIp(host) ? ips : names).push(host);
  }
  return { ips, names };
}
