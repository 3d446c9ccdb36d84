// The shape of every step kind's spec and of the bundle context: the contract between the
// renderer (cluster/render) and the steps (steps/). Types come from these schemas, and the agent
// verifies every bundle against them before it accepts it, so a malformed spec is a rejected
// bundle naming the step and the field, never a TypeError halfway through a run.
//
// A built-in step's schema is in its descriptor (bundles/steps/<kind>.ts); custom scripts'
// is here (docs/steps.md, "Adding a step").
import { arr, bool, int, type Infer, num, obj, oneOf, opt, str } from "./schema.ts";
import { ENDPOINT, METRICS_SECURE_ADDRESS } from "./rules.ts";
import { BUILTIN_SPECS } from "./steps/index.ts";

export type { NodeUserSpec } from "./steps/node-users.ts";
export type { RegistryPackageRef } from "./steps/registry-packages.ts";
export type { ContainerdRegistry } from "./steps/containerd.ts";
export type { NodeTaint } from "./steps/kubelet.ts";

export const STEP_SPECS = {
  ...BUILTIN_SPECS,
  /** A NodeGroupConfiguration's script (`NNN_<name>` by its weight). */
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

export type CACertificatesSpec = SpecOf<"CACertificates">;
export type RegistryPackagesSpec = SpecOf<"RegistryPackages">;
export type ScriptSpec = SpecOf<"Script">;
export type KubernetesApiProxySpec = SpecOf<"KubernetesApiProxy">;
export type ContainerdSpec = SpecOf<"Containerd">;
export type KubeletSpec = SpecOf<"Kubelet">;
export type BashibleServiceSpec = SpecOf<"BashibleService">;

/** One step of a bundle: a discriminated union over the kinds. */
export type BundleStep = { [K in StepKind]: { name: string; kind: K; spec: SpecOf<K> } }[StepKind];

export const BUNDLE_CONTEXT = obj({
  kubernetesVersion: str({ max: 32, pattern: /^[0-9][0-9.]*$/, what: "a Kubernetes version" }),
  nodeGroup: obj({
    name: str({ pattern: /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/, max: 63, what: "a node group name" }),
    nodeType: oneOf(["CloudEphemeral", "CloudPermanent", "CloudStatic", "Static"] as const),
    disruptions: obj({ approvalMode: oneOf(["Manual", "Automatic", "RollingUpdate"] as const) }),
    fencing: opt(obj({ mode: oneOf(["Watchdog", "Notify"] as const) })),
    /** Early OOM for the group (NodeGroup spec.earlyOom): on unless disabled; thresholds refine the agent's defaults. */
    earlyOom: opt(
      obj({
        enabled: opt(bool()),
        dryRun: opt(bool()),
        fullStallPercent: opt(num({ min: 0.1, max: 100 })),
        durationMs: opt(int({ min: 0, max: 300_000 })),
        memAvailablePercent: opt(num({ min: 0, max: 100 })),
        excludeNamespaces: opt(arr(str({ max: 63 }), { max: 256 })),
        excludeLabels: opt(arr(str({ max: 317 }), { max: 256 })),
      }),
    ),
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
  /**
   * The resident agent's own settings for every node (the cluster context's `agent`): where its
   * authenticated metrics listen (`internal:9650`); absent = off, unless the node's flag says.
   */
  agent: opt(
    obj({
      metricsSecureAddress: opt(str({ max: 64, pattern: METRICS_SECURE_ADDRESS, what: "internal:PORT or IP:PORT" })),
    }),
  ),
});

export type BundleContext = Infer<typeof BUNDLE_CONTEXT>;
