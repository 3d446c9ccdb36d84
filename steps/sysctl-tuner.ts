// SysctlTuner (041_configure_sysctl_tuner): Deckhouse's kernel parameters for a Kubernetes node
// (forwarding, bridge-nf-call, conntrack, inotify, network buffers, vm and kernel values;
// kernel.panic 0 on a fencing group). One sysctl.d file holds them all, so systemd-sysctl sets
// them at every boot; now, the keys whose live value differs are set with sysctl -w; and
// Deckhouse's sysctl-tuner.timer re-asserts the file every 10 minutes (1 minute after boot,
// then 10 after each run).
//
// Why a timer of its own and not the agent's minute tick: other software changes these values
// behind the agent's back (a CNI or cloud-init), the tick only re-plans when the bundle or the
// boot changed (the gate), and the timer keeps working while the agent is stopped or upgraded.
// It also catches what appears after boot: net.netfilter.nf_conntrack_max exists once
// nf_conntrack is loaded (by the first iptables rule), after systemd-sysctl ran. The kubelet
// sets kernel.panic=10 (and panic_on_oops, overcommit_memory) each time it starts, which on a
// fencing node would reboot a fenced machine 10 s after the watchdog's panic: so the service
// also runs with every kubelet start (WantedBy=kubelet.service), once the kubelet says it is
// healthy (it set its values by then). Deckhouse has only the timer: up to 10 minutes with
// kernel.panic=10 after each kubelet start. In a container (read-only /proc/sys but for its
// network namespace) it sets what can be set.
//
// nf_conntrack_max is the node's: max(CPUs × perCore, min), computed here from its CPU count.
// Not done, unlike Deckhouse's script: the sysfs tunables it also writes (block queue
// nr_requests and read_ahead_kb, transparent hugepages) and nf_conntrack's hashsize module
// parameter: they are not sysctls, and blk-mq queues refuse some values.
import os from "node:os";
import { HOST_PREP, HOST_PREP_DIRS } from "../bundles/paths.ts";
import { UNITS } from "../bundles/steps/index.ts";
import type { SpecOf } from "../bundles/types.ts";
import { planDir, planFile, planSymlink } from "../host/file-plan.ts";
import { readSysctl, sysctlAccess } from "./lib/kernel.ts";
import { planSysctls } from "./lib/sysctl.ts";
import { planUnit, reloadUnlessPlanned, start, unitCheck, unitPath } from "./lib/units.ts";
import type { Primitive, Step } from "./types.ts";

const SERVICE = UNITS.sysctlTuner;
const TIMER = UNITS.sysctlTunerTimer;
const CONF = HOST_PREP.sysctlTuner;

/** Keys older or other kernels do not have: their absence is not worth a word. */
const OPTIONAL = new Set(["fs.may_detach_mounts", "net.nf_conntrack_max", "net.netfilter.nf_conntrack_max"]);

/** The settings with the node's conntrack limit. */
export function tunedSettings(spec: SpecOf<"SysctlTuner">, cpus = os.availableParallelism()): Record<string, string> {
  const conntrack = String(Math.max(cpus * spec.conntrack.perCore, spec.conntrack.min));
  return { ...spec.settings, "net.netfilter.nf_conntrack_max": conntrack, "net.nf_conntrack_max": conntrack };
}

/** Where the kubelet says it is healthy (its default healthzPort); it answers before its kernel check. */
const KUBELET_HEALTHZ = "http://127.0.0.1:10248/healthz";
/**
 * The kubelet's device-plugin socket (default root dir): its container manager makes it right
 * after checking the kernel settings (protectKernelDefaults), so once it is there the check is over.
 */
const KUBELET_PAST_KERNEL_CHECK = "/var/lib/kubelet/device-plugins/kubelet.sock";

