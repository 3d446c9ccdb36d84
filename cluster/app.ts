// Wires the bundle server together: a source (Kubernetes API or a directory), the render loop,
// the store and watch hub, the HTTPS API, and — with a Kubernetes client — the checksums
// Secret, render-failure Events and manual-bootstrap Secrets.
import { X509Certificate } from "node:crypto";
import type { KubeClient } from "../lib/kube/client.ts";
import { createEvent } from "../lib/kube/api.ts";
import { isNotFound } from "../lib/kube/errors.ts";
import type { Logger } from "../lib/log/log.ts";
import { reconcileBootstrapSecrets } from "./bootstrap-secrets.ts";
import { NAMESPACE, writeChecksums } from "./checksums.ts";
import { RenderLoop } from "./render-loop.ts";
import { Metrics } from "./server/metrics.ts";
import { serve, type RunningServer } from "./server/server.ts";
import { BundleStore } from "./server/store.ts";
import { WatchHub } from "./server/watch.ts";
import { DirectorySource } from "./sources/directory.ts";
import { KubeSource } from "./sources/kube.ts";
import type { Source } from "./sources/types.ts";

export interface AppOptions {
  log: Logger;
  /** Inputs from here when set; otherwise from `kube`. */
  configDir?: string | undefined;
  kube?: KubeClient | undefined;
  namespace?: string;
  tls: { cert: Buffer; key: Buffer };
  /** Front-proxy CA(s) and allowed CNs (aggregated mode). */
  requestHeader?: { caPems: Buffer[]; allowedNames: string[] } | undefined;
  /** CA(s) for user client certificates (standalone mode). */
  clientCAPems?: Buffer[] | undefined;
  host?: string;
  port?: number;
  /** Write checksums / bootstrap Secrets / Events (needs `kube`); on by default with `kube`. */
  manageSecrets?: boolean;
  nodeCacheTtlMs?: number;
  now?: () => number;
}

export interface App {
  port: number;
  store: BundleStore;
  metrics: Metrics;
  loop: RenderLoop;
  /** Resolves after the next render pass triggered now (tests). */
  renderNow(): Promise<void>;
  stop(): Promise<void>;
}

const splitPems = (pems: Buffer[]): X509Certificate[] =>
  pems.flatMap((p) =>
    (p.toString("utf8").match(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g) ?? []).map(
      (c) => new X509Certificate(c),
    ),
  );

/**
 * A NodeGroupConfiguration's render state on itself: `status.error` and `status.failedNodeGroups`
 * (cleared when it renders again) and an Event, so `kubectl describe ngc <name>` names the error.
 */
async function reportConfiguration(
  kube: KubeClient,
  source: Source,
  name: string,
  error: string | undefined,
  groups: readonly string[],
  nowMs: number,
): Promise<void> {
  const ngc = source.snapshot().inputs.configurations.find((c) => c.metadata.name === name);
  const status = error
    ? { error: error.slice(0, 4000), failedNodeGroups: [...groups], lastTransitionTime: new Date(nowMs).toISOString() }
    : { error: null, failedNodeGroups: null, lastTransitionTime: new Date(nowMs).toISOString() };
  try {
    await kube.request(
      "PATCH",
      `/apis/deckhouse.io/v1alpha1/nodegroupconfigurations/${encodeURIComponent(name)}/status`,
      {
        body: { status },
      },
    );
  } catch (err) {
    // Deckhouse's own CRD has no status subresource (404): the Event below still tells.
    if (!isNotFound(err)) throw err;
  }
  await createEvent(kube, {
    namespace: "default",
    involved: { kind: "NodeGroupConfiguration", name, apiVersion: "deckhouse.io/v1alpha1", uid: ngc?.metadata.uid },
    reason: error ? "BashibleRenderFailed" : "BashibleRenderSucceeded",
    type: error ? "Warning" : "Normal",
    message: error
      ? `${error}; node groups ${groups.join(", ")} keep their last good bundle`.slice(0, 1000)
      : "renders again; the node groups it selects get their new bundles",
    component: "bashible-server",
  });
}

