// RsyslogKubeletFilter (083_disable_rsyslog_for_kubelet): the kubelet logs a great deal, and
// journald keeps it already; where rsyslog runs (enabled, with /etc/rsyslog.d), a filter drops
// the kubelet's messages before they are written to /var/log/syslog or messages a second time.
// rsyslog reads it when it starts: a changed filter restarts it. Nothing is written where
// rsyslog is not enabled (Deckhouse's rule). `stop` is the current spelling of Deckhouse's `~`,
// which rsyslog 8 still reads but warns about.
import { HOST_PREP, PATHS } from "../bundles/paths.ts";
import { planFile } from "../host/file-plan.ts";
import type { Primitive, Step } from "./types.ts";

const UNIT = "rsyslog.service";
export const FILTER = `# Managed by bashible (083_disable_rsyslog_for_kubelet): journald keeps the kubelet's messages.
:programname, isequal, "kubelet" stop
`;

async function rsyslogEnabled(host: Parameters<Step<"RsyslogKubeletFilter">["plan"]>[1]): Promise<boolean> {
  if (!(await host.stat("/etc/rsyslog.d"))?.isDirectory) return false;
  // `systemctl enable rsyslog` links it into multi-user.target and as syslog.service.
  for (const link of [`${PATHS.unitDir}/multi-user.target.wants/${UNIT}`, `${PATHS.unitDir}/syslog.service`]) {
    if ((await host.stat(link))?.isSymlink) return true;
  }
  return false;
}

const step: Step<"RsyslogKubeletFilter"> = {
  kind: "RsyslogKubeletFilter",
  async plan(_spec, host) {
    if (!(await rsyslogEnabled(host))) return { changes: [], problems: [] };
    const changes: Primitive[] = [];
    const file = await planFile(host, { path: HOST_PREP.rsyslogKubelet, content: FILTER, mode: 0o644 });
    if (file) changes.push(file);
    return { changes, problems: [] };
  },
  services: () => [{ unit: UNIT, reads: [HOST_PREP.rsyslogKubelet], onChange: "restart" }],
};

export default step;
