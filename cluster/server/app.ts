// Wires the bundle server together: a source (Kubernetes API or a directory), the render loop,
// the store and watch hub, the HTTPS API, and — with a Kubernetes client — the checksums
// Secret, render-failure Events and manual-bootstrap Secrets.
//
// With a Kubernetes client every replica renders and serves; the writers (checksums and
// manual-bootstrap Secrets, render Events) run only on the replica holding Lease
// bashible-server, and the update controllers only on the one holding bashible-controllers.
// Replicas serve a group at the checksum the Secret names (checksum-gate.ts), so a node sees
// the same bundle whichever replica answers, and never an older one after its watch moves.
import { X509Certificate } from "node:crypto";
import { KubeClient } from "../../lib/kube/client.ts";
import { createEvent } from "../../lib/kube/api.ts";
import { isNotFound } from "../../lib/kube/errors.ts";
import type { Logger } from "../../lib/log/log.ts";
import { reconcileBootstrapSecrets } from "./bootstrap-secrets.ts";
import { EVENTS, LEASES, NAMESPACE } from "../../bundles/names.ts";
import { writeChecksums } from "./checksums.ts";
import { RenderLoop } from "./render-loop.ts";
import { Metrics } from "./metrics.ts";
import { MetricsAuthorizer, nonResourceAccess } from "../../lib/metrics-auth.ts";
import { serve, type RunningServer } from "./server.ts";
import { providerPermanentGroups } from "./conversion-webhook.ts";
import type { ListenerLimits } from "../listener-limits.ts";
import { BundleStore } from "./store.ts";
import { WatchHub } from "./watch.ts";
import { ChecksumGate } from "./checksum-gate.ts";
import { freshness } from "./freshness.ts";
import { whileLeading, type Leadership, type LeaseTiming } from "../leadership.ts";
import { sleep } from "../../lib/sleep.ts";
import { Backoff } from "../../lib/backoff.ts";
import { runControllers, type RunControllersOptions } from "../controllers/run.ts";
import { DirectorySource } from "../sources/directory.ts";
import { KubeSource } from "../sources/kube.ts";
import type { Source } from "../sources/types.ts";

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
  /**
   * Write checksums / bootstrap Secrets / Events (needs `kube`), as the leader of Lease
   * bashible-server; on by default with `kube`. Off: a read-only replica that serves what it
   * renders and elects nothing.
   */
  manageSecrets?: boolean;
  /** The update controllers (leader-elected; needs `kube` and manageSecrets); on by default. */
  controllers?: Omit<RunControllersOptions, "client" | "log" | "namespace"> | false;
  /** Leader election timing for both Leases. */
  lease?: LeaseTiming;
  /** Let several server processes on one host listen on the same port. */
  reusePort?: boolean;
  /** The listener's connection cap and timeouts (cluster/listener-limits.ts). */
  limits?: Partial<ListenerLimits>;
  nodeCacheTtlMs?: number;
  now?: () => number;
}

export interface App {
  port: number;
  store: BundleStore;
  metrics: Metrics;
  loop: RenderLoop;
  /** Whether this replica leads the writers (always true without leader election). */
  readonly leading: boolean;
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
    reason: error ? EVENTS.renderFailed : EVENTS.renderSucceeded,
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
  const kube = o.kube;
  const manage = (o.manageSecrets ?? true) && kube !== undefined;
  const store = new BundleStore({ revisions: manage });
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
  const now = o.now ?? Date.now;
  // Replicas: serve what the Secret names, and write only while leading.
  const gate = manage && kube ? new ChecksumGate(kube, namespace, log) : undefined;
  let leading = false;
  const loop = new RenderLoop(
    { source, store, metrics, log, now, gate },
    manage && kube
      ? {
          onChecksums: async (c) => {
            if (!leading) return false;
            await writeChecksums(kube, c, { namespace, onSecret: (s) => gate?.note(s) });
            return true;
          },
          onRenderError: async (group, err) => {
            if (!leading) return;
            const ng = source.snapshot().inputs.nodeGroups.find((g) => g.metadata.name === group);
            await createEvent(kube, {
              namespace: "default",
              involved: { kind: "NodeGroup", name: group, apiVersion: "deckhouse.io/v1", uid: ng?.metadata.uid },
              reason: EVENTS.renderFailed,
              type: "Warning",
              message: `${err.message}; nodes keep the last good bundle`.slice(0, 1000),
              component: "bashible-server",
            });
          },
          onRendered: async (inputs, served) => {
            if (leading) await reconcileBootstrapSecrets(kube, inputs, served, { now: now(), log, namespace });
          },
          onConfigurationError: async (name, error, groups) => {
            if (leading) await reportConfiguration(kube, source, name, error, groups, now());
          },
        }
      : {},
  );

  let firstPass = false;
  await gate?.start();
  await source.start(() => loop.trigger());
  await loop.runOnce();
  firstPass = true;

  const leaderships: Leadership[] = [];
  const clients: KubeClient[] = [];
  if (manage && kube) {
    leaderships.push(
      whileLeading({ client: kube, namespace, name: LEASES.server, log, ...o.lease }, (signal) => {
        // Render from inputs at least as new as the last leader's before writing anything, so
        // the Secret never goes back to an older checksum.
        void (async () => {
          // Until every input is re-read nothing is written: a cache that may be older than
          // the last leader's writes could put an older checksum back.
          const backoff = new Backoff({ baseMs: 1000, maxMs: 10_000 });
          while (source.resync && !signal.aborted) {
            try {
              await source.resync();
              break;
            } catch (err) {
              const retryInMs = backoff.next();
              log.warn({ err: (err as Error).message, retryInMs }, "cannot re-read the inputs; not writing yet");
              await sleep(retryInMs, signal);
            }
          }
          if (signal.aborted) return;
          leading = true;
          loop.forgetWrites();
          await loop.runOnce();
        })();
        signal.addEventListener("abort", () => {
          leading = false;
        });
      }),
    );
    if (o.controllers !== false) {
      // Their own connections: a watch per draining node must not queue the server's requests.
      const client = new KubeClient(kube.connection, { userAgent: "bashible-controller", maxSockets: 64 });
      clients.push(client);
      leaderships.push(runControllers({ ...o.lease, ...o.controllers, client, log, namespace }));
    }
  }
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
      reusePort: o.reusePort,
      limits: o.limits,
      fresh: gate ? freshness(store, gate, loop) : undefined,
      conversion: kube ? { permanentGroups: () => providerPermanentGroups(kube) } : {},
      // In a cluster, /metrics as Deckhouse's kube-rbac-proxy guards it: get on /metrics.
      ...(kube
        ? { metricsAuth: new MetricsAuthorizer({ kube: () => kube, access: nonResourceAccess("/metrics") }) }
        : {}),
    });
  } catch (err) {
    await Promise.all(leaderships.map((l) => l.stop()));
    loop.stop();
    source.stop();
    gate?.stop();
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
    get leading() {
      return gate ? leading : true;
    },
    renderNow: () => loop.runOnce(),
    async stop() {
      clearInterval(renewTimer);
      // Give the Leases up first, so another replica takes over at once.
      await Promise.all(leaderships.map((l) => l.stop()));
      loop.stop();
      source.stop();
      gate?.stop();
      for (const c of clients) c.close();
      await server.close();
    },
  };
}
