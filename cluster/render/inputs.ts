// What the renderer reads: the three deckhouse.io objects (as the API serves them) and the
// cluster context. Objects stay plain JSON; only the fields read here are typed.

export interface ObjectMeta {
  name: string;
  uid?: string;
  resourceVersion?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}

export interface NodeGroupObject {
  apiVersion?: string;
  kind?: "NodeGroup";
  metadata: ObjectMeta;
  spec: {
    nodeType: "CloudEphemeral" | "CloudPermanent" | "CloudStatic" | "Static";
    disruptions?: { approvalMode?: "Manual" | "Automatic" | "RollingUpdate" };
    fencing?: { mode: "Watchdog" | "Notify" };
    /** Early OOM on the group's nodes (bundle context nodeGroup.earlyOom; docs/early-oom.md). */
    earlyOom?: {
      enabled?: boolean;
      dryRun?: boolean;
      fullStallPercent?: number;
      durationMs?: number;
      memAvailablePercent?: number;
      excludeNamespaces?: string[];
      excludeLabels?: string[];
    };
    /** Rendered into 064_configure_kubelet (NodeGroupConfiguration templates see all of spec under .nodeGroup). */
    kubelet?: {
      maxPods?: number;
      rootDir?: string;
      containerLogMaxSize?: string;
      containerLogMaxFiles?: number;
      seccompDefault?: boolean;
      resourceReservation?: {
        mode?: "Off" | "Auto" | "Static";
        static?: { cpu?: string | number; memory?: string | number; ephemeralStorage?: string | number };
      };
      topologyManager?: {
        enabled?: boolean;
        scope?: "Container" | "Pod";
        policy?: "None" | "BestEffort" | "Restricted" | "SingleNumaNode";
      };
      memorySwap?: { swapBehavior?: "NoSwap" | "LimitedSwap"; [k: string]: unknown };
      [k: string]: unknown;
    };
    /** Rendered into 032_configure_containerd (NotManaged: no containerd step) and the kubelet's runtime endpoint. */
    cri?: {
      type?: string;
      containerd?: { maxConcurrentDownloads?: number };
      containerdV2?: { maxConcurrentDownloads?: number };
      notManaged?: { criSocketPath?: string };
      [k: string]: unknown;
    };
    // Read by controllers (or not acted on yet), not by the renderer; NodeGroupConfiguration
    // templates see all of spec under .nodeGroup, as in Deckhouse.
    update?: { maxConcurrent?: number | string };
    /**
     * Kept on the group's Nodes by the cluster side; never in a node's bundle (the kubelet
     * registers only the group, the node type and the uninitialized taint), so editing it
     * restarts nothing on the nodes.
     */
    nodeTemplate?: {
      labels?: Record<string, string>;
      annotations?: Record<string, string>;
      taints?: { key: string; value?: string; effect: "NoSchedule" | "PreferNoSchedule" | "NoExecute" }[];
    };
    cloudInstances?: unknown;
    staticInstances?: unknown;
    [field: string]: unknown;
  };
}

export interface NodeGroupConfigurationObject {
  apiVersion?: string;
  kind?: "NodeGroupConfiguration";
  metadata: ObjectMeta;
  spec: { content: string; weight?: number; nodeGroups?: string[]; bundles?: string[] };
}

export interface NodeUserObject {
  apiVersion?: string;
  kind?: "NodeUser";
  metadata: ObjectMeta;
  spec: {
    uid: number;
    /** Deprecated in Deckhouse, still accepted: one key, added before sshPublicKeys. */
    sshPublicKey?: string;
    sshPublicKeys?: string[];
    passwordHash?: string;
    isSudoer?: boolean;
    extraGroups?: string[];
    nodeGroups?: string[];
  };
}

