// Manual bootstrap for every group Deckhouse makes one for (all but CloudEphemeral, whose
// machines get their cloud-config otherwise; dhctl reads CloudPermanent groups' cloud-config from
// it): Secret d8-cloud-instance-manager/manual-bootstrap-for-<group> with bootstrap.sh,
// cloud-config and apiserverEndpoints, the keys of Deckhouse's template
// (nm/templates/node-group/_static_or_hybrid_secret.tpl), carrying a bootstrap token made as Deckhouse makes them (label
// node-manager.deckhouse.io/node-group=<group>, extra group system:bootstrappers:d8-node-manager,
// usable for authentication and signing) plus one more extra group,
// system:bootstrappers:d8-node-manager:<group>, which scopes it: the bundle server lets it read
// only <group> (cluster/server/auth.ts). Tokens live 4 hours and are replaced once less than 3
// hours remain, so a copied Secret always has at least 3 hours left; expired ones are deleted.
import { randomBytes } from "node:crypto";
import { stringify } from "yaml";
import type { KubeClient } from "../../lib/kube/client.ts";
import { createSecret, getSecret, list, updateSecret, type KubeObject } from "../../lib/kube/api.ts";
import { isNotFound } from "../../lib/kube/errors.ts";
import type { Logger } from "../../lib/log/log.ts";
import { BOOTSTRAP_TOKEN_GROUP_LABEL, NAMESPACE, SECRETS } from "../../bundles/names.ts";
import type { RenderInputs } from "../render/inputs.ts";
import type { RenderedGroup } from "../render/render.ts";
import { renderTemplate } from "../render/templates.ts";
import { BOOTSTRAP_GROUP, BOOTSTRAP_GROUP_PREFIX } from "../bootstrap-scope.ts";

export const TOKEN_TTL_MS = 4 * 3600_000;
export const TOKEN_RENEW_BELOW_MS = 3 * 3600_000;
/** The label this project used before it took Deckhouse's; its expired tokens are deleted too. */
const LEGACY_TOKEN_GROUP_LABEL = "bashible.deckhouse.io/bootstrap-token-for";
const TOKEN_TYPE = "bootstrap.kubernetes.io/token";
const MANAGED_LABEL = "bashible.deckhouse.io/manual-bootstrap";
/** Deckhouse makes the Secret for every node type but CloudEphemeral (nm/templates/node-group/node-group.yaml). */
const hasManualBootstrap = (nodeType: unknown) => nodeType !== "CloudEphemeral";
/**
 * Our labels on a Secret we write. One Deckhouse made (heritage=deckhouse, module=node-manager)
 * is taken over: those two are replaced, so neither Deckhouse's tooling nor its module cleanup
 * treats it as Deckhouse's; other labels stay.
 */
export function manualBootstrapLabels(group: string, existing: Record<string, string> = {}): Record<string, string> {
  const { module, ...kept } = existing;
  return {
    ...kept,
    ...(module && module !== "node-manager" ? { module } : {}),
    heritage: "bashible",
    [MANAGED_LABEL]: "true",
    "node.deckhouse.io/group": group,
  };
}

/** The same keys with the same values. */
const sameRecord = (a: Record<string, string>, b: Record<string, string>) =>
  Object.keys(a).length === Object.keys(b).length && Object.entries(b).every(([k, v]) => a[k] === v);

export const manualBootstrapSecretName = (group: string) => `${SECRETS.manualBootstrapPrefix}${group}`;

const alnum = (n: number) => {
  const abc = "abcdefghijklmnopqrstuvwxyz0123456789";
  return [...randomBytes(n)].map((b) => abc[b % abc.length]).join("");
};
const decode = (s: string | undefined) => (s ? Buffer.from(s, "base64").toString("utf8") : "");
const b64 = (s: string) => Buffer.from(s, "utf8").toString("base64");

interface GroupToken {
  token: string;
  expiration: string;
}

interface TokenSecret {
  name: string;
  group: string;
  id: string;
  secret: string;
  expiration: string;
}

/** Bootstrap token Secrets labelled with a node group (Deckhouse's label or our old one). */
async function listGroupTokens(client: KubeClient): Promise<TokenSecret[]> {
  const out: TokenSecret[] = [];
  for (const label of [BOOTSTRAP_TOKEN_GROUP_LABEL, LEGACY_TOKEN_GROUP_LABEL]) {
    const l = await list(client, "/api/v1/namespaces/kube-system/secrets", { labelSelector: label });
    for (const s of l.items) {
      if ((s as { type?: string }).type !== TOKEN_TYPE) continue;
      const d = (s.data ?? {}) as Record<string, string>;
      out.push({
        name: s.metadata.name,
        group: s.metadata.labels?.[label] ?? "",
        id: decode(d["token-id"]),
        secret: decode(d["token-secret"]),
        expiration: decode(d.expiration),
      });
    }
  }
  return out;
}

/** Deletes every group token whose expiration has passed (as Deckhouse's hook does); returns the rest. */
export async function pruneExpiredTokens(client: KubeClient, now: number, log?: Logger): Promise<TokenSecret[]> {
  const live: TokenSecret[] = [];
  for (const t of await listGroupTokens(client)) {
    const expires = Date.parse(t.expiration);
    if (Number.isFinite(expires) && expires <= now) {
      await client.request("DELETE", `/api/v1/namespaces/kube-system/secrets/${t.name}`).catch((err) => {
        if (!isNotFound(err)) throw err;
      });
      log?.info(
        { group: t.group, secret: `kube-system/${t.name}`, expired: t.expiration },
        "expired bootstrap token deleted",
      );
    } else live.push(t);
  }
  return live;
}

