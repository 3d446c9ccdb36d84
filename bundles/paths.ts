// Node paths: where the agent keeps its state and where the built-in steps write. Deckhouse's
// names wherever Deckhouse has one, so its tools, docs and cleanup script keep working. Both
// sides read this file: the agent and steps to act, the renderer to write the bootstrap and
// cleanup scripts.
export const STATE_DIR = "/var/lib/bashible";
/** logind's drop-ins: the kubelet step's inhibitor delay, and the kubelet's own file. */
const LOGIND_D = "/etc/systemd/logind.conf.d";

export const PATHS = {
  stateDir: STATE_DIR,
  /** Last applied checksum; `rm` it to force a full run (as in Deckhouse). */
  configurationChecksum: `${STATE_DIR}/configuration_checksum`,
  firstRun: `${STATE_DIR}/first_run`,
  bootstrapToken: `${STATE_DIR}/bootstrap-token`,
  /**
   * The node's address as Deckhouse's 000_discover_node_ip writes it (one IP, a trailing
   * newline): the kubelet's --node-ip and --address when present.
   */
  discoveredNodeIP: `${STATE_DIR}/discovered-node-ip`,
  bootstrapCA: `${STATE_DIR}/ca.crt`,
  bootstrapScript: `${STATE_DIR}/bootstrap.sh`,
  cleanupScript: `${STATE_DIR}/cleanup_static_node.sh`,
  status: `${STATE_DIR}/status.json`,
  /** The last applied bundles, newest kept: bundles/<checksum>.json. */
  bundles: `${STATE_DIR}/bundles`,
  /** Each custom script's last success (content hash, boot id, epoch): scripts/<step>.json. */
  scripts: `${STATE_DIR}/scripts`,
  /** The bundle the current (or last) run applies, for helpers scripts call (0600: tokens). */
  runBundle: `${STATE_DIR}/run-bundle.json`,
  /** The agent as scripts call it (bb-package-install, disruption approval). */
  agentWrapper: `${STATE_DIR}/bin/bashible`,
  /** Deckhouse's flag directory: bb-flag-set writes here, the engine reads it. */
  flags: `${STATE_DIR}/.bb-workspace/flag`,
  /** Files corrupt state was moved to (`<name>.corrupt-<time>`), kept for a person to read. */
  corrupt: `${STATE_DIR}/corrupt`,
  /** Under a sandbox root, what would have reached the real machine (restarts, reboots). */
  sandboxActions: `${STATE_DIR}/sandbox-actions.log`,
  /**
   * The converge lock ("<pid> <start time>"). Deckhouse uses /var/lock/bashible, but /var/lock is
   * /run/lock, which every user can write: anyone could take the lock first and stop every
   * converge. /run/bashible is root's alone.
   */
  lock: "/run/bashible/converge.lock",
  /** The daemon's pid and schedule, for `bashible status` (tmpfs on a node). */
  daemon: "/run/bashible/daemon.json",
  /** Fencing's state for `bashible fencing status` (tmpfs: a reboot forgets a fence in progress). */
  fencingStatus: "/run/bashible/fencing.json",
  /** Fencing's metrics in the node_exporter textfile format. */
  fencingMetrics: "/run/bashible/fencing.prom",
  logDir: "/var/log/d8/bashible",
  kubeletKubeconfig: "/etc/kubernetes/kubelet.conf",
  /** The kubelet's bootstrap kubeconfig (bootstrap token, server = the local API proxy). */
  kubeletBootstrapKubeconfig: "/etc/kubernetes/bootstrap-kubelet.conf",
  kubeletConfig: "/var/lib/kubelet/config.yaml",
  kubeletClientPem: "/var/lib/kubelet/pki/kubelet-client-current.pem",
  clusterCA: "/etc/kubernetes/pki/ca.crt",
  /** logind's inhibitor delay, long enough for the kubelet's graceful node shutdown (064_configure_kubelet). */
  kubeletLogind: `${LOGIND_D}/90-bashible-kubelet.conf`,
  /** What the kubelet writes itself when logind's inhibitor delay is shorter than its shutdown grace period. */
  kubeletOwnLogind: `${LOGIND_D}/99-kubelet.conf`,
  /** Where earlier versions of 064_configure_kubelet kept the kubelet's kernel values (the sysctl tuner has them now). */
  kubeletLegacySysctl: "/etc/sysctl.d/90-bashible-kubelet.conf",
  /** crictl's configuration (032_configure_containerd): crictl finds containerd without flags. */
  crictlConfig: "/etc/crictl.yaml",
  /** Where built-in steps write their units (the administrator's directory, ahead of the OS's). */
  unitDir: "/etc/systemd/system",
  containerdConfig: "/etc/containerd/config.toml",
  /**
   * Fragments NodeGroupConfiguration scripts put here are merged into config.toml by
   * 032_configure_containerd, as Deckhouse's toml-merge merges them: conf.d for containerd 1,
   * conf2.d for containerd 2.
   */
  containerdConfD: "/etc/containerd/conf.d",
  containerdConf2D: "/etc/containerd/conf2.d",
  /** containerd's config_path: <host>/hosts.toml per registry (Deckhouse's directory). */
  containerdRegistryDir: "/etc/containerd/registry.d",
  containerdSocket: "/run/containerd/containerd.sock",
  /** nginx configuration of the local API proxy (Deckhouse's directory). */
  apiProxyDir: "/etc/kubernetes/kubernetes-api-proxy",
  /** The agent's installed tree: a link to the running release once the agent has updated itself. */
  agentDir: "/opt/deckhouse/lib/bashible",
  /** Agent releases: <digest hex>/ each, the current one and the one before it. */
  agentReleases: "/opt/deckhouse/lib/bashible-releases",
  /** The launcher on PATH (a wrapper, so the runtime is found next to the real launcher). */
  agentLauncher: "/opt/deckhouse/bin/bashible",
  /** Deckhouse's bin directory, put on PATH by 004_add_deckhouse_paths. */
  binDir: "/opt/deckhouse/bin",
  /** Deckhouse's TMPDIR for steps. */
  tmpDir: "/opt/deckhouse/tmp",
  /** Installed registry packages: <pkg>/{digest,install,uninstall}. */
  packageStore: "/var/cache/registrypackages",
  /**
   * Downloads in flight and verified archives awaiting install. Not under Deckhouse's TMPDIR
   * (/opt/deckhouse/tmp is 1777 for scripts): tar and the package's install script run on
   * these paths as root, so nobody else may be able to write anywhere along them.
   */
  packageDownloads: `${STATE_DIR}/registrypackages`,
  /**
   * The node's IP as 000_discover_node_ip found it: the address, then a newline (Deckhouse's
   * file; `bb-d8-node-ip` reads it, the kubelet step passes it as `--node-ip`).
   */
  discoveredNodeIp: `${STATE_DIR}/discovered-node-ip`,
  /** The curl header file bootstrap.sh writes (the bootstrap token); 098_cleanup removes it. */
  bootstrapAuthHeader: `${STATE_DIR}/bootstrap-auth-header`,
  /**
   * Distribution packages the agent (or bootstrap.sh) installed, one `<manager> <package>` a
   * line: cleanup_static_node.sh removes exactly these (nothing the machine had before).
   */
  distroPackagesRecord: `${STATE_DIR}/distro-packages`,
  /** What 003_disable_swap turned off, for cleanup to put back: `fstab <line>` and `mask <unit>` lines. */
  swapRecord: `${STATE_DIR}/swap-off`,
} as const;

