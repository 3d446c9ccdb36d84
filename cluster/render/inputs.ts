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
    // Read by controllers, not by the renderer; listed so the omission is visible.
    kubelet?: unknown;
    cri?: unknown;
    update?: { maxConcurrent?: number | string };
    nodeTemplate?: unknown;
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
  /** Repository the proxy pulls from; defaults to `<registry.path>/packages`. */
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
  registry?: { address: string; path: string; ca?: string };
  packagesProxy: { endpoints: string[]; token: string };
  /** Registry packages every node installs in step 007: name → digest. */
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
