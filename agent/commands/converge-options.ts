// Options shared by the converge commands (run, once, plan; plan takes only the source options).
import type { OptionSpec, ParsedValues } from "../../lib/cli.ts";
import { UsageError } from "../../lib/cli.ts";
import type { Logger } from "../../lib/log/log.ts";
import type { ConvergeOptions } from "../converge/converge.ts";

/** Where the bundle comes from and who the node is: every converge command, the dry run too. */
export const SOURCE_OPTIONS: OptionSpec = {
  bundle: { type: "string" },
  "node-name": { type: "string" },
  "node-group": { type: "string" },
  kubeconfig: { type: "string" },
  server: { type: "string", multiple: true },
};

/** How a run applies: retries and approval. A dry run (plan) retries nothing and asks no one. */
export const APPLY_OPTIONS: OptionSpec = {
  "retry-interval": { type: "string" },
  "max-retries": { type: "string" },
  "approval-timeout": { type: "string" },
};

/** The options of the commands that apply a bundle (run, once). */
export const CONVERGE_OPTIONS: OptionSpec = { ...SOURCE_OPTIONS, ...APPLY_OPTIONS };

export const SOURCE_HELP = `Where the bundle comes from:
      --bundle FILE|DIR   local mode: converge to this bundle file (DIR: DIR/<group>.json or its
                          only *.json); no bundle server. Add --kubeconfig to still report to a cluster.
      --kubeconfig FILE   credentials to use (default: /etc/kubernetes/kubelet.conf under the root,
                          else /var/lib/bashible/bootstrap-token + ca.crt)
      --server URL        API server for the bootstrap-token shape (repeatable)
      --node-name NAME    this node's name (default: $NODE_NAME, then the hostname)
      --node-group NAME   the node group (default: the Node's node.deckhouse.io/group label)`;

export const APPLY_HELP = `Retries and approval:
      --retry-interval S  seconds between attempts of a failing step (default 2)
      --max-retries N     attempts per step before the run stops (default 10)
      --approval-timeout S  how long one run waits for update approval (default 600)`;

export const CONVERGE_HELP = `${SOURCE_HELP}\n${APPLY_HELP}`;

function seconds(v: unknown, flag: string, fallback: number): number {
  if (v === undefined) return fallback;
  const n = Number(v);
  if (!Number.isFinite(n) || n < 0) throw new UsageError(`--${flag} must be a number of seconds, got '${String(v)}'`);
  return n;
}

export function convergeOptions(values: ParsedValues, root: string, log: Logger): ConvergeOptions {
  const maxRetries = values["max-retries"] === undefined ? 10 : Number(values["max-retries"]);
  if (!Number.isInteger(maxRetries) || maxRetries < 1) throw new UsageError("--max-retries must be a whole number ≥ 1");
  return {
    root,
    log,
    bundle: values.bundle as string | undefined,
    nodeName: values["node-name"] as string | undefined,
    nodeGroup: values["node-group"] as string | undefined,
    kubeconfig: values.kubeconfig as string | undefined,
    servers: values.server as string[] | undefined,
    retry: { intervalMs: seconds(values["retry-interval"], "retry-interval", 2) * 1000, maxAttempts: maxRetries },
    approvalTimeoutMs: seconds(values["approval-timeout"], "approval-timeout", 600) * 1000,
  };
}
