// 064_configure_kubelet: for groups whose context has a kubelet package. Deckhouse's defaults
// for what the NodeGroup does not say; labels and taints the kubelet registers the Node with.
import { kubeletMaySetLabel, NODE_KEYS } from "../../../bundles/names.ts";
import { kubelet } from "../../../bundles/steps/kubelet.ts";
import { CGROUP_DRIVER, criOf } from "./containerd.ts";
import { checked, nodeGroupName, nodeGroupSpec, type SpecBuilder, type StepInput } from "./spec-builder.ts";

/** The package whose presence gives a group the kubelet steps and the API proxy. */
export const KUBELET_PACKAGE = "kubelet";

export const KUBELET_DEFAULTS = {
  maxPods: 110,
  containerLogMaxSize: "50Mi",
  containerLogMaxFiles: 4,
  clusterDNS: ["10.222.0.10"],
  clusterDomain: "cluster.local",
  evictionHard: {
    "imagefs.available": "5%",
    "imagefs.inodesFree": "5%",
    "memory.available": "1%",
    "nodefs.available": "5%",
    "nodefs.inodesFree": "5%",
  },
  evictionSoft: {
    "imagefs.available": "10%",
    "imagefs.inodesFree": "10%",
    "memory.available": "2%",
    "nodefs.available": "10%",
    "nodefs.inodesFree": "10%",
  },
  softGracePeriod: "1m30s",
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

export const kubeletSpec: SpecBuilder<"Kubelet"> = (i) => {
  if (!runsKubelet(i)) return undefined;
  const spec = nodeGroupSpec(i);
  const ctx = i.context;
  const k = spec.kubelet ?? {};
  const labels: Record<string, string> = {};
  for (const [key, value] of Object.entries(spec.nodeTemplate?.labels ?? {})) {
    // The cluster side sets these on the Node; a kubelet asked to would not start.
    if (kubeletMaySetLabel(key)) labels[key] = value;
  }
  labels[NODE_KEYS.group] = i.nodeGroup.metadata.name;
  labels[NODE_KEYS.nodeType] = spec.nodeType;
  const soft = KUBELET_DEFAULTS.evictionSoft;
  return checked(
    kubelet,
    {
      cgroupDriver: CGROUP_DRIVER,
      clusterDNS: [...(ctx.clusterDNS ?? KUBELET_DEFAULTS.clusterDNS)],
      clusterDomain: ctx.clusterDomain ?? KUBELET_DEFAULTS.clusterDomain,
      maxPods: k.maxPods ?? KUBELET_DEFAULTS.maxPods,
      containerLogMaxSize: k.containerLogMaxSize ?? KUBELET_DEFAULTS.containerLogMaxSize,
      containerLogMaxFiles: k.containerLogMaxFiles ?? KUBELET_DEFAULTS.containerLogMaxFiles,
      evictionHard: { ...KUBELET_DEFAULTS.evictionHard },
      evictionSoft: { ...soft },
      evictionSoftGracePeriod: Object.fromEntries(Object.keys(soft).map((s) => [s, KUBELET_DEFAULTS.softGracePeriod])),
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
      nodeLabels: labels,
      nodeTaints: [
        kubelet.uninitializedTaint,
        ...(spec.nodeTemplate?.taints ?? []).map((t) => ({
          key: t.key,
          ...(t.value ? { value: t.value } : {}),
          effect: t.effect,
        })),
      ],
      apiServer: kubelet.apiServer,
      package: KUBELET_PACKAGE,
    },
    `${nodeGroupName(i)} (spec.kubelet, spec.nodeTemplate) or the context (clusterDNS, clusterDomain, kubelet)`,
  );
};
