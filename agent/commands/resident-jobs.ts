// The resident agent's jobs beside converge: early OOM and the local metrics endpoint, with
// their `bashible run` options. Each is loaded only when on, so `--early-oom off
// --metrics-address off` costs the resident process nothing.
import path from "node:path";
import { readFile } from "node:fs/promises";
import { UsageError, type OptionSpec, type ParsedValues } from "../../lib/cli.ts";
import type { KubeClient } from "../../lib/kube/client.ts";
import type { Logger } from "../../lib/log/log.ts";
import { processMetrics, Registry } from "../../lib/prometheus.ts";
import { VERSION } from "../../lib/version.ts";
import type { EarlyOom, EarlyOomConfig } from "../early-oom/early-oom.ts";
import type { SecureMetricsOptions } from "../metrics-secure.ts";

export const RESIDENT_OPTIONS: OptionSpec = {
  "metrics-address": { type: "string" },
  "metrics-secure-address": { type: "string" },
  "early-oom": { type: "string" },
  "early-oom-config": { type: "string" },
  "proc-root": { type: "string" },
  "cgroup-root": { type: "string" },
};

export const RESIDENT_HELP = `      --metrics-address HOST:PORT|off  Prometheus metrics at /metrics and early OOM's state at
                          /early-oom (default 127.0.0.1:9650)
      --metrics-secure-address IP:PORT|internal:PORT|off  the same for an in-cluster
                          Prometheus: TLS with the kubelet's serving certificate, only to a bearer
                          token that may get nodes/metrics of this node; internal = the Node's
                          InternalIP; e.g. internal:9650 (default: the cluster's setting,
                          agent.metricsSecureAddress of its context, followed as bundles
                          change; without one off); given here, the node's choice wins
      --early-oom on|off|dry-run  kill the right pod under memory pressure (default on); dry-run
                          logs the decision and kills nothing
      --early-oom-config FILE  early OOM settings as JSON (docs/early-oom.md); defaults fill the rest
      --proc-root DIR     the /proc early OOM reads (default: /proc under --root)
      --cgroup-root DIR   the /sys/fs/cgroup early OOM reads (default: under --root)`;

export interface ResidentJobs {
  registry: Registry;
  earlyOom: EarlyOom | undefined;
  /** Re-read the node group's settings from the applied bundle (after a converge). */
  refresh(): void;
  stop(): Promise<void>;
}