export const SERVICE_UNIT = `# Managed by bashible (041_configure_sysctl_tuner): re-asserts the node's kernel parameters.
[Unit]
Description=Kernel parameters for Kubernetes, re-asserted (041_configure_sysctl_tuner)
# Also started with every start of the kubelet (WantedBy), after it: the kubelet sets
# kernel.panic=10, panic_on_oops and overcommit_memory when it starts.
After=kubelet.service

[Service]
Type=oneshot
# A kubelet with protectKernelDefaults refuses to start unless kernel.panic is 10, and it checks
# only after it already answers /healthz: a kernel.panic=0 (a fencing group) written in between
# stops it, over and over. So while the kubelet runs, wait until it is past that check: healthy,
# and its device-plugin socket (made right after the check) created by this start of it, not an
# earlier one (2 minutes at most). ($$ is a $ for the shell: systemd expands $NAME itself.)
ExecStartPre=-/bin/sh -c 'systemctl -q is-active kubelet.service || exit 0; started=$$(date -d "$$(systemctl show -p ExecMainStartTimestamp --value kubelet.service)" +%%s 2>/dev/null || echo 0); n=0; until curl -fsS -m 2 -o /dev/null ${KUBELET_HEALTHZ} && [ -S ${KUBELET_PAST_KERNEL_CHECK} ] && [ "$$(stat -c %%Y ${KUBELET_PAST_KERNEL_CHECK})" -ge "$$started" ]; do n=$$((n+1)); [ "$$n" -ge 120 ] && exit 0; sleep 1; done'
# -e: keys the kernel does not have (yet: nf_conntrack before the module loads) are skipped.
# "-": a container's /proc/sys is read-only but for its own network: what can be set is set.
ExecStart=-/usr/sbin/sysctl -q -e --load ${CONF}
TimeoutStartSec=180

[Install]
WantedBy=kubelet.service
`;

/** The link `systemctl enable` makes for WantedBy=kubelet.service. */
const KUBELET_WANTS = HOST_PREP_DIRS.kubeletWants;

export const TIMER_UNIT = `# Managed by bashible (041_configure_sysctl_tuner), Deckhouse's schedule.
[Unit]
Description=Re-assert the node's kernel parameters every 10 minutes

[Timer]
OnBootSec=1min
OnUnitActiveSec=10min

[Install]
WantedBy=multi-user.target
`;

const step: Step<"SysctlTuner"> = {
  kind: "SysctlTuner",
  async plan(spec, host) {
    const settings = tunedSettings(spec);
    const live = Object.fromEntries(Object.entries(settings).filter(([k]) => !OPTIONAL.has(k)));
    const sysctls = await planSysctls(host, {
      path: CONF,
      header:
        "# Managed by bashible (041_configure_sysctl_tuner): Deckhouse's kernel parameters for a Kubernetes node.",
      settings,
      live,
      subject: "kernel parameters",
      absentBecause: (key) =>
        key.startsWith("net.bridge.") ? "br_netfilter is not loaded (004_load_mandatory_modules loads it)" : undefined,
    });
    const changes: Primitive[] = [];
    if (sysctls.file) changes.push(sysctls.file);
    if (sysctls.apply) changes.push(sysctls.apply);
    if (!host.sandbox) {
      // The optional keys: set where they exist and may be set, silently skipped elsewhere.
      const extra: string[] = [];
      for (const key of OPTIONAL) {
        const v = settings[key];
        const current = await readSysctl(key);
        if (v === undefined || current === undefined || current === v) continue;
        if ((await sysctlAccess(key)) === "writable") extra.push(`${key}=${v}`);
      }
      if (extra.length) {
        changes.push({
          kind: "command",
          argv: ["sysctl", "-q", "-w", ...extra],
          summary: `set ${extra.join(" ")} now`,
        });
      }
    }
    const service = await planFile(host, {
      path: unitPath(SERVICE),
      content: SERVICE_UNIT,
      mode: 0o644,
      check: unitCheck(host, SERVICE),
    });
    if (service) changes.push(service);
    // Enabled as `systemctl enable` would (WantedBy=kubelet.service), made directly: the kubelet's
    // unit may not be there yet, and enable needs no more than this link.
    const wantsDir = await planDir(host, KUBELET_WANTS, { mode: 0o755 });
    if (wantsDir) changes.push(wantsDir);
    const wants = await planSymlink(host, `${KUBELET_WANTS}/${SERVICE}`, unitPath(SERVICE));
    if (wants) changes.push({ ...wants, summary: `${wants.summary} (started with every kubelet start)` });
    const timer = await planUnit(host, TIMER, TIMER_UNIT);
    if (service || wants) changes.push(...reloadUnlessPlanned(timer.changes, SERVICE, `${SERVICE} changed`));
    changes.push(...timer.changes);
    if (!timer.state.active) changes.push(start(TIMER));
    return { changes, problems: sysctls.problems };
  },
  services: () => [{ unit: TIMER, reads: [unitPath(TIMER)], onChange: "restart" }],
};

export default step;