export async function startBundleServer(o: AppOptions): Promise<App> {
  const { log } = o;
  const namespace = o.namespace ?? NAMESPACE;
  const metrics = new Metrics();
  const store = new BundleStore();
  const hub = new WatchHub(store, (n) => metrics.watchers.set({}, n));
  let source: Source;
  if (o.configDir) {
    source = new DirectorySource(o.configDir, (err) =>
      log.error({ err: err.message }, "cannot re-read the config dir"),
    );
  } else if (o.kube) {
    source = new KubeSource(o.kube, log, { namespace, nodeCacheTtlMs: o.nodeCacheTtlMs });
  } else {
    throw new Error("startBundleServer: needs configDir or a Kubernetes client");
  }
  const kube = o.kube;
  const manage = (o.manageSecrets ?? true) && kube !== undefined;
  const now = o.now ?? Date.now;
  const loop = new RenderLoop(
    { source, store, metrics, log, now },
    manage && kube
      ? {
          onChecksums: (c) => writeChecksums(kube, c, { namespace }).then(() => undefined),
          onRenderError: async (group, err) => {
            const ng = source.snapshot().inputs.nodeGroups.find((g) => g.metadata.name === group);
            await createEvent(kube, {
              namespace: "default",
              involved: { kind: "NodeGroup", name: group, apiVersion: "deckhouse.io/v1", uid: ng?.metadata.uid },
              reason: "BashibleRenderFailed",
              type: "Warning",
              message: `${err.message}; nodes keep the last good bundle`.slice(0, 1000),
              component: "bashible-server",
            });
          },
          onRendered: (inputs, served) =>
            reconcileBootstrapSecrets(kube, inputs, served, { now: now(), log, namespace }),
          onConfigurationError: (name, error, groups) => reportConfiguration(kube, source, name, error, groups, now()),
        }
      : {},
  );

  let firstPass = false;
  await source.start(() => loop.trigger());
  await loop.runOnce();
  firstPass = true;
  // Bootstrap tokens age without any input changing: look again every 10 minutes.
  const renewTimer = manage ? setInterval(() => loop.trigger(), 10 * 60_000) : undefined;
  renewTimer?.unref();

  const requestHeaderCAs = splitPems(o.requestHeader?.caPems ?? []);
  const clientCAs = splitPems(o.clientCAPems ?? []);
  let server: RunningServer;
  try {
    server = await serve({
      store,
      hub,
      metrics,
      log,
      auth: { requestHeaderCAs, allowedNames: o.requestHeader?.allowedNames ?? [], clientCAs },
      nodeGroupOf: (n) => source.nodeGroupOf(n),
      ...(source.tokenGroupOf ? { tokenGroupOf: (id: string) => source.tokenGroupOf!(id) } : {}),
      ready: () => firstPass,
      cert: o.tls.cert,
      key: o.tls.key,
      clientCAPems: [...(o.requestHeader?.caPems ?? []), ...(o.clientCAPems ?? [])],
      host: o.host ?? "0.0.0.0",
      port: o.port ?? 9443,
    });
  } catch (err) {
    loop.stop();
    source.stop();
    throw err;
  }
  log.info(
    {
      port: server.port,
      source: o.configDir ? `dir:${o.configDir}` : "kubernetes",
      frontProxy: requestHeaderCAs.length > 0,
      clientCertificates: clientCAs.length > 0,
      groups: store.list("nodegroupbundles").map((e) => e.group),
    },
    "bundle server listening",
  );
  return {
    port: server.port,
    store,
    metrics,
    loop,
    renderNow: () => loop.runOnce(),
    async stop() {
      clearInterval(renewTimer);
      loop.stop();
      source.stop();
      await server.close();
    },
  };
}
