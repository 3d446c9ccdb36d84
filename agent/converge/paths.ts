// Node paths the converge runtime owns (Deckhouse-compatible where Deckhouse has a name).
export const STATE_DIR = "/var/lib/bashible";
export const PATHS = {
  stateDir: STATE_DIR,
  /** Last applied checksum; `rm` it to force a full run (as in Deckhouse). */
  configurationChecksum: `${STATE_DIR}/configuration_checksum`,
  firstRun: `${STATE_DIR}/first_run`,
  bootstrapToken: `${STATE_DIR}/bootstrap-token`,
  bootstrapCA: `${STATE_DIR}/ca.crt`,
  status: `${STATE_DIR}/status.json`,
  /** The last applied bundles, newest kept: bundles/<checksum>.json. */
  bundles: `${STATE_DIR}/bundles`,
  /** Each custom script's last success (content hash, boot id, epoch): scripts/<step>.json. */
  scripts: `${STATE_DIR}/scripts`,
  lock: "/var/lock/bashible",
  /** The daemon's pid and schedule, for `bashible status` (tmpfs on a node). */
  daemon: "/run/bashible/daemon.json",
  logDir: "/var/log/d8/bashible",
  kubeletKubeconfig: "/etc/kubernetes/kubelet.conf",
  kubeletClientPem: "/var/lib/kubelet/pki/kubelet-client-current.pem",
  clusterCA: "/etc/kubernetes/pki/ca.crt",
} as const;

export const stepLogPath = (step: string) => `${PATHS.logDir}/step.${step}.log`;

/** Deckhouse-compatible annotation and label names. */
export const NODE_KEYS = {
  checksum: "node.deckhouse.io/configuration-checksum",
  group: "node.deckhouse.io/group",
  waitingForApproval: "update.node.deckhouse.io/waiting-for-approval",
  approved: "update.node.deckhouse.io/approved",
  reboot: "update.node.deckhouse.io/reboot",
} as const;

export const KEEP_BUNDLES = 10;
