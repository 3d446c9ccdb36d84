// 041_configure_sysctl_tuner: Deckhouse's kernel parameters for a Kubernetes node, applied now,
// at boot, and re-asserted by a timer (Deckhouse's sysctl-tuner.timer; its 070_start_sysctl_tuner
// is folded in: this step starts the timer).
import { int, obj, record, str } from "../schema.ts";
import { builtinStep } from "./descriptor.ts";

const SYSCTL_KEY = /^[a-z0-9_]+(\.[a-z0-9_-]+)+$/;
const SYSCTL_VALUE = /^[0-9]+( [0-9]+)*$/;

export const sysctlTuner = builtinStep({
  name: "041_configure_sysctl_tuner",
  kind: "SysctlTuner",
  spec: obj({
    settings: record(str({ pattern: SYSCTL_VALUE, max: 64, what: "numbers separated by spaces" }), {
      key: SYSCTL_KEY,
    }),
    /** nf_conntrack_max = max(CPUs × perCore, min), computed on the node (its CPU count). */
    conntrack: obj({ perCore: int({ min: 1024, max: 1 << 24 }), min: int({ min: 1024, max: 1 << 28 }) }),
  }),
  units: { sysctlTuner: "sysctl-tuner.service", sysctlTunerTimer: "sysctl-tuner.timer" },
  /**
   * Deckhouse's values (its sysctl-tuner script and its reference page "Sysctl parameters managed
   * by the platform"); kernel.panic and vm.swappiness are the renderer's (fencing, memorySwap).
   */
  defaults: {
    "fs.file-max": "1000000",
    "fs.inotify.max_user_instances": "5120",
    "fs.inotify.max_user_watches": "524288",
    "fs.may_detach_mounts": "1",
    // The rest of what the kubelet checks with protectKernelDefaults (with kernel.panic,
    // kernel.panic_on_oops and vm.overcommit_memory): one owner for every kernel value, so the
    // kubelet finds them set.
    "kernel.keys.root_maxbytes": "25000000",
    "kernel.keys.root_maxkeys": "1000000",
    "kernel.numa_balancing": "0",
    "kernel.panic_on_oops": "1",
    "kernel.pid_max": "2000000",
    "net.bridge.bridge-nf-call-arptables": "1",
    "net.bridge.bridge-nf-call-ip6tables": "1",
    "net.bridge.bridge-nf-call-iptables": "1",
    "net.core.netdev_max_backlog": "5000",
    "net.core.rmem_max": "16777216",
    "net.core.somaxconn": "1000",
    "net.core.wmem_max": "16777216",
    "net.ipv4.conf.all.forwarding": "1",
    "net.ipv4.ip_local_port_range": "32768 61000",
    "net.ipv4.neigh.default.gc_thresh1": "16384",
    "net.ipv4.neigh.default.gc_thresh2": "28672",
    "net.ipv4.neigh.default.gc_thresh3": "32768",
    "net.ipv4.tcp_max_syn_backlog": "8096",
    "net.ipv4.tcp_no_metrics_save": "1",
    "net.ipv4.tcp_rmem": "4096 12582912 16777216",
    "net.ipv4.tcp_slow_start_after_idle": "0",
    "net.ipv4.tcp_tw_reuse": "1",
    "net.ipv4.tcp_wmem": "4096 12582912 16777216",
    "vm.dirty_background_ratio": "5",
    "vm.dirty_expire_centisecs": "12000",
    "vm.dirty_ratio": "80",
    "vm.min_free_kbytes": "131072",
    "vm.overcommit_memory": "1",
    "vm.panic_on_oom": "0",
  },
  /** Deckhouse's kernel.panic: 10 s to the reboot, 0 (stay down) on a group with fencing. */
  kernelPanic: { default: "10", fencing: "0" },
  conntrack: { perCore: 131072, min: 524288 },
});