export const stepLogPath = (step: string) => `${PATHS.logDir}/step.${step}.log`;

export const KEEP_BUNDLES = 10;

/** NodeUsers: Deckhouse's layout and ownership marker, also what cleanup_static_node.sh removes. */
export const NODE_USERS = {
  /** GECOS of every account this agent (or Deckhouse) created; nothing else is ever changed. */
  marker: "created by deckhouse",
  homeBase: "/home/deckhouse",
  primaryGid: 100,
  shell: "/bin/bash",
  sudoGroup: "nodeadmin",
  sudoersDropIn: "/etc/sudoers.d/30-deckhouse-nodeadmins",
} as const;

/** Where each family's login shells pick up the PATH drop-in. ALT Linux reads both. */
export const PROFILE_DROP_INS = {
  debian: ["/etc/profile.d/02-deckhouse-path.sh"],
  rhel: ["/etc/profile.d/02-deckhouse-path.sh"],
  altlinux: ["/etc/profile.d/02-deckhouse-path.sh", "/etc/bashrc.d/02-deckhouse-path.sh"],
} as const;

/** Every PATH drop-in any family gets: what cleanup removes. */
export const ALL_PROFILE_DROP_INS = [...new Set(Object.values(PROFILE_DROP_INS).flat())].sort();

