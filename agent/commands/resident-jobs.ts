// The resident agent's jobs beside converge: early OOM and the local metrics endpoint, with
// their `bashible run` options. Each is loaded only when on, so `--early-oom off
// --metrics-address off` costs the resident process nothing.
import path from "node:path";
import { readFile } from "node:fs/promises";
import { UsageError, type OptionSpec, type ParsedValues } from "../../lib/cli.ts";
import type { KubeClient } from "../../lib/kube/client.ts";
import type { Logger } from "../../lib/log/log.ts";
import { processMetrics, Registry } from "../../lib/prometheus.ts";
import type { EarlyOom, EarlyOomConfig } from "../early-oom/early-oom.ts";

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
                          InternalIP (default off: a port open off the node is the operator's
                          choice, and it needs the API server; e.g. internal:9650)
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
  const secureAddress = (values["metrics-secure-address"] as string | undefined) ?? "off";
  let server: { close(): Promise<void> } | undefined;
  let secure: { close(): Promise<void> } | undefined;
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
  if (secureAddress !== "off") {
    const { MetricsAddressError } = await import("../metrics-server.ts");
    const { startSecureMetrics } = await import("../metrics-secure.ts");
    // Waits for the kubelet's certificate and retries a taken address; never stops the agent.
    secure = await startSecureMetrics({
      registry,
      address: secureAddress,
      root,
      log,
      nodeName: o.nodeName,
      kube: o.kube,
      json,
    }).catch((err: Error) => {
      throw err instanceof MetricsAddressError
        ? new UsageError(`--metrics-secure-address: ${err.message.replace("metrics address", "the address")}`)
        : err;
    });
  }
  // The node group's setting (NodeGroup spec.earlyOom, in the applied bundle) refines the flags:
  // followed from disk, so a restarted agent applies it before it reaches the API.
  let follower: { close(): void; refresh(): void } | undefined;
  if (eo) {
    const { mergeNodeAndGroup } = await import("../early-oom/config.ts");
    const { followApplied, appliedNodeGroup } = await import("../fencing/config-source.ts");
    follower = followApplied(
      root,
      async (r) => (await appliedNodeGroup(r))?.earlyOom,
      (group) => {
        try {
          // The node's dry run or off wins over the group's (towards safety).
          const { config, overruled } = mergeNodeAndGroup(base, group);
          eo.configure(config);
          if (overruled.length)
            log.warn({ earlyOom: group, overruled }, `the node's own early OOM setting wins: ${overruled.join("; ")}`);
          else if (group) log.info({ earlyOom: group }, "early OOM follows the node group's setting");
        } catch (err) {
          log.warn(
            `the node group's early OOM setting is refused, keeping the last good one: ${(err as Error).message}`,
          );
        }
      },
      (err) => log.warn(`cannot read the applied bundle for early OOM: ${err.message}`),
    );
  }
  return {
    registry,
    earlyOom,
    refresh: () => follower?.refresh(),
    async stop() {
      follower?.close();
      await Promise.all([earlyOom?.stop(), server?.close(), secure?.close()]);
    },
  };
}
