// Names other systems read: Node annotations and labels, Event reasons, the namespace, Secrets
// and Leases of the cluster side. Deckhouse's names, so its controllers, dashboards and runbooks
// keep working. Built-in step names and their units are in their descriptors (bundles/steps/).

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

/**
 * ConfigMaps in NAMESPACE the kubelet client approver keeps (only it writes them):
 * `nodeGroups` is what ValidatingAdmissionPolicy bashible-node-group-on-create reads
 * (data[<node name>] = the node group its bootstrap token was for); `nodeClientKeys` holds the
 * public keys of the client certificates last issued to each node name (re-bootstrap proof).
 */
export const CONFIGMAPS = {
  nodeGroups: "bashible-node-groups",
  nodeClientKeys: "bashible-node-client-keys",
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
  /** The agent's own fencing timings (`watchdog=60s,detection=26s`), checked by the fencing controller. */
  fencingTimings: "node-manager.deckhouse.io/fencing-timings",
  /** Taint the kubelet registers with until the first converge finished. */
  uninitializedTaint: "node.deckhouse.io/bashible-uninitialized",
  firstRunFinished: "node.deckhouse.io/bashible-first-run-finished",
  /**
   * Deckhouse's record of the nodeTemplate last applied to a Node (JSON: annotations, labels,
   * taints), so keys the template drops are removed and keys others set are left alone.
   */
  lastAppliedNodeTemplate: "node-manager.deckhouse.io/last-applied-node-template",
  /** Prefix of the role label every Node of a group carries: node-role.kubernetes.io/<group>. */
  nodeRolePrefix: "node-role.kubernetes.io/",
  /** Deckhouse's taint of a Node whose template is not applied yet (removed with the template). */
  deckhouseUninitializedTaint: "node.deckhouse.io/uninitialized",
  /** Ours: the last drain of this Node had to delete pods it could not evict (when, and which). */
  drainForced: "bashible.deckhouse.io/drain-forced",
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
  nodeFenced: "NodeFenced",
  fencingNotify: "NodeFencingNotify",
  fencingRefused: "NodeFencingRefused",
  /** The bundle server, on a NodeGroup or NodeGroupConfiguration it cannot render, and when it renders again. */
  renderFailed: "BashibleRenderFailed",
  renderSucceeded: "BashibleRenderSucceeded",
  /** The nodeTemplate controller, on a NodeGroup whose template a Node refused. */
  nodeTemplateFailed: "BashibleNodeTemplateFailed",
} as const;

/** Deckhouse's Instance objects (deckhouse.io/v1alpha1, one per machine; here one per static Node). */
export const INSTANCES = {
  path: "/apis/deckhouse.io/v1alpha1/instances",
  /** Deckhouse's finalizer; removed at once on deletion, as there is no machine to delete. */
  finalizer: "node-manager.hooks.deckhouse.io/instance-controller",
} as const;

/** Leases in NAMESPACE: the holder of each runs that work, on one replica at a time. */
export const LEASES = {
  /** The bundle server's writers: checksums Secret, manual-bootstrap Secrets, render Events. */
  server: "bashible-server",
  /** The update controllers (approval, disruption, drain); also `bashible controllers`. */
  controllers: "bashible-controllers",
  /** The fencing controller. */
  fencing: "bashible-fencing-controller",
} as const;

/** Deckhouse's label on a bootstrap token Secret (kube-system) naming the node group it is for. */
export const BOOTSTRAP_TOKEN_GROUP_LABEL = "node-manager.deckhouse.io/node-group";

/**
 * The registry-packages proxy's response header carrying the package's manifest (base64), so the
 * node verifies the layer against the manifest digest itself.
 */
export const PACKAGE_MANIFEST_HEADER = "X-Package-Manifest";

/**
 * Whether the kubelet may register its Node with this label (`--node-labels`): the kubernetes.io
 * and k8s.io namespaces are closed to it except for a few well-known keys and the
 * kubelet.kubernetes.io and node.kubernetes.io namespaces; a kubelet given any other label there
 * does not start. The cluster side sets such labels instead.
 */
export function kubeletMaySetLabel(key: string): boolean {
  const slash = key.indexOf("/");
  if (slash < 0) return true;
  const ns = key.slice(0, slash);
  const under = (domain: string) => ns === domain || ns.endsWith(`.${domain}`);
  if (!under("kubernetes.io") && !under("k8s.io")) return true;
  if (under("kubelet.kubernetes.io") || under("node.kubernetes.io")) return true;
  return KUBELET_WELL_KNOWN_LABELS.has(key);
}

const KUBELET_WELL_KNOWN_LABELS: ReadonlySet<string> = new Set([
  "kubernetes.io/hostname",
  "kubernetes.io/instance-type",
  "kubernetes.io/os",
  "kubernetes.io/arch",
  "beta.kubernetes.io/instance-type",
  "beta.kubernetes.io/os",
  "beta.kubernetes.io/arch",
  "failure-domain.beta.kubernetes.io/zone",
  "failure-domain.beta.kubernetes.io/region",
  "topology.kubernetes.io/zone",
  "topology.kubernetes.io/region",
]);
