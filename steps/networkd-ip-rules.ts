// NetworkdIpRules (005_disable_manage_iprules): systemd-networkd, where it runs, removes routing
// policy rules it did not make when it (re)configures a link, and with them a CNI's. A drop-in
// turns that off (ManageForeignRoutingPolicyRules=no, systemd 249+; older versions ignore the
// key). networkd reads it when it starts, so a changed drop-in restarts networkd, only if it
// runs (`try-restart`: Deckhouse restarts it unconditionally, which would start a networkd the
// machine does not use and have it take over its links).
import { HOST_PREP, HOST_PREP_DIRS } from "../bundles/paths.ts";
import { planDir, planFile } from "../host/file-plan.ts";
import type { Primitive, Step } from "./types.ts";

export const DROP_IN = `# Managed by bashible (005_disable_manage_iprules): CNIs manage ip rules too; networkd must
# not remove the ones it did not make.
[Network]
ManageForeignRoutingPolicyRules=no
`;

const step: Step<"NetworkdIpRules"> = {
  kind: "NetworkdIpRules",
  async plan(_spec, host) {
    const changes: Primitive[] = [];
    const dir = await planDir(host, HOST_PREP_DIRS.networkd, { mode: 0o755 });
    if (dir) changes.push(dir);
    const file = await planFile(host, { path: HOST_PREP.networkdForeignRules, content: DROP_IN, mode: 0o644 });
    if (file) {
      changes.push(file, {
        kind: "command",
        argv: ["systemctl", "try-restart", "systemd-networkd.service"],
        recordInSandbox: true,
        summary: "restart systemd-networkd if it runs (it reads the drop-in at start)",
      });
    }
    return { changes, problems: [] };
  },
};

export default step;
