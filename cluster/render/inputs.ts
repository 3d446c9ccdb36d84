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
    /** Rendered into 064_configure_kubelet. */
    kubelet?: {
      maxPods?: number;
      rootDir?: string;
      containerLogMaxSize?: string;
      containerLogMaxFiles?: number;
      resourceReservation?: {
        mode?: "Off" | "Auto" | "Static";
        static?: { cpu?: string; memory?: string; ephemeralStorage?: string };
      };
    };
    /** Rendered into 032_configure_containerd (NotManaged: no containerd step). */
    cri?: { type?: "Containerd" | "ContainerdV2" | "NotManaged"; containerd?: { maxConcurrentDownloads?: number } };
    // Read by controllers, not by the renderer; listed so the omission is visible.
    update?: { maxConcurrent?: number | string };
    /** Labels and taints: registered by the kubelet (064_configure_kubelet) when it creates the Node. */
    nodeTemplate?: {
      labels?: Record<string, string>;
      annotations?: Record<string, string>;
      taints?: { key: string; value?: string; effect: "NoSchedule" | "PreferNoSchedule" | "NoExecute" }[];
    };
    cloudInstances?: unknown;
    staticInstances?: unknown;
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
    sshPublicKeys?: string[];
    passwordHash?: string;
    isSudoer?: boolean;
    extraGroups?: string[];
    nodeGroups?: string[];
  };
}

export interface PackageDigest {
  /** sha256:<hex> of the package's layer blob. */
  digest: string;
  /** Repository the proxy pulls from; defaults to `<registry.address>/<registry.path>/packages`. */
  repository?: string;
}

/**
 * The cluster-wide part of every bundle. Read from the `context.yaml` key of Secret
 * d8-cloud-instance-manager/bashible-server-context, or from a file in --config-dir.
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
  packagesProxy: { endpoints: string[]; token: string };
  /** The cluster DNS service address(es) and domain the kubelet hands to pods (default 10.222.0.10, cluster.local). */
  clusterDNS?: string[];
  clusterDomain?: string;
  /** The sandbox (pause) image containerd pins (default registry.k8s.io/pause:3.10). */
  images?: { pause?: string };
  /** Kubelet settings shared by every group. */
  kubelet?: { featureGates?: Record<string, boolean> };
  /**
   * Registry packages: name → digest. Step 007 installs them, except the agent (080 updates it
   * after a check) and the containerd package the group's cri.type does not use ("containerd"
   * for Containerd, "containerd2" for ContainerdV2, neither for NotManaged). A "containerd" or
   * "containerd2" package adds 032_configure_containerd, a "kubelet" package the kubelet steps
   * and the API proxy.
   */
  packages: Record<string, PackageDigest>;
  /** The agent itself: which of `packages` it is, and its version (for bashibles/<group>). */
  agent: { package: string; version: string };
}

export interface RenderInputs {
  nodeGroups: NodeGroupObject[];
  configurations: NodeGroupConfigurationObject[];
  users: NodeUserObject[];
  context: ClusterContext;
}
