// Whether a converge must run. Pure, cheap and dependency-free: the resident daemon calls it
// every tick without loading the converge machinery.

export interface GateInput {
  bundleChecksum: string;
  bootId: string;
  /** Content of /var/lib/bashible/configuration_checksum; undefined when removed. */
  appliedChecksum: string | undefined;
  appliedBootId: string | undefined;
  rebootRequested: boolean;
  /** Deckhouse's reboot flag is set: a step asked for a reboot that has not happened yet. */
  rebootPending?: boolean;
}

export interface GateDecision {
  run: boolean;
  reason: string;
}

export function decide(g: GateInput): GateDecision {
  if (g.appliedChecksum === undefined)
    return { run: true, reason: "configuration_checksum absent (first run or forced)" };
  if (g.rebootRequested) return { run: true, reason: "node annotated update.node.deckhouse.io/reboot" };
  if (g.rebootPending) return { run: true, reason: "a reboot is pending (flag reboot)" };
  if (g.appliedChecksum !== g.bundleChecksum) {
    return { run: true, reason: `checksum ${short(g.appliedChecksum)} → ${short(g.bundleChecksum)}` };
  }
  if (g.appliedBootId !== g.bootId) return { run: true, reason: "node rebooted since the last run" };
  return { run: false, reason: "configuration is in sync" };
}

const short = (s: string) => s.slice(0, 12);
