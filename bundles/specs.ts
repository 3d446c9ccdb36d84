// The shape of every step kind's spec and of the bundle context: the contract between the
// renderer (cluster/render) and the steps (steps/). Types come from these schemas, and the agent
// verifies every bundle against them before it accepts it, so a malformed spec is a rejected
// bundle naming the step and the field, never a TypeError halfway through a run.
//
// Adding a step kind: add its schema to STEP_SPECS below, its module to steps/index.ts, its
// render input to cluster/render/catalogue.ts (docs/steps.md, "Adding a step").
import { arr, bool, int, type Infer, obj, oneOf, opt, SpecError, str } from "./schema.ts";
import { CERT_NAME, DIGEST, ENDPOINT, MAX_NODE_USER_UID, MIN_NODE_USER_UID, PACKAGE_NAME, USER_NAME } from "./rules.ts";

const pem = (what: string) =>
  str({ max: 256 * 1024, pattern: /-----BEGIN CERTIFICATE-----/, what: `a PEM ${what} certificate` });

export const NODE_USER = obj({
  name: str({ pattern: USER_NAME, what: "a user name (lower-case letters, digits, '_' and '-', at most 32)" }),
  uid: int({ min: MIN_NODE_USER_UID, max: MAX_NODE_USER_UID }),
  sshPublicKeys: arr(str({ max: 16 * 1024, pattern: /^[^\r\n]+$/, what: "a single-line SSH public key" }), {
    max: 256,
  }),
  /** /etc/shadow format; a secret. */
  passwordHash: opt(str({ max: 1024, pattern: /^[^:\r\n]*$/, what: "one /etc/shadow field (no ':' or newline)" })),
  isSudoer: bool(),
  extraGroups: arr(str({ pattern: USER_NAME, what: "a group name" }), { max: 64 }),
});

export const CA_CERTIFICATE = obj({
  /** Becomes the file name in the trust store (`bashible-<name>.crt`). */
  name: str({ pattern: CERT_NAME, what: "a certificate name (letters, digits, '.', '_', '-')" }),
  pem: {
    parse(v, field) {
      const text = pem("CA").parse(v, field);
      // A key has no business in a trust store; dropping it silently would keep it in the
      // stored bundle and hide a leak from whoever pasted it.
      if (/-----BEGIN [A-Z ]*PRIVATE KEY-----/.test(text)) {
        throw new SpecError(field, "carries a PRIVATE KEY block; refused (remove the key from the CA entry)");
      }
      return text;
    },
  },
});

export const REGISTRY_PACKAGE = obj({
  name: str({ pattern: PACKAGE_NAME, what: "a package name" }),
  /** sha256 of the package's image manifest, as in Deckhouse; the node verifies manifest and layer. */
  digest: str({ pattern: DIGEST, what: "sha256:<64 hex>" }),
  repository: str({ max: 512, pattern: /^[A-Za-z0-9._/:@-]+$/, what: "a repository path" }),
});

export const STEP_SPECS = {
  NodeUsers: obj({ users: arr(NODE_USER, { max: 1000, unique: (u) => u.name }) }),
  CACertificates: obj({ certificates: arr(CA_CERTIFICATE, { max: 256, unique: (c) => c.name }) }),
  DeckhousePath: obj({}),
  RegistryPackages: obj({ packages: arr(REGISTRY_PACKAGE, { max: 512, unique: (p) => p.name }) }),
  Script: obj({
    /** bash from a NodeGroupConfiguration, already rendered. */
    script: str({ max: 1024 * 1024 }),
    weight: int(),
    /** The object it came from, for messages: NodeGroupConfiguration/<name>. */
    source: str({ max: 300 }),
    /** Deckhouse bundle names the script applies to (ubuntu-lts, debian, centos, ...); empty = all. */
    bundles: arr(str({ pattern: /^[a-z*][a-z0-9-]*$/, what: "a bundle name" }), { max: 32 }),
  }),
} as const;

export type StepKind = keyof typeof STEP_SPECS;
export const STEP_KINDS = Object.keys(STEP_SPECS) as StepKind[];
export type SpecOf<K extends StepKind> = Infer<(typeof STEP_SPECS)[K]>;

export type NodeUserSpec = Infer<typeof NODE_USER>;
export type CACertificatesSpec = SpecOf<"CACertificates">;
export type RegistryPackageRef = Infer<typeof REGISTRY_PACKAGE>;
export type RegistryPackagesSpec = SpecOf<"RegistryPackages">;
export type ScriptSpec = SpecOf<"Script">;

/** One step of a bundle: a discriminated union over the kinds. */
export type BundleStep = { [K in StepKind]: { name: string; kind: K; spec: SpecOf<K> } }[StepKind];

export const BUNDLE_CONTEXT = obj({
  kubernetesVersion: str({ max: 32, pattern: /^[0-9][0-9.]*$/, what: "a Kubernetes version" }),
  nodeGroup: obj({
    name: str({ pattern: /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/, max: 63, what: "a node group name" }),
    nodeType: oneOf(["CloudEphemeral", "CloudPermanent", "CloudStatic", "Static"] as const),
    disruptions: obj({ approvalMode: oneOf(["Manual", "Automatic", "RollingUpdate"] as const) }),
    fencing: opt(obj({ mode: oneOf(["Watchdog", "Notify"] as const) })),
    updateEpoch: str({ max: 32 }),
  }),
  /** host:port of API servers, for the api-proxy and as the agent's fallback. */
  apiserverEndpoints: arr(str({ pattern: ENDPOINT, what: "host:port" }), { max: 64 }),
  /** PEM of the cluster CA ("" in local mode without a cluster). */
  clusterCA: str({ max: 256 * 1024 }),
  registry: opt(obj({ address: str({ max: 256 }), path: str({ max: 512 }), ca: opt(str({ max: 256 * 1024 })) })),
  /** The cluster's HTTP(S) proxy, if any: what `bb-set-proxy` exports in scripts. */
  proxy: opt(
    obj({
      httpProxy: opt(str({ max: 2048 })),
      httpsProxy: opt(str({ max: 2048 })),
      noProxy: opt(arr(str({ max: 1024 }), { max: 256 })),
    }),
  ),
  packagesProxy: obj({
    /** host:port of registry-packages-proxy instances. */
    endpoints: arr(str({ pattern: ENDPOINT, what: "host:port" }), { max: 64 }),
    /** Bearer token for the proxy; a secret. */
    token: str({ max: 4096 }),
  }),
});

export type BundleContext = Infer<typeof BUNDLE_CONTEXT>;
