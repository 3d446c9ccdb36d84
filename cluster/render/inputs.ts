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
    cri?: { type?: string; [k: string]: unknown };
    // Read by controllers (or not acted on yet), not by the renderer; NodeGroupConfiguration
    // templates see all of spec under .nodeGroup, as in Deckhouse.
    kubelet?: unknown;
    update?: { maxConcurrent?: number | string };
    nodeTemplate?: unknown;
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
  /** sha256:<hex> of the package's layer blob. */
  digest: string;
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
  registry?: { address: string; path: string; ca?: string };
  /** Optional HTTP(S) proxy for nodes: NGC templates' .proxy and bb-set-proxy. */
  proxy?: ProxySettings;
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
