// The shape of every step kind's spec and of the bundle context: the contract between the
// renderer (cluster/render) and the steps (steps/). Types come from these schemas, and the agent
// verifies every bundle against them before it accepts it, so a malformed spec is a rejected
// bundle naming the step and the field, never a TypeError halfway through a run.
//
// Adding a step kind: add its schema to STEP_SPECS below, its module to steps/index.ts, its
// render input to cluster/render/catalogue.ts (docs/steps.md, "Adding a step").
import { arr, bool, int, type Infer, num, obj, oneOf, opt, record, SpecError, str } from "./schema.ts";
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

const CGROUP_DRIVER = oneOf(["systemd", "cgroupfs"] as const);
/** A Kubernetes quantity as the kubelet reads it (1.5Gi, 500m, 100Mi, 10). */
const QUANTITY = /^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|m|k|M|G|T|P)?$/;
/** An eviction threshold: a quantity or a percentage. */
const THRESHOLD = /^([0-9]+(\.[0-9]+)?%|[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?)$/;
const EVICTION_SIGNAL =
  /^(memory\.available|nodefs\.available|nodefs\.inodesFree|imagefs\.available|imagefs\.inodesFree|containerfs\.available|containerfs\.inodesFree|pid\.available)$/;
/** A Go duration (1m30s, 90s). */
const DURATION = /^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$/;
/** Label keys: an optional DNS-subdomain prefix and a name (Kubernetes' rules, checked again by the kubelet). */
const LABEL_KEY =
  /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;
const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;
const IP = /^([0-9]{1,3}\.){3}[0-9]{1,3}$|^[0-9a-fA-F:]+$/;
const DNS_NAME = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
/** An image reference: name[:tag][@digest], no whitespace or quotes (it lands in TOML). */
const IMAGE_REF = /^[a-z0-9][a-z0-9._:/-]*(@sha256:[0-9a-f]{64})?$/;
const REGISTRY_HOST = /^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?$/;
const MIRROR_URL = /^https?:\/\/[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?(\/[A-Za-z0-9._/-]*)?$/;
const ABS_PATH = /^\/[A-Za-z0-9._/-]*$/;

export const CONTAINERD_REGISTRY = obj({
  /** host[:port], as images name it; becomes a directory under /etc/containerd/registry.d. */
  host: str({ max: 253, pattern: REGISTRY_HOST, what: "a registry host[:port]" }),
  scheme: oneOf(["https", "http"] as const),
  /** PEM the registry's certificate is verified with (besides the system's trust store). */
  ca: opt(pem("registry CA")),
  /** base64 of `user:password` (a docker config's `auth`); a secret. */
  auth: opt(str({ max: 4096, pattern: /^[A-Za-z0-9+/]+=*$/, what: "base64 of user:password" })),
  /** Mirrors tried before the registry itself, in order. */
  mirrors: arr(str({ max: 512, pattern: MIRROR_URL, what: "a mirror URL (http[s]://host[:port][/path])" }), {
    max: 16,
  }),
});

export const NODE_TAINT = obj({
  key: str({ max: 316, pattern: LABEL_KEY, what: "a taint key" }),
  value: opt(str({ max: 63, pattern: LABEL_VALUE, what: "a taint value" })),
  effect: oneOf(["NoSchedule", "PreferNoSchedule", "NoExecute"] as const),
});

const thresholds = () =>
  record(str({ pattern: THRESHOLD, what: "a quantity or a percentage" }), { key: EVICTION_SIGNAL });

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
  /** 000_configure_kubernetes_api_proxy: nginx (stream) on `listen`, balancing over the API servers. */
  KubernetesApiProxy: obj({
    listen: str({ pattern: ENDPOINT, what: "host:port" }),
    upstreams: arr(str({ pattern: ENDPOINT, what: "host:port" }), { max: 64, unique: (u) => u }),
  }),
  /** 032_configure_containerd. */
  Containerd: obj({
    cgroupDriver: CGROUP_DRIVER,
    sandboxImage: str({ max: 512, pattern: IMAGE_REF, what: "an image reference" }),
    snapshotter: str({ pattern: /^[a-z0-9_-]{1,32}$/, what: "a snapshotter name" }),
    maxConcurrentDownloads: int({ min: 1, max: 64 }),
    registries: arr(CONTAINERD_REGISTRY, { max: 32, unique: (r) => r.host }),
    /** The registry package that installs containerd: its digest names the binary (a new one restarts it). */
    package: str({ pattern: PACKAGE_NAME, what: "a package name" }),
  }),
  /** 064_configure_kubelet: configuration, kubeconfigs, CA and unit; restarts the kubelet when they change. */
  Kubelet: obj({
    cgroupDriver: CGROUP_DRIVER,
    clusterDNS: arr(str({ pattern: IP, what: "an IP address" }), { max: 4 }),
    clusterDomain: str({ max: 253, pattern: DNS_NAME, what: "a DNS domain" }),
    maxPods: int({ min: 1, max: 1000 }),
    containerLogMaxSize: str({ pattern: /^[0-9]+(Ki|Mi|Gi)?$/, what: "a size (10Mi)" }),
    containerLogMaxFiles: int({ min: 2, max: 20 }),
    evictionHard: thresholds(),
    evictionSoft: thresholds(),
    evictionSoftGracePeriod: record(str({ pattern: DURATION, what: "a duration (1m30s)" }), { key: EVICTION_SIGNAL }),
    resourceReservation: obj({
      mode: oneOf(["Off", "Auto", "Static"] as const),
      static: opt(
        obj({
          cpu: opt(str({ pattern: QUANTITY, what: "a quantity" })),
          memory: opt(str({ pattern: QUANTITY, what: "a quantity" })),
          ephemeralStorage: opt(str({ pattern: QUANTITY, what: "a quantity" })),
        }),
      ),
    }),
    featureGates: record(bool(), { key: /^[A-Za-z0-9]{1,100}$/ }),
    seccompDefault: opt(bool()),
    /** NodeGroup kubelet.topologyManager, when enabled (the kubelet's own spelling). */
    topologyManager: opt(
      obj({
        policy: oneOf(["none", "best-effort", "restricted", "single-numa-node"] as const),
        scope: oneOf(["container", "pod"] as const),
      }),
    ),
    /** NodeGroup kubelet.memorySwap.swapBehavior: swap allowed on the node (failSwapOn: false). */
    swapBehavior: opt(oneOf(["NoSwap", "LimitedSwap"] as const)),
    /** The CRI socket when containerd is not managed (NodeGroup cri.notManaged.criSocketPath); absent: containerd's. */
    criSocket: opt(str({ max: 256, pattern: ABS_PATH, what: "an absolute path" })),
    /** The kubelet's --root-dir; absent: /var/lib/kubelet. */
    rootDir: opt(str({ max: 256, pattern: ABS_PATH, what: "an absolute path" })),
    /** Registered with the Node (node.deckhouse.io/group, node.deckhouse.io/type, the NodeGroup's nodeTemplate labels). */
    nodeLabels: record(str({ max: 63, pattern: LABEL_VALUE, what: "a label value" }), { key: LABEL_KEY }),
    /** Registered with the Node: node.deckhouse.io/bashible-uninitialized and the nodeTemplate taints. */
    nodeTaints: arr(NODE_TAINT, { max: 64 }),
    /** What the kubelet's kubeconfigs point at: the local API proxy. */
    apiServer: str({ max: 256, pattern: /^https:\/\/[A-Za-z0-9.:[\]-]+$/, what: "https://host:port" }),
    /** The registry package that installs the kubelet: its digest names the binary (a new one restarts it). */
    package: str({ pattern: PACKAGE_NAME, what: "a package name" }),
  }),
  /** 069_start_kubelet: the kubelet runs and has its client certificate. */
  KubeletStart: obj({
    /** How long to wait for /var/lib/kubelet/pki/kubelet-client-current.pem (TLS bootstrap). */
    clientCertTimeoutSeconds: int({ min: 1, max: 3600 }),
  }),
  /** 080_setup_bashible_service: the agent itself (self-update), its units and the cleanup script. */
  BashibleService: obj({
    /** The agent package the bundle pins: run in check mode before it replaces the running agent. */
    agent: REGISTRY_PACKAGE,
    /** cleanup_static_node.sh as bashibles/<group> serves it; rewritten on every run. */
    cleanupScript: str({ max: 256 * 1024, pattern: /^#!\/bin\/bash\n/, what: "a bash script" }),
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
export type KubernetesApiProxySpec = SpecOf<"KubernetesApiProxy">;
export type ContainerdSpec = SpecOf<"Containerd">;
export type ContainerdRegistry = Infer<typeof CONTAINERD_REGISTRY>;
export type KubeletSpec = SpecOf<"Kubelet">;
export type NodeTaint = Infer<typeof NODE_TAINT>;
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
});

export type BundleContext = Infer<typeof BUNDLE_CONTEXT>;
