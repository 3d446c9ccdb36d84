// Journald (084_configure_journald): how long journald keeps what it has (MaxRetentionSec) and
// how often it starts a new journal file (MaxFileSec), Deckhouse's 24 h and 14 days by default.
// A drop-in in journald.conf.d rather than Deckhouse's rewrite of /etc/systemd/journald.conf:
// the distribution's file stays as it shipped (and upgrades of it apply), and cleanup removes
// one file. A changed drop-in restarts systemd-journald, which reads it only at start.
import { HOST_PREP, HOST_PREP_DIRS } from "../bundles/paths.ts";
import { planDir, planFile } from "../host/file-plan.ts";
import type { Primitive, Step } from "./types.ts";

const UNIT = "systemd-journald.service";

export function renderJournald(spec: { maxFileSec: number; maxRetentionSec: number }): string {
  return `# Managed by bashible (084_configure_journald).
[Journal]
MaxFileSec=${spec.maxFileSec}s
MaxRetentionSec=${spec.maxRetentionSec}s
`;
}

const step: Step<"Journald"> = {
  kind: "Journald",
  async plan(spec, host) {
    const changes: Primitive[] = [];
    const dir = await planDir(host, HOST_PREP_DIRS.journald, { mode: 0o755 });
    if (dir) changes.push(dir);
    const file = await planFile(host, { path: HOST_PREP.journald, content: renderJournald(spec), mode: 0o644 });
    if (file) changes.push(file);
    return { changes, problems: [] };
  },
  services: () => [{ unit: UNIT, reads: [HOST_PREP.journald], onChange: "restart" }],
};

export default step;
