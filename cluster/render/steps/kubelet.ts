// 064_configure_kubelet: for groups whose context has a kubelet package. Deckhouse's values for
// what the NodeGroup does not say. The machine's part (memory, disks, resolv.conf, the
// discovered address) the step reads on the node; what the kubelet registers the Node with is
// only the group, the node type and the uninitialized taint: nodeTemplate is the cluster side's.
import { NODE_KEYS } from "../../../bundles/names.ts";
import { kubelet } from "../../../bundles/steps/kubelet.ts";
import { RenderError } from "../errors.ts";
import { CGROUP_DRIVER, criOf } from "./containerd.ts";
import { checked, nodeGroupName, nodeGroupSpec, type SpecBuilder, type StepInput } from "./spec-builder.ts";

/** The package whose presence gives a group the kubelet steps and the API proxy. */
export const KUBELET_PACKAGE = "kubelet";

export const KUBELET_DEFAULTS = {
  containerLogMaxSize: "50Mi",
  containerLogMaxFiles: 4,
  clusterDNS: ["10.222.0.10"],
  clusterDomain: "cluster.local",
  /** Deckhouse's `.nodeStatusUpdateFrequency | default "10"`. */
  nodeStatusUpdateFrequencySeconds: 10,
  /** Deckhouse's default podSubnetNodeCIDRPrefix. */
  podSubnetNodeCIDRPrefix: 24,
} as const;

/** The CRD's spellings of the kubelet's topology manager policies. */
const TOPOLOGY_POLICIES: Record<string, string> = {
  None: "none",
  BestEffort: "best-effort",
  Restricted: "restricted",
  SingleNumaNode: "single-numa-node",
};

/** Whether the group's nodes run a kubelet (the kubelet steps and the API proxy serving it). */
export const runsKubelet = (i: StepInput) => i.packages.some((p) => p.name === KUBELET_PACKAGE);

/** resourceReservation.static values are int-or-string in the CRD; the kubelet reads strings. */
function quantities(q: { cpu?: string | number; memory?: string | number; ephemeralStorage?: string | number }) {
  return Object.fromEntries(
    Object.entries(q)
      .filter(([, v]) => v !== undefined && v !== null)
      .map(([k, v]) => [k, String(v)]),
  );
}

/**
 * maxPods when the NodeGroup sets none, as current Deckhouse derives it from the pod subnet
 * each node gets (ClusterConfiguration podSubnetNodeCIDRPrefix): /24 and narrower 120, /23 250,
 * /22 500, anything wider 1000. A pod that is terminating and its replacement both hold an
 * address, so a node needs about twice as many addresses as pods.
 */
export function maxPodsForPrefix(prefix: number): number {
  if (prefix >= 24) return 120;
  if (prefix === 23) return 250;
  if (prefix === 22) return 500;
  return 1000;
}

/** The context's podSubnetNodeCIDRPrefix ("24", as ClusterConfiguration spells it, or 24). */
function podSubnetPrefix(i: StepInput): number {
  const raw = i.context.podSubnetNodeCIDRPrefix;
  if (raw === undefined || raw === "") return KUBELET_DEFAULTS.podSubnetNodeCIDRPrefix;
  const n = typeof raw === "number" ? raw : /^\d{1,3}$/.test(raw) ? Number(raw) : Number.NaN;
  if (!Number.isInteger(n) || n < 1 || n > 32) {
    throw new RenderError("context", `podSubnetNodeCIDRPrefix '${raw}' is not a prefix length (1-32), like "24"`);
  }
  return n;
}

export const kubeletSpec: SpecBuilder<"Kubelet"> = (i) => {
  if (!runsKubelet(i)) return undefined;
  const spec = nodeGroupSpec(i);
  const ctx = i.context;
  const k = spec.kubelet ?? {};
  return checked(
    kubelet,
    {
      cgroupDriver: CGROUP_DRIVER,
      clusterDNS: [...(ctx.clusterDNS ?? KUBELET_DEFAULTS.clusterDNS)],
      clusterDomain: ctx.clusterDomain ?? KUBELET_DEFAULTS.clusterDomain,
      maxPods: k.maxPods ?? maxPodsForPrefix(podSubnetPrefix(i)),
      // kernel.panic 0 (a fenced machine stays down) is not the kubelet's 10: there it must not
      // refuse to start over it. It then sets its values when it starts, and the sysctl tuner,
      // which runs after every kubelet start, puts kernel.panic back to 0.
      protectKernelDefaults: spec.fencing?.mode !== "Watchdog",
      containerLogMaxSize: k.containerLogMaxSize ?? KUBELET_DEFAULTS.containerLogMaxSize,
      containerLogMaxFiles: k.containerLogMaxFiles ?? KUBELET_DEFAULTS.containerLogMaxFiles,
      nodeStatusUpdateFrequencySeconds:
        ctx.nodeStatusUpdateFrequency ?? KUBELET_DEFAULTS.nodeStatusUpdateFrequencySeconds,
      ...(spec.nodeType === "Static" ? { providerID: "static://" } : {}),
      resourceReservation: {
        mode: k.resourceReservation?.mode ?? "Auto",
        ...(k.resourceReservation?.static ? { static: quantities(k.resourceReservation.static) } : {}),
      },
      featureGates: { ...(ctx.kubelet?.featureGates ?? {}) },
      ...(k.seccompDefault !== undefined ? { seccompDefault: k.seccompDefault } : {}),
      ...(k.topologyManager?.enabled
        ? {
            topologyManager: {
              policy: TOPOLOGY_POLICIES[k.topologyManager.policy ?? "None"] ?? k.topologyManager.policy,
              scope: (k.topologyManager.scope ?? "Container").toLowerCase(),
            },
          }
        : {}),
      ...(k.memorySwap?.swapBehavior ? { swapBehavior: k.memorySwap.swapBehavior } : {}),
      ...(criOf(i) === "NotManaged" && spec.cri?.notManaged?.criSocketPath
        ? { criSocket: spec.cri.notManaged.criSocketPath }
        : {}),
      ...(k.rootDir ? { rootDir: k.rootDir } : {}),
      registerLabels: { [NODE_KEYS.group]: i.nodeGroup.metadata.name, [NODE_KEYS.nodeType]: spec.nodeType },
      registerTaints: [kubelet.uninitializedTaint],
      apiServer: kubelet.apiServer,
      package: KUBELET_PACKAGE,
    },
    `${nodeGroupName(i)} (spec.kubelet) or the context (clusterDNS, clusterDomain, kubelet, nodeStatusUpdateFrequency)`,
  );
};
