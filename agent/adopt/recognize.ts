// Whose node this is: Deckhouse's bashible (its timer, its bashible.sh and bundle_steps), this
// agent's own (its daemon unit), one `bashible adopt` took over (the record), or neither. Reads
// files only, through the host (confined to the root), so it answers the same under --root.
import { DECKHOUSE, DECKHOUSE_ONLY_UNITS, ADOPTION } from "../../bundles/deckhouse-node.ts";
import { PATHS } from "../../bundles/paths.ts";
import type { Host } from "../../host/host.ts";
import { type AdoptionRecord, readRecord } from "./record.ts";

export type NodeKind = "deckhouse" | "adopting" | "adopted" | "agent" | "unknown";

/** One thing looked for, with where; `deckhouse` marks what only Deckhouse's bashible leaves. */
export interface Evidence {
  what: string;
  path: string;
  found: boolean;
}

export interface Recognition {
  kind: NodeKind;
  /** Why this kind, in a sentence that names the files. */
  reason: string;
  evidence: Evidence[];
  /** The checksum Deckhouse's bashible last applied (empty when none). */
  deckhouseChecksum: string;
  /** Deckhouse's d8-* and other units present on the node (unit files found). */
  deckhouseUnits: string[];
  record?: AdoptionRecord;
}

const UNIT_DIRS = ["/etc/systemd/system", "/lib/systemd/system", "/usr/lib/systemd/system"];

/** Deckhouse's bashible.service runs bashible.sh; this agent's runs `bashible run`. */
export const runsDeckhouseEntry = (unit: string | undefined) => unit?.includes(DECKHOUSE.entry) === true;
export const runsThisAgent = (unit: string | undefined) =>
  unit !== undefined && new RegExp(`^ExecStart=${PATHS.agentDir}/bashible run`, "m").test(unit);

async function unitFile(host: Host, unit: string): Promise<string | undefined> {
  for (const dir of UNIT_DIRS) if (await host.exists(`${dir}/${unit}`)) return `${dir}/${unit}`;
  return undefined;
}

export async function recognize(host: Host): Promise<Recognition> {
  const has = (p: string) => host.exists(p);
  const service = await host.readText(DECKHOUSE.serviceFile);
  const deckhouseService = runsDeckhouseEntry(service);
  const evidence: Evidence[] = [
    { what: "Deckhouse's bashible entry point", path: DECKHOUSE.entry, found: await has(DECKHOUSE.entry) },
    { what: "Deckhouse's bundle steps", path: DECKHOUSE.bundleSteps, found: await has(DECKHOUSE.bundleSteps) },
    { what: "the last applied checksum", path: DECKHOUSE.checksum, found: await has(DECKHOUSE.checksum) },
    { what: "Deckhouse's bashible timer", path: DECKHOUSE.timerFile, found: await has(DECKHOUSE.timerFile) },
    {
      what: "Deckhouse's bashible.service (runs bashible.sh)",
      path: DECKHOUSE.serviceFile,
      found: deckhouseService,
    },
    {
      what: "the kubelet's Deckhouse drop-in",
      path: DECKHOUSE.kubeletDropIn,
      found: await has(DECKHOUSE.kubeletDropIn),
    },
    { what: "the kubelet's kubeconfig", path: PATHS.kubeletKubeconfig, found: await has(PATHS.kubeletKubeconfig) },
    {
      what: "the kubelet's client certificate",
      path: PATHS.kubeletClientPem,
      found: await has(PATHS.kubeletClientPem),
    },
    { what: "the kubelet's configuration", path: PATHS.kubeletConfig, found: await has(PATHS.kubeletConfig) },
    {
      what: "containerd's Deckhouse base config",
      path: DECKHOUSE.containerdBase,
      found: await has(DECKHOUSE.containerdBase),
    },
    { what: "containerd's config", path: PATHS.containerdConfig, found: await has(PATHS.containerdConfig) },
    { what: "containerd's fragments", path: PATHS.containerdConfD, found: await has(PATHS.containerdConfD) },
    { what: "Deckhouse's bin directory", path: PATHS.binDir, found: await has(PATHS.binDir) },
    {
      what: "the API proxy as a static pod",
      path: DECKHOUSE.apiProxyManifest,
      found: await has(DECKHOUSE.apiProxyManifest),
    },
  ];
  const deckhouseUnits: string[] = [];
  for (const unit of [
    "sysctl-tuner.timer",
    "sysctl-tuner.service",
    ...DECKHOUSE_ONLY_UNITS,
    "kubernetes-api-proxy.service",
  ]) {
    const file = await unitFile(host, unit);
    if (file) deckhouseUnits.push(unit);
    evidence.push({ what: `unit ${unit}`, path: file ?? `${UNIT_DIRS[0]}/${unit}`, found: file !== undefined });
  }
  const checksum = ((await host.readText(DECKHOUSE.checksum)) ?? "").trim();
  const record = await readRecord(host);
  const base = { evidence, deckhouseChecksum: checksum, deckhouseUnits, ...(record ? { record } : {}) };
  if (record && record.state !== "reverted") {
    return record.state === "adopted"
      ? { ...base, kind: "adopted", reason: `adopted from Deckhouse at ${record.adoptedAt} (${ADOPTION.record})` }
      : {
          ...base,
          kind: "adopting",
          reason: `an adoption started at ${record.startedAt} did not finish (${ADOPTION.record}): 'bashible adopt --yes' resumes it, 'bashible adopt --revert' goes back`,
        };
  }
  const entry = evidence[0]!.found;
  const timer = evidence[3]!.found;
  if (entry && (timer || deckhouseService)) {
    return {
      ...base,
      kind: "deckhouse",
      reason: `Deckhouse's bashible manages this node (${DECKHOUSE.entry}${timer ? `, ${DECKHOUSE.timerFile}` : ""}${deckhouseService ? `, ${DECKHOUSE.serviceFile} runs bashible.sh` : ""})`,
    };
  }
  if (runsThisAgent(service)) {
    return {
      ...base,
      kind: "agent",
      reason: `this agent already runs this node (${DECKHOUSE.serviceFile} runs ${PATHS.agentDir}/bashible)`,
    };
  }
  return {
    ...base,
    kind: "unknown",
    reason: `neither Deckhouse's bashible nor this agent manages this node: no ${DECKHOUSE.entry} with ${DECKHOUSE.timerFile} or a ${DECKHOUSE.serviceFile} that runs it, and no ${DECKHOUSE.serviceFile} of this agent`,
  };
}
