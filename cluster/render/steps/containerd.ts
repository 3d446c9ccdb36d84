// 032_configure_containerd: for groups whose cri.type is Containerd or ContainerdV2 and whose
// containerd package the context has.
import { containerd } from "../../../bundles/steps/containerd.ts";
import { RenderError } from "../errors.ts";
import { KUBELET_DEFAULTS } from "./kubelet.ts";
import { checked, nodeGroupName, nodeGroupSpec, type SpecBuilder, type StepInput } from "./spec-builder.ts";

/** The package that installs containerd, by cri.type. */
export const CONTAINERD_PACKAGES = { Containerd: "containerd", ContainerdV2: "containerd2" } as const;
export const DEFAULT_SANDBOX_IMAGE = "registry.k8s.io/pause:3.10";
/** containerd's and the kubelet's cgroup driver. */
export const CGROUP_DRIVER = "systemd";

const CRI_TYPES = ["Containerd", "ContainerdV2", "NotManaged"] as const;
export type CriType = (typeof CRI_TYPES)[number];

/** The group's cri.type (default Containerd); a RenderError naming the NodeGroup for any other. */
export function criOf(i: StepInput): CriType {
  const cri = nodeGroupSpec(i).cri?.type ?? "Containerd";
  if (!(CRI_TYPES as readonly string[]).includes(cri)) {
    throw new RenderError(nodeGroupName(i), `spec.cri.type '${cri}' is not one of ${CRI_TYPES.join(", ")}`);
  }
  return cri as CriType;
}

/** The containerd package the group uses; none for NotManaged. */
export function containerdPackageOf(i: StepInput): string | undefined {
  const cri = criOf(i);
  return cri === "NotManaged" ? undefined : CONTAINERD_PACKAGES[cri];
}

/** Always kept off the proxy (Deckhouse's bb-set-proxy): loopback, the cloud metadata address, the cluster's domain. */
const NO_PROXY_ALWAYS = ["127.0.0.1", "169.254.169.254"];

/** The cluster's proxy as containerd's environment, or undefined when there is none. */
function proxyOf(i: StepInput) {
  const p = i.context.proxy;
  if (!p?.httpProxy && !p?.httpsProxy) return undefined;
  const noProxy = [...NO_PROXY_ALWAYS, i.context.clusterDomain ?? KUBELET_DEFAULTS.clusterDomain, ...(p.noProxy ?? [])];
  return {
    ...(p.httpProxy ? { httpProxy: p.httpProxy } : {}),
    ...(p.httpsProxy ? { httpsProxy: p.httpsProxy } : {}),
    noProxy: [...new Set(noProxy)],
  };
}

export const containerdSpec: SpecBuilder<"Containerd"> = (i) => {
  const pkg = containerdPackageOf(i);
  if (!pkg || !i.packages.some((p) => p.name === pkg)) return undefined;
  const spec = nodeGroupSpec(i);
  const r = i.context.registry;
  const proxy = proxyOf(i);
  return checked(
    containerd,
    {
      cgroupDriver: CGROUP_DRIVER,
      sandboxImage: i.context.images?.pause ?? DEFAULT_SANDBOX_IMAGE,
      snapshotter: "overlayfs",
      maxConcurrentDownloads:
        (criOf(i) === "ContainerdV2" ? spec.cri?.containerdV2 : spec.cri?.containerd)?.maxConcurrentDownloads ?? 3,
      registries: r
        ? [
            {
              host: r.address,
              scheme: r.scheme ?? "https",
              ...(r.ca ? { ca: r.ca } : {}),
              ...(r.auth ? { auth: r.auth } : {}),
              mirrors: [...(r.mirrors ?? [])],
            },
          ]
        : [],
      ...(proxy ? { proxy } : {}),
      package: pkg,
    },
    `${nodeGroupName(i)} (spec.cri) or the context (registry, images, proxy)`,
  );
};