export interface PackageDigest {
  /** sha256:<hex> of the package's image manifest (the digest Deckhouse's proxy takes). */
  digest: string;
  /**
   * sha256:<hex> of its layer blob, as the manifest names it: needed for packages served by a
   * proxy that sends no manifest beside the blob (Deckhouse's registry-packages-proxy).
   */
  layer?: string;
  /** Repository the proxy pulls from; defaults to `<registry.path>/packages`. */
  repository?: string;
}

/** ClusterConfiguration's proxy, as Deckhouse passes it to bashible (and to NGC templates as .proxy). */
export interface ProxySettings {
  httpProxy?: string;
  httpsProxy?: string;
  noProxy?: string[];
}

/**
 * The cluster-wide part of every bundle. Read from key `input.yaml` of Secret
 * d8-cloud-instance-manager/bashible-apiserver-context (Deckhouse's names; `context.yaml` of
 * `bashible-server-context` is read too), or from a file in --config-dir.
 */
export interface ClusterContext {
  /** Staggers the 4-hourly forced re-run per cluster and group. */
  clusterUUID: string;
  kubernetesVersion: string;
  apiserverEndpoints: string[];
  clusterCA: string;
  registry?: {
    address: string;
    path: string;
    ca?: string;
    /** https (default) or http. */
    scheme?: "https" | "http";
    /** base64 of user:password (a docker config's `auth`): containerd pulls with it. A secret. */
    auth?: string;
    /** Mirrors containerd tries first (http[s]://host[:port][/path]). */
    mirrors?: string[];
  };
  /** Optional HTTP(S) proxy for nodes: NGC templates' .proxy and bb-set-proxy. */
  proxy?: ProxySettings;
  packagesProxy: { endpoints: string[]; token: string };
  /** The cluster DNS service address(es) and domain the kubelet hands to pods (default 10.222.0.10, cluster.local). */
  clusterDNS?: string[];
  clusterDomain?: string;
  /**
   * ClusterConfiguration's pod subnet per node ("24"): the kubelet's maxPods where a NodeGroup
   * sets none (/24 and narrower 120, /23 250, /22 500, wider 1000). Default 24.
   */
  podSubnetNodeCIDRPrefix?: string | number;
  /** The cloud provider's settings, for NodeGroupConfiguration templates (.cloudProvider); absent on static clusters, as in Deckhouse. */
  cloudProvider?: Record<string, unknown>;
  /**
   * Seconds between the kubelet's Node status updates (Deckhouse's nodeStatusUpdateFrequency):
   * the kubelet uses 10 when unset; templates see .nodeStatusUpdateFrequency only when set, as in Deckhouse.
   */
  nodeStatusUpdateFrequency?: number;
  /** The sandbox (pause) image containerd pins (default registry.k8s.io/pause:3.10). */
  images?: { pause?: string };
  /** Kubelet settings shared by every group. */
  kubelet?: { featureGates?: Record<string, boolean> };
  /**
   * StaticClusterConfiguration's internalNetworkCIDRs: a Static node's address is its address in
   * these (000_discover_node_ip; Deckhouse hands them to templates as .nodeGroup.static).
   */
  internalNetworkCIDRs?: string[];
  /**
   * Registry packages: name → digest. Step 007 installs them, except the agent (080 updates it
   * after a check) and the containerd package the group's cri.type does not use ("containerd"
   * for Containerd, "containerd2" for ContainerdV2, neither for NotManaged). A "containerd" or
   * "containerd2" package adds 032_configure_containerd, a "kubelet" package the kubelet steps
   * and the API proxy.
   */
  packages: Record<string, PackageDigest>;
  /**
   * The agent itself: which of `packages` it is, and its version (for bashibles/<group>);
   * `metricsSecureAddress` (`internal:9650`) turns on every node's authenticated metrics
   * listener for an in-cluster Prometheus (absent: off; a node's own flag wins).
   */
  agent: { package: string; version: string; metricsSecureAddress?: string };
}

export interface RenderInputs {
  nodeGroups: NodeGroupObject[];
  configurations: NodeGroupConfigurationObject[];
  users: NodeUserObject[];
  context: ClusterContext;
}
