// The NodeGroupBundle: what the bundle server renders for one node group and what the agent
// converges to. Self-contained and deterministic; its checksum is sha256 over the canonical
// serialisation of {nodeGroup, context, steps} (bundles/checksum.ts). This file is the contract
// between cluster/ (which renders) and agent/ + steps/ (which apply).

export const API_GROUP = "bashible.deckhouse.io";
export const API_VERSION = `${API_GROUP}/v1alpha1`;
export const CHECKSUM_ANNOTATION = `${API_GROUP}/configuration-checksum`;

/** A file a step wants on the node, fully rendered. */
export interface FileSpec {
  path: string;
  content: string;
  /** Octal mode as a number, e.g. 0o644. */
  mode: number;
  uid?: number;
  gid?: number;
  /** Content must never be shown (plans say "secret content changed" instead of a diff). */
  secret?: boolean;
}

export interface NodeUserSpec {
  name: string;
  uid: number;
  sshPublicKeys: string[];
  /** /etc/shadow format; a secret. */
  passwordHash?: string;
  isSudoer: boolean;
  extraGroups: string[];
}

export interface CACertificatesSpec {
  /** name → PEM; the name becomes the file name in the trust store (`<name>.crt`). */
  certificates: { name: string; pem: string }[];
}

export interface RegistryPackageRef {
  name: string;
  /** sha256:<hex> of the layer blob (what the node verifies after download). */
  digest: string;
  repository: string;
}

export interface RegistryPackagesSpec {
  packages: RegistryPackageRef[];
}

export interface ScriptSpec {
  /** bash script from a NodeGroupConfiguration. */
  script: string;
  weight: number;
  /** Source object, for messages. */
  source: string;
  /** Bundle families the script applies to; empty = all. */
  bundles: string[];
}

export type BundleStep =
  | { name: string; kind: "NodeUsers"; spec: { users: NodeUserSpec[] } }
  | { name: string; kind: "CACertificates"; spec: CACertificatesSpec }
  | { name: string; kind: "DeckhousePath"; spec: Record<string, never> }
  | { name: string; kind: "RegistryPackages"; spec: RegistryPackagesSpec }
  | { name: string; kind: "Script"; spec: ScriptSpec };

export type StepKind = BundleStep["kind"];

export interface BundleContext {
  kubernetesVersion: string;
  nodeGroup: {
    name: string;
    nodeType: "CloudEphemeral" | "CloudPermanent" | "CloudStatic" | "Static";
    disruptions: { approvalMode: "Manual" | "Automatic" | "RollingUpdate" };
    fencing?: { mode: "Watchdog" | "Notify" };
    updateEpoch: string;
  };
  /** host:port of API servers, for the api-proxy and as the agent's fallback. */
  apiserverEndpoints: string[];
  /** PEM of the cluster CA. */
  clusterCA: string;
  registry?: { address: string; path: string; ca?: string };
  packagesProxy: {
    /** host:port of registry-packages-proxy instances. */
    endpoints: string[];
    /** Bearer token for the proxy; a secret. */
    token: string;
  };
}

export interface NodeGroupBundle {
  apiVersion: typeof API_VERSION;
  kind: "NodeGroupBundle";
  metadata: { name: string; resourceVersion?: string; annotations?: Record<string, string> };
  nodeGroup: string;
  context: BundleContext;
  /** Ordered by name (`NNN_name`). */
  steps: BundleStep[];
  checksum: string;
}
