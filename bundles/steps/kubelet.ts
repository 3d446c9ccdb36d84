// 064_configure_kubelet: configuration, kubeconfigs, CA and unit; restarts the kubelet when they change.
import { arr, bool, type Infer, int, obj, oneOf, opt, record, str } from "../schema.ts";
import { NODE_KEYS } from "../names.ts";
import { PACKAGE_NAME } from "../rules.ts";
import { CGROUP_DRIVER } from "./containerd.ts";
import { builtinStep } from "./descriptor.ts";
import { apiProxy } from "./kubernetes-api-proxy.ts";

/** A Kubernetes quantity as the kubelet reads it (1.5Gi, 500m, 100Mi, 10). */
const QUANTITY = /^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|m|k|M|G|T|P)?$/;
/** Label keys: an optional DNS-subdomain prefix and a name (Kubernetes' rules, checked again by the kubelet). */
const LABEL_KEY =
  /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;
const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;
const IP = /^([0-9]{1,3}\.){3}[0-9]{1,3}$|^[0-9a-fA-F:]+$/;
const DNS_NAME = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const ABS_PATH = /^\/[A-Za-z0-9._/-]*$/;

export const NODE_TAINT = obj({
  key: str({ max: 316, pattern: LABEL_KEY, what: "a taint key" }),
  value: opt(str({ max: 63, pattern: LABEL_VALUE, what: "a taint value" })),
  effect: oneOf(["NoSchedule", "PreferNoSchedule", "NoExecute"] as const),
});
export type NodeTaint = Infer<typeof NODE_TAINT>;

export const kubelet = builtinStep({
  name: "064_configure_kubelet",
  kind: "Kubelet",
  spec: obj({
    cgroupDriver: CGROUP_DRIVER,
    clusterDNS: arr(str({ pattern: IP, what: "an IP address" }), { max: 4 }),
    clusterDomain: str({ max: 253, pattern: DNS_NAME, what: "a DNS domain" }),
    /** NodeGroup kubelet.maxPods, or what the cluster's pod subnet per node gives room for. */
    maxPods: int({ min: 1, max: 1000 }),
    containerLogMaxSize: str({ pattern: /^[0-9]+(Ki|Mi|Gi)?$/, what: "a size (10Mi)" }),
    containerLogMaxFiles: int({ min: 2, max: 20 }),
    /** How often the kubelet posts the Node's status (Deckhouse's nodeStatusUpdateFrequency, default 10). */
    nodeStatusUpdateFrequencySeconds: int({ min: 1, max: 600 }),
    /** The Node's spec.providerID at registration: `static://` on Static nodes, as Deckhouse sets it. */
    providerID: opt(
      str({ max: 256, pattern: /^[a-z][a-z0-9+.-]*:\/\/[A-Za-z0-9._/-]*$/, what: "a provider ID (static://)" }),
    ),
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
    /**
     * The kubelet refuses to start when the six kernel values it checks differ from its own
     * (kernel.panic 10 among them). False on groups with a Watchdog fence, whose nodes keep
     * kernel.panic 0 (041_configure_sysctl_tuner) so a fenced machine stays down.
     */
    protectKernelDefaults: opt(bool()),
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
    /**
     * What the kubelet registers a new Node with, and only that (Deckhouse's 068): the labels
     * node.deckhouse.io/group and node.deckhouse.io/type, the taint that keeps workloads off
     * until the first converge finished. The NodeGroup's nodeTemplate is the cluster side's
     * (it keeps labels, annotations and taints on the Nodes), so editing it restarts no kubelet.
     */
    registerLabels: record(str({ max: 63, pattern: LABEL_VALUE, what: "a label value" }), { key: LABEL_KEY }),
    registerTaints: arr(NODE_TAINT, { max: 8 }),
    /** What the kubelet's kubeconfigs point at: the local API proxy. */
    apiServer: str({ max: 256, pattern: /^https:\/\/[A-Za-z0-9.:[\]-]+$/, what: "https://host:port" }),
    /** The registry package that installs the kubelet: its digest names the binary (a new one restarts it). */
    package: str({ pattern: PACKAGE_NAME, what: "a package name" }),
  }),
  units: { kubelet: "kubelet.service" },
  /** The API server as the kubelet reaches it: through the local API proxy. */
  apiServer: `https://${apiProxy.listen}`,
  /** The taint the kubelet registers the Node with until the first converge finished. */
  uninitializedTaint: { key: NODE_KEYS.uninitializedTaint, effect: "NoSchedule" },
  /** Graceful node shutdown (Deckhouse's 064): pods get this long, critical pods the last part of it. */
  shutdownGracePeriod: { total: "2m", criticalPods: "15s", totalSeconds: 120 },
});