/** A valid token for the group with ≥ 3 h left, creating a fresh 4 h one when needed. */
export async function ensureGroupToken(
  client: KubeClient,
  group: string,
  now: number,
  known?: readonly TokenSecret[],
): Promise<GroupToken> {
  const tokens = known ?? (await listGroupTokens(client));
  const usable = tokens
    .filter((t) => t.group === group && t.id && t.secret && Date.parse(t.expiration) - now >= TOKEN_RENEW_BELOW_MS)
    .sort((a, b) => Date.parse(b.expiration) - Date.parse(a.expiration))[0];
  if (usable) return { token: `${usable.id}.${usable.secret}`, expiration: usable.expiration };
  const id = alnum(6);
  const secret = alnum(16);
  const expiration = new Date(now + TOKEN_TTL_MS).toISOString().replace(/\.\d+Z$/, "Z");
  await createSecret(client, {
    apiVersion: "v1",
    kind: "Secret",
    type: TOKEN_TYPE,
    metadata: {
      name: `bootstrap-token-${id}`,
      namespace: "kube-system",
      labels: { heritage: "bashible", [BOOTSTRAP_TOKEN_GROUP_LABEL]: group },
    },
    stringData: {
      description: `bashible: manual bootstrap of node group ${group}`,
      "token-id": id,
      "token-secret": secret,
      expiration,
      "usage-bootstrap-authentication": "true",
      "usage-bootstrap-signing": "true",
      "auth-extra-groups": `${BOOTSTRAP_GROUP},${BOOTSTRAP_GROUP_PREFIX}${group}`,
    },
  });
  return { token: `${id}.${secret}`, expiration };
}

export function manualBootstrapData(group: string, ctx: RenderInputs["context"], token: GroupToken) {
  const bootstrapSh = renderTemplate("bootstrap.sh", {
    nodeGroup: group,
    bootstrapToken: token.token,
    tokenExpiration: token.expiration,
    clusterCA: ctx.clusterCA.trimEnd(),
    apiserverEndpoints: ctx.apiserverEndpoints,
  });
  const cloudConfig = `#cloud-config\n${stringify({
    write_files: [
      { path: "/var/lib/bashible/bootstrap.sh", permissions: "0700", content: bootstrapSh },
      { path: "/var/lib/bashible/ca.crt", permissions: "0644", content: ctx.clusterCA },
      { path: "/var/lib/bashible/bootstrap-token", permissions: "0600", content: token.token },
      { path: "/var/lib/bashible/first_run", permissions: "0644", content: "" },
    ],
    runcmd: [["/var/lib/bashible/bootstrap.sh"]],
  })}`;
  return {
    "bootstrap.sh": bootstrapSh,
    "cloud-config": cloudConfig,
    apiserverEndpoints: stringify(ctx.apiserverEndpoints),
  };
}

/** Brings every manual-bootstrap Secret in line with the served groups; removes stale ones. */
export async function reconcileBootstrapSecrets(
  client: KubeClient,
  inputs: RenderInputs,
  served: ReadonlyMap<string, RenderedGroup>,
  opts: { now: number; log: Logger; namespace?: string },
): Promise<void> {
  const namespace = opts.namespace ?? NAMESPACE;
  const wanted = inputs.nodeGroups
    .filter((g) => hasManualBootstrap(g.spec?.nodeType) && served.has(g.metadata.name))
    .map((g) => g.metadata.name);
  const tokens = await pruneExpiredTokens(client, opts.now, opts.log);
  for (const group of wanted) {
    const token = await ensureGroupToken(client, group, opts.now, tokens);
    const data = manualBootstrapData(group, inputs.context, token);
    const encoded = Object.fromEntries(Object.entries(data).map(([k, v]) => [k, b64(v)]));
    const name = manualBootstrapSecretName(group);
    let current: KubeObject | undefined;
    try {
      current = await getSecret(client, namespace, name);
    } catch (err) {
      if (!isNotFound(err)) throw err;
    }
    const labels = manualBootstrapLabels(group, current?.metadata.labels);
    if (!current) {
      await createSecret(client, {
        apiVersion: "v1",
        kind: "Secret",
        type: "Opaque",
        metadata: { name, namespace, labels },
        data: encoded,
      });
      opts.log.info(
        { group, secret: `${namespace}/${name}`, expires: token.expiration },
        "manual bootstrap Secret created",
      );
      continue;
    }
    const cur = (current.data ?? {}) as Record<string, string>;
    if (sameRecord(cur, encoded) && sameRecord(current.metadata.labels ?? {}, labels)) continue;
    await updateSecret(client, { ...current, metadata: { ...current.metadata, labels }, data: encoded });
    opts.log.info(
      { group, secret: `${namespace}/${name}`, expires: token.expiration },
      "manual bootstrap Secret updated",
    );
  }
  const managed = await list(client, `/api/v1/namespaces/${namespace}/secrets`, {
    labelSelector: `${MANAGED_LABEL}=true`,
  });
  for (const s of managed.items) {
    const group = s.metadata.labels?.["node.deckhouse.io/group"] ?? "";
    if (wanted.includes(group)) continue;
    await client.request("DELETE", `/api/v1/namespaces/${namespace}/secrets/${s.metadata.name}`).catch((err) => {
      if (!isNotFound(err)) throw err;
    });
    opts.log.info(
      { group, secret: `${namespace}/${s.metadata.name}` },
      "manual bootstrap Secret removed (group gone or now CloudEphemeral)",
    );
  }
}
