// Early OOM's settings: the defaults and why (docs/early-oom.md has the long form), and the one
// check every setting goes through, so a bad value is refused with its name and the running
// configuration stays.

export interface EarlyOomConfig {
  enabled: boolean;
  /** Decide and log the victim, kill nothing. */
  dryRun: boolean;
  /** How often /proc/pressure/memory is read while anything is near a threshold (pace.ts)... */
  sampleIntervalMs: number;
  /** ...and while the node is calm: PSI and available memory far from the thresholds. */
  calmSampleIntervalMs: number;
  /** The stall share is measured over this trailing window, from the cumulative `total` counters. */
  windowMs: number;
  /** Full memory stall (every non-idle task waiting on memory) at or above this share of the window... */
  fullStallPercent: number;
  /** ...held at every sample for this long. */
  durationMs: number;
  /** Second signal, either of: MemAvailable at or below this share of MemTotal (0 turns it off)... */
  memAvailablePercent: number;
  /** ...or reclaim activity (pages scanned + working-set refaults per second over the stall) at or above this (0 turns it off). */
  reclaimPagesPerSecond: number;
  /** After a kill (or a dry-run decision), no new decision for this long, and the stall must build up again. */
  cooldownMs: number;
  /** When no pod can be chosen: "sysrq" lets the kernel's OOM killer choose (writes `f` to sysrq-trigger). */
  fallback: "sysrq" | "none";
  /** Pods in these namespaces are never killed. */
  excludeNamespaces: string[];
  /** Pods carrying any of these labels are never killed: `key` (any value) or `key=value`. */
  excludeLabels: string[];
  /**
   * Pods at or above this priority are killed only when nothing else is left. Pods at or above
   * system-cluster-critical are never killed whatever this says (the kubelet never evicts them),
   * so the default protects nothing more; lower it (to 1000000000, say) to hold back the
   * cluster's own high priority classes.
   */
  protectedPriority: number;
  /** How long a kill may take before it is reported as incomplete. */
  killTimeoutMs: number;
}

/** system-node-critical's value (scheduling.k8s.io). */
export const SYSTEM_NODE_CRITICAL = 2_000_001_000;
export const SYSTEM_CLUSTER_CRITICAL = 2_000_000_000;

export const DEFAULT_EARLY_OOM: Readonly<EarlyOomConfig> = Object.freeze({
  enabled: true,
  dryRun: false,
  sampleIntervalMs: 250,
  calmSampleIntervalMs: 750,
  windowMs: 1000,
  fullStallPercent: 30,
  durationMs: 3000,
  memAvailablePercent: 10,
  reclaimPagesPerSecond: 256,
  cooldownMs: 15_000,
  fallback: "sysrq",
  excludeNamespaces: [],
  excludeLabels: [],
  protectedPriority: SYSTEM_CLUSTER_CRITICAL,
  killTimeoutMs: 5000,
});

export class EarlyOomConfigError extends Error {
  override name = "EarlyOomConfigError";
}

type Numeric = {
  [K in keyof EarlyOomConfig]: EarlyOomConfig[K] extends number ? K : never;
}[keyof EarlyOomConfig];

const RANGES: Record<Numeric, [min: number, max: number]> = {
  sampleIntervalMs: [50, 10_000],
  calmSampleIntervalMs: [50, 10_000],
  windowMs: [100, 60_000],
  fullStallPercent: [0.1, 100],
  durationMs: [0, 300_000],
  memAvailablePercent: [0, 100],
  reclaimPagesPerSecond: [0, 1e12],
  cooldownMs: [0, 3_600_000],
  protectedPriority: [-2_147_483_648, 2_147_483_647],
  killTimeoutMs: [100, 600_000],
};

/**
 * The node's own settings (flags, --early-oom-config) refined by the node group's (the bundle),
 * where the node's choice wins towards safety: an operator who set dry run or off on this node
 * is never overruled by the group (dry run and off can only be added by either side, never
 * taken away by the group). Every other setting: the group's, else the node's.
 */
