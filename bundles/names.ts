// Names other systems read: Node annotations and labels, Event reasons, the namespace and
// Secrets of the cluster side. Deckhouse's names, so its controllers, dashboards and runbooks
// keep working.

export const NAMESPACE = "d8-cloud-instance-manager";

export const SECRETS = {
  checksums: "configuration-checksums",
  /** Deckhouse's name for the server's context; key input.yaml. */
  context: "bashible-apiserver-context",
  contextKey: "input.yaml",
  /** Accepted as well: the name this project used before it took Deckhouse's. */
  legacyContext: "bashible-server-context",
  legacyContextKey: "context.yaml",
  manualBootstrapPrefix: "manual-bootstrap-for-",
} as const;

/** Annotations and labels on Nodes. */
export const NODE_KEYS = {
  checksum: "node.deckhouse.io/configuration-checksum",
  group: "node.deckhouse.io/group",
  nodeType: "node.deckhouse.io/type",
  waitingForApproval: "update.node.deckhouse.io/waiting-for-approval",
  approved: "update.node.deckhouse.io/approved",
  disruptionRequired: "update.node.deckhouse.io/disruption-required",
  disruptionApproved: "update.node.deckhouse.io/disruption-approved",
  rollingUpdate: "update.node.deckhouse.io/rolling-update",
  draining: "update.node.deckhouse.io/draining",
  drained: "update.node.deckhouse.io/drained",
  reboot: "update.node.deckhouse.io/reboot",
  /** Ours: when the controller began draining the node (RFC 3339), so a new leader keeps the deadline. */
  drainStartedAt: "bashible.deckhouse.io/drain-started-at",
  /** Ours: the controller set spec.unschedulable, so it (and only it) uncordons afterwards. */
  cordoned: "bashible.deckhouse.io/cordoned",
  fencingEnabled: "node-manager.deckhouse.io/fencing-enabled",
  fencingMode: "node-manager.deckhouse.io/fencing-mode",
  fencingDisable: "node-manager.deckhouse.io/fencing-disable",
  /** Taint the kubelet registers with until the first converge finished. */
  uninitializedTaint: "node.deckhouse.io/bashible-uninitialized",
  firstRunFinished: "node.deckhouse.io/bashible-first-run-finished",
} as const;

/** Event reasons the agent and the controllers write. */
export const EVENTS = {
  stepFailed: "BashibleStepFailed",
  nodeUpdate: "BashibleNodeUpdate",
  bundleRejected: "BashibleBundleRejected",
  earlyOomKilled: "EarlyOOMKilled",
  /** The update controllers: what they did to a Node, or why it waits. */
  updateApproved: "BashibleUpdateApproved",
  updateWaiting: "BashibleUpdateWaiting",
  updateFinished: "BashibleUpdateFinished",
  disruptionApproved: "BashibleDisruptionApproved",
  disruptionWaiting: "BashibleDisruptionWaiting",
  rollingUpdate: "BashibleRollingUpdate",
  draining: "BashibleDraining",
  evictionRefused: "BashibleEvictionRefused",
  drained: "BashibleDrained",
  groupMisconfigured: "BashibleNodeGroupInvalid",
} as const;

/**
 * Built-in step names: Deckhouse's, so NodeGroupConfiguration weights order custom scripts
 * against them as they do in Deckhouse, and a custom script cannot take one.
 */
export const BUILTIN_STEPS = {
  nodeUsers: "000_add_node_users",
  caCertificates: "003_install_ca_certificates",
  deckhousePath: "004_add_deckhouse_paths",
  registryPackages: "007_fetch_registry_packages",
} as const;