export async function startResidentJobs(o: {
  values: ParsedValues;
  root: string;
  log: Logger;
  nodeName: string;
  kube: () => KubeClient | undefined;
}): Promise<ResidentJobs> {
  const { values, root, log } = o;
  const mode = (values["early-oom"] as string | undefined) ?? "on";
  if (mode !== "on" && mode !== "off" && mode !== "dry-run")
    throw new UsageError(`--early-oom must be on, off or dry-run, not '${mode}'`);
  let settings: Partial<EarlyOomConfig> = {};
  const file = values["early-oom-config"] as string | undefined;
  if (file) {
    try {
      settings = JSON.parse(await readFile(file, "utf8")) as Partial<EarlyOomConfig>;
    } catch (err) {
      throw new UsageError(`--early-oom-config ${file}: ${(err as Error).message}`);
    }
  }
  const address = (values["metrics-address"] as string | undefined) ?? "127.0.0.1:9650";

  const registry = new Registry();
  registry.collect(processMetrics);
  // Which release runs, as scraped: a fleet's self-update shows as the version moving node by node.
  registry.gauge("bashible_agent_info", "1, labelled with the running agent's version").set({ version: VERSION }, 1);
  let earlyOom: EarlyOom | undefined;
  // The node's own settings (flags and file), which the node group's refine.
  const base = { ...settings, ...(mode === "dry-run" ? { dryRun: true } : {}) };
  if (mode !== "off") {
    const { EarlyOom, EarlyOomConfigError } = await import("../early-oom/early-oom.ts");
    const procRoot = path.resolve((values["proc-root"] as string | undefined) ?? path.join(root, "proc"));
    earlyOom = new EarlyOom({
      procRoot,
      cgroupRoot: path.resolve((values["cgroup-root"] as string | undefined) ?? path.join(root, "sys/fs/cgroup")),
      sysrqPath: path.join(procRoot, "sysrq-trigger"),
      nodeName: o.nodeName,
      log,
      kube: o.kube,
      metrics: registry,
    });
    try {
      earlyOom.configure(base);
    } catch (err) {
      if (err instanceof EarlyOomConfigError) throw new UsageError(`--early-oom-config ${file}: ${err.message}`);
      throw err;
    }
  }
  // The node's flag, if given, wins over the cluster's setting (the applied bundle's
  // context.agent.metricsSecureAddress), as the node's early OOM settings do.
  const secureFlag = values["metrics-secure-address"] as string | undefined;
  let server: { close(): Promise<void> } | undefined;
  // What both listeners serve beside /metrics.
  const eo = earlyOom;
  const json: Record<string, () => unknown> = eo ? { "/early-oom": () => eo.status() } : {};
  if (address !== "off") {
    const { startMetricsEndpoint, MetricsAddressError } = await import("../metrics-server.ts");
    // A taken address never stops the agent: it retries, and `bashible status` says who holds it.
    server = await startMetricsEndpoint({
      registry,
      address,
      root,
      log,
      json,
    }).catch((err: Error) => {
      throw err instanceof MetricsAddressError ? new UsageError(err.message) : err;
    });
  }
  const secure = new SecureListener({ registry, root, log, nodeName: o.nodeName, kube: o.kube, json });
  if (secureFlag !== undefined) {
    await secure.moveTo(secureFlag).catch((err: Error) => {
      throw err.name === "MetricsAddressError"
        ? new UsageError(`--metrics-secure-address: ${err.message.replace("metrics address", "the address")}`)
        : err;
    });
  }
  // The applied bundle's settings (the node group's early OOM, the cluster's secure listener),
  // followed from disk, so a restarted agent applies them before it reaches the API.
  let follower: { close(): void; refresh(): void } | undefined;
  if (eo || secureFlag === undefined) {
    const merge = eo ? (await import("../early-oom/config.ts")).mergeNodeAndGroup : undefined;
    const { followApplied, appliedContext } = await import("../fencing/config-source.ts");
    // Early OOM takes its first reading whatever it is; the listener is already off when absent.
    const seen = { earlyOom: "", secure: "null" };
    const changed = (k: keyof typeof seen, v: unknown) => {
      const key = JSON.stringify(v ?? null);
      if (seen[k] === key) return false;
      seen[k] = key;
      return true;
    };
    follower = followApplied(
      root,
      async (r) => {
        const c = await appliedContext(r);
        return { earlyOom: c?.nodeGroup?.earlyOom, secure: c?.agent?.metricsSecureAddress };
      },
      (applied) => {
        if (eo && merge && changed("earlyOom", applied.earlyOom)) {
          const group = applied.earlyOom;
          try {
            // The node's dry run or off wins over the group's (towards safety).
            const { config, overruled } = merge(base, group);
            eo.configure(config);
            if (overruled.length)
              log.warn(
                { earlyOom: group, overruled },
                `the node's own early OOM setting wins: ${overruled.join("; ")}`,
              );
            else if (group) log.info({ earlyOom: group }, "early OOM follows the node group's setting");
          } catch (err) {
            log.warn(
              `the node group's early OOM setting is refused, keeping the last good one: ${(err as Error).message}`,
            );
          }
        }
        if (secureFlag === undefined && changed("secure", applied.secure)) {
          const to = applied.secure ?? "off";
          log.info(`authenticated metrics follow the cluster's setting: ${to}`);
          secure
            .moveTo(to)
            .catch((err: Error) =>
              log.warn(`the cluster's metrics listener setting '${to}' is refused: ${err.message}`),
            );
        }
      },
      (err) => log.warn(`cannot read the applied bundle for the node's settings: ${err.message}`),
    );
  }
  return {
    registry,
    earlyOom,
    refresh: () => follower?.refresh(),
    async stop() {
      follower?.close();
      await Promise.all([earlyOom?.stop(), server?.close(), secure.close()]);
    },
  };
}

/**
 * The authenticated listener (agent/metrics-secure.ts, loaded only once asked for), moved when
 * its address changes: one move at a time, the old listener closed before the new one binds.
 */
class SecureListener {
  private readonly options: Omit<SecureMetricsOptions, "address">;
  private current: { address: string; close(): Promise<void> } | undefined;
  private queue: Promise<unknown> = Promise.resolve();

  constructor(options: Omit<SecureMetricsOptions, "address">) {
    this.options = options;
  }

  /** Listens on `address` ("off" closes); rejects with MetricsAddressError for a bad one. */
  moveTo(address: string): Promise<void> {
    const move = this.queue.then(async () => {
      if (this.current?.address === address) return;
      await this.current?.close();
      this.current = undefined;
      if (address === "off") return;
      const { startSecureMetrics } = await import("../metrics-secure.ts");
      // Waits for the kubelet's certificate and retries a taken address; never stops the agent.
      const listener = await startSecureMetrics({ ...this.options, address });
      this.current = { address, close: () => listener.close() };
    });
    this.queue = move.catch(() => undefined);
    return move;
  }

  close(): Promise<void> {
    return this.moveTo("off");
  }
}
