// Installs the deckhouse.io CRDs (NodeGroup, NodeGroupConfiguration, NodeUser, Instance) and waits until
// the API server serves them. Used by tests, the demo and `bashible server --install-crds`.
// A CRD that exists but was not installed by us (Deckhouse's own, label heritage=deckhouse) is
// left alone unless forced: replacing it would change what its controllers and users rely on.
import { readFile } from "node:fs/promises";
import path from "node:path";
import { asset } from "../../lib/assets.ts";
import { parse } from "yaml";
import type { KubeClient } from "../../lib/kube/client.ts";
import { isConflict, isNotFound } from "../../lib/kube/errors.ts";
import type { KubeObject } from "../../lib/kube/api.ts";

export const CRD_FILES = ["nodegroup.yaml", "nodegroupconfiguration.yaml", "nodeuser.yaml", "instance.yaml"] as const;
const CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
/** The label (and value) our CRDs carry; a CRD without it belongs to someone else. */
export const HERITAGE_LABEL = "heritage";
export const HERITAGE = "bashible";

export class ForeignCrdError extends Error {
  override name = "ForeignCrdError";
}

/** Where the API server reaches the NodeGroup conversion webhook (spec.conversion.webhook.clientConfig). */
export interface ConversionTarget {
  /** PEM of the CA that signed the bundle server's certificate. */
  caBundle?: string;
  /** The Service port (443 in cluster/deploy; tests point an ExternalName at their own port). */
  port?: number;
}

const APISERVICE_PATH = "/apis/apiregistration.k8s.io/v1/apiservices/v1alpha1.bashible.deckhouse.io";

interface WebhookConversion {
  strategy?: string;
  webhook?: { clientConfig?: { caBundle?: string; service?: { port?: number } } };
}
const conversionOf = (crd: KubeObject) => (crd.spec as { conversion?: WebhookConversion }).conversion;

/**
 * The caBundle a CRD's conversion webhook gets: the one given, else the one it already has when
 * it is ours (an operator's patch survives a reinstall; Deckhouse's CRD carries its
 * webhook-handler's CA, which would never verify this server), else the APIService's: the
 * webhook is the same server behind the same Service and certificate. Base64, as the API takes it.
 */
async function conversionCaBundle(
  client: KubeClient,
  given: string | undefined,
  existing: KubeObject | undefined,
): Promise<string | undefined> {
  if (given) return Buffer.from(given, "utf8").toString("base64");
  const ours = existing?.metadata.labels?.[HERITAGE_LABEL] === HERITAGE;
  const kept = ours ? conversionOf(existing!)?.webhook?.clientConfig?.caBundle : undefined;
  if (kept) return kept;
  try {
    const api = await client.request<KubeObject>("GET", APISERVICE_PATH);
    return (api.spec as { caBundle?: string }).caBundle || undefined;
  } catch (err) {
    if (isNotFound(err)) return undefined;
    throw err;
  }
}

/** The CRD with its conversion webhook's caBundle and port filled in; a CRD without a webhook as it is. */
async function withConversion(
  client: KubeClient,
  crd: KubeObject,
  existing: KubeObject | undefined,
  target: ConversionTarget | undefined,
): Promise<KubeObject> {
  if (conversionOf(crd)?.strategy !== "Webhook") return crd;
  const caBundle = await conversionCaBundle(client, target?.caBundle, existing);
  const port = target?.port;
  const out = structuredClone(crd);
  const clientConfig = conversionOf(out)!.webhook!.clientConfig!;
  if (caBundle) clientConfig.caBundle = caBundle;
  if (port !== undefined && clientConfig.service) clientConfig.service.port = port;
  return out;
}

export async function loadCrds(): Promise<KubeObject[]> {
  return Promise.all(
    CRD_FILES.map(async (f) => parse(await readFile(path.join(asset("cluster/crds"), f), "utf8")) as KubeObject),
  );
}

/**
 * Creates or replaces each CRD, then waits (bounded) for every one to be Established. Throws
 * ForeignCrdError, changing nothing, when a CRD exists without our heritage label and `force`
 * is not set.
 */
export async function installCrds(
  client: KubeClient,
  opts: { timeoutMs?: number; force?: boolean; conversion?: ConversionTarget } = {},
): Promise<void> {
  const crds = await loadCrds();
  if (!opts.force) {
    const foreign: string[] = [];
    for (const crd of crds) {
      try {
        const existing = await client.request<KubeObject>("GET", `${CRD_PATH}/${crd.metadata.name}`);
        const heritage = existing.metadata.labels?.[HERITAGE_LABEL];
        if (heritage !== HERITAGE) foreign.push(`${crd.metadata.name} (${HERITAGE_LABEL}=${heritage ?? "<none>"})`);
      } catch (err) {
        if (!isNotFound(err)) throw err;
      }
    }
    if (foreign.length) {
      throw new ForeignCrdError(
        `not replacing CRDs this server did not install: ${foreign.join(", ")}; ` +
          "they are served as they are (pass --force-crds to replace them with ours)",
      );
    }
  }
  for (const crd of crds) {
    const name = crd.metadata.name;
    for (let attempt = 0; ; attempt++) {
      try {
        const existing = await client.request<KubeObject>("GET", `${CRD_PATH}/${name}`);
        const wanted = await withConversion(client, crd, existing, opts.conversion);
        await client.request("PUT", `${CRD_PATH}/${name}`, {
          body: { ...wanted, metadata: { ...wanted.metadata, resourceVersion: existing.metadata.resourceVersion } },
        });
        break;
      } catch (err) {
        if (isNotFound(err)) {
          await client.request("POST", CRD_PATH, {
            body: await withConversion(client, crd, undefined, opts.conversion),
          });
          break;
        }
        if (isConflict(err) && attempt < 5) continue;
        throw err;
      }
    }
  }
  const deadline = Date.now() + (opts.timeoutMs ?? 30_000);
  for (const crd of crds) {
    const name = crd.metadata.name;
    for (;;) {
      const got = await client.request<KubeObject>("GET", `${CRD_PATH}/${name}`);
      const conds = ((got.status as { conditions?: { type: string; status: string }[] })?.conditions ?? []).filter(
        (c) => c.status === "True",
      );
      if (conds.some((c) => c.type === "Established")) break;
      if (Date.now() > deadline) throw new Error(`CRD ${name} not Established within ${opts.timeoutMs ?? 30_000} ms`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  // Established can precede discovery by a moment; wait until each resource is listable.
  for (const crd of crds) {
    const spec = crd.spec as { group: string; names: { plural: string }; versions: { name: string }[] };
    const p = `/apis/${spec.group}/${spec.versions[0]?.name}/${spec.names.plural}`;
    for (;;) {
      const res = await client.raw("GET", p, { query: { limit: 1 } });
      if (res.status === 200) break;
      if (Date.now() > deadline) throw new Error(`${p} not served within ${opts.timeoutMs ?? 30_000} ms`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}
