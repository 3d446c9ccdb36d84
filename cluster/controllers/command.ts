// `bashible controllers`: the update controllers without the bundle server, leader-elected
// through the same Lease the server's embedded ones use, so the two never both act.
import { EXIT, UsageError, type Command } from "../../lib/cli.ts";
import { KubeClient } from "../../lib/kube/client.ts";
import { loadKubeconfig, type KubeConnection } from "../../lib/kube/kubeconfig.ts";
import { LEASES, NAMESPACE } from "../../bundles/names.ts";
import { inClusterConnection } from "../in-cluster.ts";
import { DEFAULTS } from "./controller.ts";
import { runControllers } from "./run.ts";
import { CONTROLLER_METRICS } from "./metrics.ts";

/** Seconds from a flag (fractions allowed, for tests), as milliseconds. */
export function secondsFlag(v: string | undefined, flag: string, fallbackMs: number): number {
  if (v === undefined) return fallbackMs;
  const n = Number(v);
  if (!Number.isFinite(n) || n <= 0) throw new UsageError(`--${flag} '${v}' is not a positive number of seconds`);
  return Math.round(n * 1000);
}

export const CONTROLLER_FLAGS_HELP = `      --eviction-retry S      wait between attempts at an eviction a PodDisruptionBudget refused
                              (default ${DEFAULTS.evictionRetryMs / 1000})
      --drain-timeout S       delete the pods a drain could not evict after this long, unless the
                              NodeGroup sets nodeDrainTimeoutSecond (default ${DEFAULTS.drainTimeoutMs / 1000})
      --lease-duration S      leader election: a dead leader is replaced this long after its last
                              renewal (default 10)`;

export const CONTROLLER_FLAGS = {
  "eviction-retry": { type: "string" },
  "drain-timeout": { type: "string" },
  "lease-duration": { type: "string" },
} as const;

export function controllerSettings(v: Record<string, unknown>) {
  const str = (k: string) => v[k] as string | undefined;
  return {
    evictionRetryMs: secondsFlag(str("eviction-retry"), "eviction-retry", DEFAULTS.evictionRetryMs),
    drainTimeoutMs: secondsFlag(str("drain-timeout"), "drain-timeout", DEFAULTS.drainTimeoutMs),
    leaseDurationSeconds: secondsFlag(str("lease-duration"), "lease-duration", 10_000) / 1000,
  };
}

/** The controllers' metrics over plain HTTP, for `bashible controllers` run without the server. */
async function serveMetrics(address: string): Promise<{ address: string; close(): Promise<void> }> {
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:[\]]*)):(\d{1,5})$/.exec(address);
  const port = Number(m?.[3]);
  if (!m || port > 65535) throw new UsageError(`--metrics-address must be HOST:PORT, got '${address}'`);
  const host = m[1] ?? (m[2] || "0.0.0.0");
  const { createServer } = await import("node:http");
  const server = createServer((req, res) => {
    if ((req.url ?? "").split("?")[0] !== "/metrics") return void res.writeHead(404).end("try /metrics\n");
    res.writeHead(200, { "content-type": "text/plain; version=0.0.4; charset=utf-8" }).end(CONTROLLER_METRICS.text());
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => resolve());
  });
  const a = server.address();
  return {
    address: typeof a === "object" && a ? `${a.address}:${a.port}` : address,
    close: () =>
      new Promise((r) => {
        server.close(() => r());
        server.closeAllConnections(); // an idle keep-alive scraper must not hold the shutdown
      }),
  };
}

const command: Command = {
  summary: "update and disruption approval, drains (leader-elected; also part of `bashible server`)",
  usage: "--kubeconfig FILE | --in-cluster [options]",
  help: `Approves node updates (at most spec.update.maxConcurrent per group, only while the group's
nodes are Ready), approves disruptions by spec.disruptions.approvalMode (Manual: never;
Automatic: cordon, drain, approve, inside automatic.windows; RollingUpdate: mark the node
for replacement), drains nodes that carry update.node.deckhouse.io/draining, and keeps
NodeGroup status and Events on Nodes current. Runs on the replica holding Lease
${NAMESPACE}/${LEASES.controllers}; \`bashible server\` runs the same unless --no-controllers.

      --kubeconfig FILE       credentials (or --in-cluster for the pod's service account)
      --in-cluster
      --namespace NS          where the Lease and Secret configuration-checksums are (default ${NAMESPACE})
      --metrics-address HOST:PORT
                              serve the controllers' metrics (node_group_node_status and Deckhouse's
                              other names) at /metrics over plain HTTP (default: not served; the
                              bundle server serves them on its own /metrics)
${CONTROLLER_FLAGS_HELP}

See docs/controllers.md.`,
  options: {
    kubeconfig: { type: "string" },
    "in-cluster": { type: "boolean" },
    namespace: { type: "string" },
    "metrics-address": { type: "string" },
    ...CONTROLLER_FLAGS,
  },
  async run({ values, log }) {
    const v = values as Record<string, string | boolean | undefined>;
    let connection: KubeConnection;
    if (typeof v.kubeconfig === "string") connection = await loadKubeconfig(v.kubeconfig);
    else if (v["in-cluster"]) connection = await inClusterConnection();
    else throw new UsageError("give --kubeconfig FILE or --in-cluster");
    const s = controllerSettings(v);
    // A watch per draining node holds a connection each.
    const client = new KubeClient(connection, { userAgent: "bashible-controller", maxSockets: 64 });
    const leadership = runControllers({
      client,
      log,
      namespace: (v.namespace as string | undefined) ?? NAMESPACE,
      leaseDurationSeconds: s.leaseDurationSeconds,
      controller: { evictionRetryMs: s.evictionRetryMs, drainTimeoutMs: s.drainTimeoutMs },
    });
    log.info({ identity: leadership.identity, lease: LEASES.controllers }, "controllers: candidate for the lease");
    const metrics = typeof v["metrics-address"] === "string" ? await serveMetrics(v["metrics-address"]) : undefined;
    if (metrics) log.info({ address: metrics.address }, "controllers' metrics at /metrics");
    await new Promise<void>((resolve) => {
      process.once("SIGTERM", () => resolve());
      process.once("SIGINT", () => resolve());
    });
    log.info("stopping");
    await leadership.stop();
    await metrics?.close();
    client.close();
    return EXIT.ok;
  },
};

export default command;
