import { EXIT, UsageError, type Command } from "../../lib/cli.ts";
import { Daemon } from "../daemon/daemon.ts";
import { agentArgv } from "../self.ts";
import { nodeName } from "../converge/node-name.ts";
import { resolveBundleFile } from "../converge/source.ts";
import { stateHost } from "../converge/state.ts";
import { CONVERGE_HELP, CONVERGE_OPTIONS, convergeOptions } from "./converge-options.ts";
import { spawn } from "node:child_process";
import type { KubeClient } from "../../lib/kube/client.ts";
import type { WireConnection } from "./connections.ts";
import { startResidentJobs, RESIDENT_HELP, RESIDENT_OPTIONS, type ResidentJobs } from "./resident-jobs.ts";
import { FENCING_HELP, FENCING_OPTIONS, fencingSettings, startFencing } from "../fencing/options.ts";

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

/**
 * Cluster clients for the daemon. A short-lived child resolves the kubeconfig (YAML) and the
 * bootstrap files; the daemon only loads the TLS client.
 */
async function connectViaChild(childArgs: string[]): Promise<KubeClient[]> {
  const pass: string[] = [];
  for (let i = 0; i < childArgs.length; i += 2) {
    const [flag, value] = [childArgs[i], childArgs[i + 1]];
    if (flag === "--root" || flag === "--kubeconfig" || flag === "--server") pass.push(flag as string, value as string);
  }
  const { stdout, stderr, code } = await new Promise<{ stdout: string; stderr: string; code: number | null }>(
    (resolve) => {
      const argv = agentArgv(["internal-connections", ...pass]);
      const child = spawn(argv[0] as string, argv.slice(1));
      let out = "";
      let err = "";
      child.stdout.on("data", (d) => (out += d));
      child.stderr.on("data", (d) => (err += d));
      child.on("close", (c) => resolve({ stdout: out, stderr: err, code: c }));
    },
  );
  if (code !== 0) {
    // The child logs JSON to stderr; its message says what is wrong with the credentials.
    const msg = stderr
      .split("\n")
      .map((l) => {
        try {
          return (JSON.parse(l) as { msg?: string }).msg;
        } catch {
          return l;
        }
      })
      .filter(Boolean)
      .pop();
    throw new Error(msg ?? `could not resolve cluster credentials (exit ${code})`);
  }
  const { KubeClient } = await import("../../lib/kube/client.ts");
  const wire = JSON.parse(stdout) as WireConnection[];
  const buf = (s?: string) => (s === undefined ? undefined : Buffer.from(s, "base64"));
  return wire.map(
    (w) =>
      new KubeClient(
        { ...w, ca: Buffer.from(w.ca, "base64"), cert: buf(w.cert), key: buf(w.key) },
        { timeoutMs: 10_000 },
      ),
  );
}

const run: Command = {
  summary: "run the agent: converge on change and every minute (the systemd service)",
  usage: "[--root DIR] [--bundle FILE|DIR] [--tick SECONDS] [options]",
  help: `Watches the node group's bundle and this Node, checks every --tick seconds (default 60),
and starts a converge ('bashible once', as a child process) when the checksum or the boot
changed, the Node asks for a reboot, or configuration_checksum was removed. A change starts
applying within seconds. Stops on SIGTERM/SIGINT.

Options:
      --tick SECONDS      safety-net interval (default 60)
${RESIDENT_HELP}

${CONVERGE_HELP}

${FENCING_HELP}`,
  options: { ...CONVERGE_OPTIONS, ...RESIDENT_OPTIONS, ...FENCING_OPTIONS, tick: { type: "string" } },
  takesRoot: true,
  needsRoot: "it converges the node: writes its files and sets their owners, under --root too",
  resident: true,
  async run({ values, root, log }) {
    // No shared pool for small Buffers in the resident process. A pool slab (8 KiB) lives until
    // its last slice dies, so it reaches the old generation, where only a mark-compact frees it,
    // and a quiet process rarely runs one: fencing's status files (every 5 s) used up a slab a
    // round and RSS grew ~5 MB an hour (`npm run bench -- soak`). Unpooled, a small Buffer dies
    // young and takes its memory with it.
    Buffer.poolSize = 0;
    const opts = convergeOptions(values, root, log); // validates the shared flags
    fencingSettings(values); // and the fencing flags, before anything starts
    const tick = values.tick === undefined ? 60 : Number(values.tick);
    if (!Number.isFinite(tick) || tick <= 0) throw new UsageError("--tick must be a positive number of seconds");
    const childArgs: string[] = [];
    for (const k of PASS_THROUGH) {
      const v = values[k];
      if (typeof v === "string") childArgs.push(`--${k}`, v);
    }
    for (const s of (values.server as string[] | undefined) ?? []) childArgs.push("--server", s);
    const host = stateHost(root);
    let clients: KubeClient[] = [];
    if (!opts.bundle || opts.kubeconfig) clients = await connectViaChild(childArgs);
    const node = await nodeName(host, opts.nodeName);
    let jobs: ResidentJobs | undefined;
    let fencing: ReturnType<typeof startFencing> | undefined;
    const daemon = new Daemon({
      root,
      log,
      childArgs,
      tickMs: tick * 1000,
      nodeName: node,
      nodeGroup: opts.nodeGroup,
      bundleFile: opts.bundle ? await resolveBundleFile(opts.bundle, opts.nodeGroup) : undefined,
      clients,
      reconnect: clients.length
        ? async () => {
            clients = await connectViaChild(childArgs); // early OOM's pod watch follows the new clients
            return clients;
          }
        : undefined,
      // A converge may have applied a bundle with new node group settings for the resident jobs.
      onConvergeEnd: () => {
        jobs?.refresh();
        fencing?.refresh();
      },
    });
    // Early OOM and the metrics endpoint (--early-oom, --metrics-address).
    jobs = await startResidentJobs({ values, root, log, nodeName: node, kube: () => clients[0] });
    // Fencing: its own loops beside converge and early OOM (--watchdog-device, --fencing-*).
    fencing = startFencing({ values, root, log, nodeName: node, kube: () => clients[0], metrics: jobs.registry });
    for (const sig of ["SIGTERM", "SIGINT"] as const) {
      process.once(sig, () => {
        log.info({ signal: sig }, "stopping");
        void jobs?.stop(); // first, so the pod watch ends before the daemon closes the clients under it
        // Fencing removes its label (2 s at most) before the daemon closes the clients, then disarms.
        void (fencing?.stop() ?? Promise.resolve()).finally(() => daemon.stop());
      });
    }
    try {
      await daemon.start();
      await daemon.done;
    } finally {
      await Promise.all([jobs?.stop(), fencing?.stop()]);
    }
    return EXIT.ok;
  },
};
export default run;
