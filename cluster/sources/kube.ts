// Inputs from the Kubernetes API: list + watch of NodeGroups, NodeGroupConfigurations and
// NodeUsers, and the cluster context from key input.yaml of Secret
// d8-cloud-instance-manager/bashible-apiserver-context (Deckhouse's names; key context.yaml of
// bashible-server-context, this project's earlier name, is read when that one is absent).
// Node → group lookups for authorization and bootstrap-token → group lookups go to the API
// with a short cache.
import { parse } from "yaml";
import type { KubeClient } from "../../lib/kube/client.ts";
import { getNode, type KubeObject } from "../../lib/kube/api.ts";
import { isNotFound } from "../../lib/kube/errors.ts";
import { Informer, type InformerEvent } from "../../lib/informer.ts";
import type { Logger } from "../../lib/log/log.ts";
import type {
  ClusterContext,
  NodeGroupConfigurationObject,
  NodeGroupObject,
  NodeUserObject,
} from "../render/inputs.ts";
import { GROUP_LABEL } from "./directory.ts";
import type { Source, SourceSnapshot } from "./types.ts";
import { BOOTSTRAP_TOKEN_GROUP_LABEL, SECRETS } from "../../bundles/names.ts";

export const CONTEXT_SECRET = SECRETS.context;
export const CONTEXT_KEY = SECRETS.contextKey;
/** Where the context is read from, in order of preference. */
const CONTEXT_SOURCES = [
  { secret: SECRETS.context, key: SECRETS.contextKey },
  { secret: SECRETS.legacyContext, key: SECRETS.legacyContextKey },
] as const;

export class KubeSource implements Source {
  private readonly client: KubeClient;
  private readonly log: Logger;
  private readonly namespace: string;
  private informers: Informer[] = [];
  private nodeGroups: Informer | undefined;
  private configurations: Informer | undefined;
  private users: Informer | undefined;
  private contextSecrets: Informer[] = [];
  private readonly tokenCache = new Map<string, { group: string | undefined; until: number }>();
  private readonly nodeCache = new Map<string, { group: string | undefined; until: number }>();
  private readonly nodeTtlMs: number;
  private lastContextError = "";

  constructor(client: KubeClient, log: Logger, opts: { namespace: string; nodeCacheTtlMs?: number }) {
    this.client = client;
    this.log = log;
    this.namespace = opts.namespace;
    // Nodes poll once a minute; a 5-minute cache keeps that to ~33 Node GETs/s at 10,000 nodes.
    this.nodeTtlMs = opts.nodeCacheTtlMs ?? 300_000;
  }

  async start(onChange: () => void): Promise<void> {
    const onEvent = (ev: InformerEvent<KubeObject>) => {
      // A status write (the controllers' NodeGroup status) leaves generation alone and changes
      // nothing that renders.
      if (ev.type === "MODIFIED") {
        const generation = ev.previous?.metadata.generation;
        if (generation !== undefined && generation === ev.object.metadata.generation) return;
      }
      onChange();
    };
    const mk = (path: string, fieldSelector?: string) =>
      new Informer({ client: this.client, path, log: this.log, onEvent, fieldSelector });
    this.nodeGroups = mk("/apis/deckhouse.io/v1/nodegroups");
    this.configurations = mk("/apis/deckhouse.io/v1alpha1/nodegroupconfigurations");
    this.users = mk("/apis/deckhouse.io/v1/nodeusers");
    this.contextSecrets = CONTEXT_SOURCES.map((c) =>
      mk(`/api/v1/namespaces/${this.namespace}/secrets`, `metadata.name=${c.secret}`),
    );
    this.informers = [this.nodeGroups, this.configurations, this.users, ...this.contextSecrets];
    await Promise.all(
      this.informers.map(async (i) => {
        try {
          await i.start();
        } catch (err) {
          if (isNotFound(err) && i.path.includes("deckhouse.io")) {
            throw new Error(
              `${i.path} is not served: install the CRDs (bashible server --install-crds, or kubectl apply -f cluster/crds/)`,
              { cause: err },
            );
          }
          throw err;
        }
      }),
    );
  }

  private context(): ClusterContext | undefined {
    let found: { secret: string; key: string; raw: string } | undefined;
    CONTEXT_SOURCES.forEach((c, i) => {
      const raw = (
        this.contextSecrets[i]?.objects.get(`${this.namespace}/${c.secret}`)?.data as Record<string, string> | undefined
      )?.[c.key];
      if (raw && !found) found = { ...c, raw };
    });
    if (!found) return undefined;
    try {
      const doc = parse(Buffer.from(found.raw, "base64").toString("utf8")) as Record<string, unknown>;
      const { apiVersion: _a, kind: _k, ...rest } = doc ?? {};
      this.lastContextError = "";
      return rest as unknown as ClusterContext;
    } catch (err) {
      const msg = `Secret ${this.namespace}/${found.secret}: ${found.key} is not valid YAML: ${(err as Error).message}`;
      if (msg !== this.lastContextError) this.log.error(msg);
      this.lastContextError = msg;
      return undefined;
    }
  }

  snapshot(): SourceSnapshot {
    const values = <T>(i: Informer | undefined) => [...(i?.objects.values() ?? [])] as unknown as T[];
    return {
      inputs: {
        nodeGroups: values<NodeGroupObject>(this.nodeGroups),
        configurations: values<NodeGroupConfigurationObject>(this.configurations),
        users: values<NodeUserObject>(this.users),
        context: this.context(),
      },
    };
  }

  async nodeGroupOf(node: string): Promise<string | undefined> {
    const now = Date.now();
    const hit = this.nodeCache.get(node);
    if (hit && hit.until > now) return hit.group;
    let group: string | undefined;
    try {
      group = (await getNode(this.client, node, { timeoutMs: 5000 })).metadata.labels?.[GROUP_LABEL];
    } catch (err) {
      if (!isNotFound(err)) throw err;
    }
    // A node that is not (yet) labelled is asked about again soon.
    this.nodeCache.set(node, { group, until: now + (group ? this.nodeTtlMs : 5000) });
    if (this.nodeCache.size > 50_000) this.nodeCache.delete(this.nodeCache.keys().next().value as string);
    return group;
  }

  async tokenGroupOf(tokenId: string): Promise<string | undefined> {
    if (!/^[a-z0-9]{6}$/.test(tokenId)) return undefined;
    const now = Date.now();
    const hit = this.tokenCache.get(tokenId);
    if (hit && hit.until > now) return hit.group;
    let group: string | undefined;
    try {
      const secret = await this.client.request<KubeObject>(
        "GET",
        `/api/v1/namespaces/kube-system/secrets/bootstrap-token-${tokenId}`,
        { timeoutMs: 5000 },
      );
      if ((secret as { type?: string }).type === "bootstrap.kubernetes.io/token") {
        group = secret.metadata.labels?.[BOOTSTRAP_TOKEN_GROUP_LABEL];
      }
    } catch (err) {
      if (!isNotFound(err)) throw err;
    }
    this.tokenCache.set(tokenId, { group, until: now + (group ? this.nodeTtlMs : 5000) });
    if (this.tokenCache.size > 10_000) this.tokenCache.delete(this.tokenCache.keys().next().value as string);
    return group;
  }

  /** Re-reads every input with a quorum list (a new leader renders from at least what its predecessor saw). */
  async resync(): Promise<void> {
    await Promise.all(this.informers.map((i) => i.resync()));
  }

  stop(): void {
    for (const i of this.informers) i.stop();
  }
}
