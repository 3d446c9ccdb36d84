// Manual bootstrap for Static and CloudStatic groups: Secret
// d8-cloud-instance-manager/manual-bootstrap-for-<group> with bootstrap.sh, cloud-config and
// apiserverEndpoints, carrying a bootstrap token scoped to the group (auth-extra-groups
// system:bootstrappers:d8-node-manager:<group>, so it reads only bootstrap/<group>). Tokens
// live 4 hours and are replaced once less than 3 hours remain, so a copied Secret always
// has at least 3 hours left.
import { randomBytes } from "node:crypto";
import { stringify } from "yaml";
import type { KubeClient } from "../lib/kube/client.ts";
import { createSecret, getSecret, list, updateSecret, type KubeObject } from "../lib/kube/api.ts";
import { isNotFound } from "../lib/kube/errors.ts";
import type { Logger } from "../lib/log/log.ts";
import { NAMESPACE } from "./checksums.ts";
import type { RenderInputs } from "./render/inputs.ts";
import type { RenderedGroup } from "./render/render.ts";
import { renderTemplate } from "./render/templates.ts";
import { BOOTSTRAP_GROUP_PREFIX } from "./server/auth.ts";

export const TOKEN_TTL_MS = 4 * 3600_000;
export const TOKEN_RENEW_BELOW_MS = 3 * 3600_000;
const TOKEN_GROUP_LABEL = "bashible.deckhouse.io/bootstrap-token-for";
const MANAGED_LABEL = "bashible.deckhouse.io/manual-bootstrap";
const MANUAL_TYPES = new Set(["Static", "CloudStatic"]);

export const manualBootstrapSecretName = (group: string) => `manual-bootstrap-for-${group}`;

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

/** A valid token for the group with ≥ 3 h left, creating a fresh 4 h one when needed. */
export async function ensureGroupToken(client: KubeClient, group: string, now: number): Promise<GroupToken> {
  const existing = await list(client, "/api/v1/namespaces/kube-system/secrets", {
    labelSelector: `${TOKEN_GROUP_LABEL}=${group}`,
  });
  const usable = existing.items
    .map((s) => {
      const d = (s.data ?? {}) as Record<string, string>;
      return { id: decode(d["token-id"]), secret: decode(d["token-secret"]), expiration: decode(d.expiration) };
    })
    .filter((t) => t.id && t.secret && Date.parse(t.expiration) - now >= TOKEN_RENEW_BELOW_MS)
    .sort((a, b) => Date.parse(b.expiration) - Date.parse(a.expiration))[0];
  if (usable) return { token: `${usable.id}.${usable.secret}`, expiration: usable.expiration };
  const id = alnum(6);
  const secret = alnum(16);
  const expiration = new Date(now + TOKEN_TTL_MS).toISOString().replace(/\.\d+Z$/, "Z");
  await createSecret(client, {
    apiVersion: "v1",
    kind: "Secret",
    type: "bootstrap.kubernetes.io/token",
    metadata: { name: `bootstrap-token-${id}`, namespace: "kube-system", labels: { [TOKEN_GROUP_LABEL]: group } },
    stringData: {
      description: `bashible: manual bootstrap of node group ${group}`,
      "token-id": id,
      "token-secret": secret,
      expiration,
      "usage-bootstrap-authentication": "true",
      "auth-extra-groups": `${BOOTSTRAP_GROUP_PREFIX}${group}`,
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
    .filter((g) => MANUAL_TYPES.has(g.spec?.nodeType) && served.has(g.metadata.name))
    .map((g) => g.metadata.name);
  for (const group of wanted) {
    const token = await ensureGroupToken(client, group, opts.now);
    const data = manualBootstrapData(group, inputs.context, token);
    const encoded = Object.fromEntries(Object.entries(data).map(([k, v]) => [k, b64(v)]));
    const name = manualBootstrapSecretName(group);
    let current: KubeObject | undefined;
    try {
      current = await getSecret(client, namespace, name);
    } catch (err) {
      if (!isNotFound(err)) throw err;
    }
    const labels = { [MANAGED_LABEL]: "true", "node.deckhouse.io/group": group };
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
    if (Object.keys(encoded).every((k) => cur[k] === encoded[k])) continue;
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
      "manual bootstrap Secret removed (group gone or not Static)",
    );
  }
}