export function mergeNodeAndGroup(
  node: Partial<EarlyOomConfig>,
  group: Partial<EarlyOomConfig> | undefined,
): { config: Partial<EarlyOomConfig>; overruled: string[] } {
  const config: Partial<EarlyOomConfig> = { ...node, ...group };
  const overruled: string[] = [];
  if (node.enabled === false) {
    if (group?.enabled === true) overruled.push("enabled: the node turned early OOM off");
    config.enabled = false;
  }
  if (node.dryRun === true) {
    if (group?.dryRun === false) overruled.push("dryRun: the node runs early OOM in dry-run mode");
    config.dryRun = true;
  }
  return { config, overruled };
}

const LABEL_KEY = /^([a-z0-9]([-a-z0-9.]*[a-z0-9])?\/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;

/**
 * Fills the defaults into a partial configuration and checks every field. Unknown fields are
 * refused too: a misspelt threshold silently left at its default is worse than an error.
 */
export function resolveEarlyOomConfig(input: Partial<EarlyOomConfig> | undefined): EarlyOomConfig {
  if (input !== undefined && (typeof input !== "object" || input === null || Array.isArray(input)))
    throw new EarlyOomConfigError("early OOM configuration must be an object");
  const known = new Set(Object.keys(DEFAULT_EARLY_OOM));
  for (const k of Object.keys(input ?? {}))
    if (!known.has(k))
      throw new EarlyOomConfigError(`early OOM: unknown setting '${k}' (known: ${[...known].join(", ")})`);
  const c: EarlyOomConfig = {
    ...DEFAULT_EARLY_OOM,
    excludeNamespaces: [...DEFAULT_EARLY_OOM.excludeNamespaces],
    excludeLabels: [...DEFAULT_EARLY_OOM.excludeLabels],
    ...input,
  };
  for (const k of ["enabled", "dryRun"] as const)
    if (typeof c[k] !== "boolean") throw new EarlyOomConfigError(`early OOM: ${k} must be true or false`);
  for (const [k, [min, max]] of Object.entries(RANGES) as [Numeric, [number, number]][]) {
    const v = c[k];
    if (typeof v !== "number" || !Number.isFinite(v) || v < min || v > max)
      throw new EarlyOomConfigError(`early OOM: ${k} must be a number from ${min} to ${max}, got ${JSON.stringify(v)}`);
  }
  if (c.fallback !== "sysrq" && c.fallback !== "none")
    throw new EarlyOomConfigError(`early OOM: fallback must be "sysrq" or "none", got ${JSON.stringify(c.fallback)}`);
  if (c.windowMs < c.sampleIntervalMs)
    throw new EarlyOomConfigError(
      `early OOM: windowMs (${c.windowMs}) must be at least sampleIntervalMs (${c.sampleIntervalMs})`,
    );
  if (c.calmSampleIntervalMs < c.sampleIntervalMs)
    throw new EarlyOomConfigError(
      `early OOM: calmSampleIntervalMs (${c.calmSampleIntervalMs}) must be at least sampleIntervalMs (${c.sampleIntervalMs})`,
    );
  if (!Array.isArray(c.excludeNamespaces) || c.excludeNamespaces.some((n) => typeof n !== "string" || !n))
    throw new EarlyOomConfigError("early OOM: excludeNamespaces must be a list of namespace names");
  if (!Array.isArray(c.excludeLabels)) throw new EarlyOomConfigError("early OOM: excludeLabels must be a list");
  for (const l of c.excludeLabels) {
    const key = typeof l === "string" ? l.split("=")[0] : undefined;
    if (!key || !LABEL_KEY.test(key))
      throw new EarlyOomConfigError(`early OOM: excludeLabels entry ${JSON.stringify(l)} is not 'key' or 'key=value'`);
  }
  return c;
}
