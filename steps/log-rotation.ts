// LogRotation (085_rotate_bashible_logs): the agent's logs in /var/log/d8/bashible (each step's
// log, bootstrap.log) are rotated by the distribution's logrotate (its daily timer or cron job)
// once one is bigger than maxSizeMiB, keeping `keep` compressed copies. `copytruncate`: the
// agent and bootstrap.sh append to the live file and never reopen it. The file is checked with
// `logrotate --debug` (parses, rotates nothing) before it replaces the live one. Deckhouse has no
// such step: its bashible logs to the journal only.
import { HOST_PREP, PATHS } from "../bundles/paths.ts";
import { planFile } from "../host/file-plan.ts";
import type { Primitive, Step } from "./types.ts";

export function renderLogrotate(spec: { maxSizeMiB: number; keep: number }): string {
  return `# Managed by bashible (085_rotate_bashible_logs): the agent's step logs and bootstrap.log.
${PATHS.logDir}/*.log {
    size ${spec.maxSizeMiB}M
    rotate ${spec.keep}
    compress
    delaycompress
    missingok
    notifempty
    copytruncate
    su root root
}
`;
}

const step: Step<"LogRotation"> = {
  kind: "LogRotation",
  async plan(spec, host) {
    const changes: Primitive[] = [];
    const file = await planFile(host, {
      path: HOST_PREP.logrotate,
      content: renderLogrotate(spec),
      mode: 0o644,
      check: ["logrotate", "--debug", "--state", "/dev/null", "{}"],
    });
    if (file) changes.push(file);
    return { changes, problems: [] };
  },
};

export default step;
