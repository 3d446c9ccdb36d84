import { EXIT, UsageError, type Command } from "../cli/command.ts";
import { Host } from "../host/host.ts";
import { Daemon } from "../daemon/daemon.ts";
import { nodeName } from "../converge/node-name.ts";
import { resolveBundleFile } from "../converge/source.ts";
import { CONVERGE_HELP, CONVERGE_OPTIONS, convergeOptions } from "./converge-options.ts";
import type { KubeClient } from "../kube/client.ts";

const PASS_THROUGH = [
  "bundle",
  "node-name",
  "node-group",
  "kubeconfig",
  "retry-interval",
  "max-retries",
  "approval-timeout",
  "root",
  "log-format",
  "log-level",
];

const run: Command = {
  summary: "run the agent: converge on change and every minute (the systemd service)",
  usage: "[--root DIR] [--bundle FILE|DIR] [--tick SECONDS] [options]",
  help: `Watches the node group's bundle and this Node, checks every --tick seconds (default 60),
and starts a converge ('bashible once', as a child process) when the checksum or the boot
changed, the Node asks for a reboot, or configuration_checksum was removed. A change starts
applying within seconds. Stops on SIGTERM/SIGINT.

Options:
      --tick SECONDS      safety-net interval (default 60)

${CONVERGE_HELP}`,
  options: { ...CONVERGE_OPTIONS, tick: { type: "string" } },
  takesRoot: true,
  resident: true,
  async run({ values, root, log }) {
    const opts = convergeOptions(values, root, log); // validates the shared flags
    const tick = values.tick === undefined ? 60 : Number(values.tick);
    if (!Number.isFinite(tick) || tick <= 0) throw new UsageError("--tick must be a positive number of seconds");
    const childArgs: string[] = [];
    for (const k of PASS_THROUGH) {
      const v = values[k];
      if (typeof v === "string") childArgs.push(`--${k}`, v);
    }
    for (const s of (values.server as string[] | undefined) ?? []) childArgs.push("--server", s);
    // Host needs an OS profile only for steps; the daemon reads state files and talks to the API.
    const host = new Host(root, { id: "", versionId: "", family: "debian", packageManager: "apt" });
    let clients: KubeClient[] = [];
    if (!opts.bundle || opts.kubeconfig) {
      // Loaded only when talking to a cluster: TLS alone costs the process about 8 MB.
      const { clusterClients } = await import("../converge/connect.ts");
      clients = await clusterClients(host, { kubeconfig: opts.kubeconfig, servers: opts.servers });
    }
    const daemon = new Daemon({
      root,
      log,
      childArgs,
      tickMs: tick * 1000,
      nodeName: await nodeName(host, opts.nodeName),
      nodeGroup: opts.nodeGroup,
      bundleFile: opts.bundle ? await resolveBundleFile(opts.bundle, opts.nodeGroup) : undefined,
      clients,
    });
    for (const sig of ["SIGTERM", "SIGINT"] as const) {
      process.once(sig, () => {
        log.info({ signal: sig }, "stopping");
        daemon.stop();
      });
    }
    await daemon.start();
    await daemon.done;
    return EXIT.ok;
  },
};
export default run;