/** Directories the operating-system steps make for their drop-ins: cleanup removes them when that left them empty. */
export const HOST_PREP_DIRS = {
  journald: "/etc/systemd/journald.conf.d",
  networkd: "/etc/systemd/networkd.conf.d",
  generators: "/etc/systemd/system-generators",
  /** The links `systemctl enable` makes for WantedBy=kubelet.service (041_configure_sysctl_tuner's). */
  kubeletWants: `${PATHS.unitDir}/kubelet.service.wants`,
} as const;

/** Files the operating-system steps (000_add_mandatory_packages … 098_set_permissions) write. */
export const HOST_PREP = {
  /** Modules loaded at boot: Deckhouse's d8_<module>.conf, one file per module. */
  modulesLoad: (module: string) => `/etc/modules-load.d/d8_${module}.conf`,
  rpFilter: "/etc/sysctl.d/99-override_rp_filter.conf",
  sysctlTuner: "/etc/sysctl.d/90-deckhouse-sysctl-tuner.conf",
  networkdForeignRules: `${HOST_PREP_DIRS.networkd}/80-disable-manage-foreign-rules.conf`,
  journald: `${HOST_PREP_DIRS.journald}/90-deckhouse.conf`,
  rsyslogKubelet: "/etc/rsyslog.d/10-kubelet.conf",
  logrotate: "/etc/logrotate.d/bashible",
  /** systemd-gpt-auto-generator masked: it would turn on a swap partition it finds in the GPT. */
  gptAutoGeneratorMask: `${HOST_PREP_DIRS.generators}/systemd-gpt-auto-generator`,
  /** kubelet.memorySwap LimitedSwap: Deckhouse's swap file. */
  swapFile: "/var/lib/swapfile",
} as const;

/** The kernel modules 004_load_mandatory_modules loads (Deckhouse's): containerd's overlay snapshots, bridged traffic through iptables. */
export const MANDATORY_MODULES = ["br_netfilter", "overlay"] as const;

/** What cleanup_static_node.sh removes: everything the agent, containerd and the kubelet put on a node. */
export const CLEANUP_PATHS = [
  PATHS.packageStore,
  "/etc/kubernetes",
  "/var/lib/kubelet",
  "/var/lib/containerd",
  "/var/lib/cni",
  "/var/lib/etcd",
  "/var/lib/deckhouse",
  "/etc/cni",
  "/etc/containerd",
  "/opt/cni",
  "/opt/containerd",
  "/opt/deckhouse",
  "/var/log/kube-audit",
  "/var/log/pods",
  "/var/log/containers",
  "/var/log/containerd",
  "/var/log/d8",
  // The kubelet makes its FlexVolume plugin directory at its first start.
  "/usr/libexec/kubernetes",
  NODE_USERS.homeBase,
  ...ALL_PROFILE_DROP_INS,
  NODE_USERS.sudoersDropIn,
  // What the kubelet's settings need from the system (064_configure_kubelet), and the file the
  // kubelet writes itself when logind's inhibitor delay is shorter than its shutdown grace period.
  PATHS.kubeletLegacySysctl,
  PATHS.kubeletLogind,
  PATHS.kubeletOwnLogind,
  PATHS.crictlConfig,
  // softdog set up for fencing (agent/fencing/softdog.ts)
  "/etc/modprobe.d/bashible-softdog.conf",
  "/etc/modules-load.d/bashible-softdog.conf",
  // the operating-system steps (the live kernel settings go with the reboot that ends cleanup)
  ...MANDATORY_MODULES.map(HOST_PREP.modulesLoad),
  HOST_PREP.rpFilter,
  HOST_PREP.sysctlTuner,
  HOST_PREP.networkdForeignRules,
  HOST_PREP.journald,
  HOST_PREP.rsyslogKubelet,
  HOST_PREP.logrotate,
  HOST_PREP.gptAutoGeneratorMask,
  HOST_PREP.swapFile,
];

/** Directories cleanup_static_node.sh removes when the files above were all that was in them. */
export const CLEANUP_EMPTY_DIRS = [LOGIND_D, ...Object.values(HOST_PREP_DIRS)];

/**
 * The repository a registry package is pulled from when none is named: `<registry path>/packages`,
 * a path in the registry the proxy pulls from (the proxy knows the registry's address).
 */
export function defaultPackageRepository(registry: { path: string } | undefined): string | undefined {
  return registry ? `${registry.path.replace(/^\/+|\/+$/g, "")}/packages` : undefined;
}
