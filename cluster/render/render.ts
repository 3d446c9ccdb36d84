// The renderer: one NodeGroup + the NodeGroupConfigurations and NodeUsers selecting it + the
// cluster context → the three objects served for that group (nodegroupbundles, bashibles,
// bootstrap). Pure: same inputs and same update epoch give byte-identical output.
import { canonicalJson, bundleChecksum } from "../../bundles/checksum.ts";
import {
  BUILTIN_STEP_NAMES,
  BUILTIN_STEPS,
  type CatalogueInput,
  catalogueSteps,
  scriptStepName,
  StepNameClashError,
} from "./catalogue.ts";
import { API_VERSION, CHECKSUM_ANNOTATION } from "../../bundles/types.ts";
import type {
  BundleContext,
  ContainerdSpec,
  KubeletSpec,
  NodeGroupBundle,
  NodeUserSpec,
  RegistryPackageRef,
  SpecOf,
  StepKind,
} from "../../bundles/types.ts";
import { STEP_SPECS } from "../../bundles/specs.ts";
import { SpecError } from "../../bundles/schema.ts";
import { kubeletMaySetLabel, NODE_KEYS } from "../../bundles/names.ts";
import { RenderError } from "./errors.ts";
import { renderGoTemplate, TemplateError } from "./go-template.ts";
import type {
  ClusterContext,
  NodeGroupConfigurationObject,
  NodeGroupObject,
  NodeUserObject,
  RenderInputs,
} from "./inputs.ts";
import { renderTemplate } from "./templates.ts";
import { nextEpochChangeMs, updateEpoch } from "./update-epoch.ts";
import { API_PROXY_LISTEN, CLEANUP_PATHS, defaultPackageRepository, NODE_USERS } from "../../bundles/paths.ts";
import { checkConfiguration, checkContext, checkGroupName, checkNodeUser, checkScriptSize } from "./validate.ts";

/** GECOS of users the NodeUsers step creates; cleanup removes only those. */
export const USER_MARKER = NODE_USERS.marker;
export { CLEANUP_PATHS };

export interface ServedObject {
  apiVersion: typeof API_VERSION;
  kind: string;
  metadata: { name: string; resourceVersion?: string; annotations?: Record<string, string> };
  [k: string]: unknown;
}

export interface RenderedGroup {
  name: string;
  checksum: string;
  bundle: NodeGroupBundle;
  bashible: ServedObject;
  bootstrap: ServedObject;
  /** When the update epoch, and so the checksum, changes next (ms since the Unix epoch). */
  nextEpochChangeMs: number;
}

/** Whether an object's `nodeGroups` (empty = all) selects the group. */
export const selects = (nodeGroups: string[] | undefined, group: string) =>
  (nodeGroups?.length ? nodeGroups : ["*"]).some((g) => g === "*" || g === group);

const byName = <T extends { metadata: { name: string } }>(a: T, b: T) =>
  a.metadata.name < b.metadata.name ? -1 : a.metadata.name > b.metadata.name ? 1 : 0;

function packageRefs(ctx: ClusterContext): RegistryPackageRef[] {
  return Object.keys(ctx.packages ?? {})
    .sort()
    .map((name) => {
      const p = ctx.packages[name]!;
      const repository = p.repository ?? defaultPackageRepository(ctx.registry) ?? "";
      if (!repository) {
        throw new RenderError("context", `packages.${name} has no repository and the context has no registry`);
      }
      return { name, digest: p.digest, repository };
    });
}

/** The deprecated single key first, then the list; each key once. */
const userKeys = (u: NodeUserObject): string[] => [
  ...new Set([...(u.spec.sshPublicKey ? [u.spec.sshPublicKey] : []), ...(u.spec.sshPublicKeys ?? [])]),
];

function userSpec(u: NodeUserObject): NodeUserSpec {
  checkNodeUser(u);
  return {
    name: u.metadata.name,
    uid: u.spec.uid,
    sshPublicKeys: userKeys(u),
    ...(u.spec.passwordHash ? { passwordHash: u.spec.passwordHash } : {}),
    isSudoer: u.spec.isSudoer === true,
    extraGroups: [...(u.spec.extraGroups ?? [])].sort(),
  };
}

function bundleContext(ng: NodeGroupObject, ctx: ClusterContext, nowMs: number): BundleContext {
  const spec = ng.spec ?? ({} as NodeGroupObject["spec"]);
  const nodeTypes = ["CloudEphemeral", "CloudPermanent", "CloudStatic", "Static"];
  if (!nodeTypes.includes(spec.nodeType)) {
    throw new RenderError(
      `NodeGroup/${ng.metadata.name}`,
      `spec.nodeType '${spec.nodeType}' is not one of ${nodeTypes.join(", ")}`,
    );
  }
  // Only fields that change what a node does go in: scale fields (cloudInstances, …) must not
  // change the checksum, or scaling a group would re-run every node in it.
  return {
    kubernetesVersion: ctx.kubernetesVersion,
    nodeGroup: {
      name: ng.metadata.name,
      nodeType: spec.nodeType,
      disruptions: { approvalMode: spec.disruptions?.approvalMode ?? "Automatic" },
      ...(spec.fencing ? { fencing: { mode: spec.fencing.mode } } : {}),
      ...(spec.earlyOom ? { earlyOom: { ...spec.earlyOom } } : {}),
      updateEpoch: updateEpoch(ctx.clusterUUID, ng.metadata.name, nowMs),
    },
    apiserverEndpoints: [...ctx.apiserverEndpoints],
    clusterCA: ctx.clusterCA,
    ...(ctx.registry
      ? {
          registry: {
            address: ctx.registry.address,
            path: ctx.registry.path,
            ...(ctx.registry.ca ? { ca: ctx.registry.ca } : {}),
          },
        }
      : {}),
    ...(ctx.proxy ? { proxy: proxyOf(ctx.proxy) } : {}),
    packagesProxy: { endpoints: [...ctx.packagesProxy.endpoints], token: ctx.packagesProxy.token },
  };
}

function proxyOf(p: NonNullable<ClusterContext["proxy"]>): NonNullable<BundleContext["proxy"]> {
  return {
    ...(p.httpProxy ? { httpProxy: p.httpProxy } : {}),
    ...(p.httpsProxy ? { httpsProxy: p.httpsProxy } : {}),
    ...(p.noProxy?.length ? { noProxy: [...p.noProxy] } : {}),
  };
}

/**
 * What a NodeGroupConfiguration's content sees, shaped like Deckhouse's `bundle-<group>`
 * context: .runType, .kubernetesVersion, .cri, .nodeGroup (all of the NodeGroup's spec plus
 * name, updateEpoch, …), .nodeUsers, .normal.apiserverEndpoints/.kubernetesCA, .registry,
 * .proxy, .packagesProxy.addresses. No secrets: no proxy token, no password hashes.
 */
function templateView(ng: NodeGroupObject, users: NodeUserObject[], ctx: ClusterContext, context: BundleContext) {
  const spec = structuredClone(ng.spec ?? {}) as Record<string, unknown>;
  const cri = (spec.cri as { type?: string } | undefined)?.type ?? "Containerd";
  return {
    runType: "Normal",
    kubernetesVersion: ctx.kubernetesVersion,
    cri,
    nodeGroup: {
      ...spec,
      name: ng.metadata.name,
      nodeType: context.nodeGroup.nodeType,
      kubernetesVersion: ctx.kubernetesVersion,
      cri: { ...(spec.cri as object | undefined), type: cri },
      disruptions: {
        ...(spec.disruptions as object | undefined),
        approvalMode: context.nodeGroup.disruptions.approvalMode,
      },
      updateEpoch: context.nodeGroup.updateEpoch,
    },
    nodeUsers: users.map((u) => ({
      name: u.metadata.name,
      spec: {
        uid: u.spec.uid,
        sshPublicKeys: userKeys(u),
        isSudoer: u.spec.isSudoer === true,
        extraGroups: [...(u.spec.extraGroups ?? [])],
        nodeGroups: [...(u.spec.nodeGroups?.length ? u.spec.nodeGroups : ["*"])],
      },
    })),
    normal: { apiserverEndpoints: [...ctx.apiserverEndpoints], kubernetesCA: ctx.clusterCA },
    registry: ctx.registry
      ? {
          address: ctx.registry.address,
          path: ctx.registry.path.startsWith("/") ? ctx.registry.path : `/${ctx.registry.path}`,
          scheme: "https",
          ...(ctx.registry.ca ? { ca: ctx.registry.ca } : {}),
        }
      : {},
    ...(context.proxy ? { proxy: structuredClone(context.proxy) } : {}),
    packagesProxy: { addresses: [...ctx.packagesProxy.endpoints] },
  };
}

interface ScriptInput {
  name: string;
  weight: number;
  script: string;
  bundles: string[];
}

/** One NodeGroupConfiguration's step, or the RenderError naming it. */
function script(c: NodeGroupConfigurationObject, view: unknown): ScriptInput {
  checkConfiguration(c);
  const obj = `NodeGroupConfiguration/${c.metadata.name}`;
  const weight = c.spec.weight ?? 100;
  const step = scriptStepName(weight, c.metadata.name);
  if (BUILTIN_STEP_NAMES.has(step)) {
    throw new RenderError(obj, new StepNameClashError(step, obj).message);
  }
  checkScriptSize(obj, c.spec.content);
  let text: string;
  try {
    text = renderGoTemplate(c.spec.content, view);
  } catch (err) {
    if (err instanceof TemplateError) throw new RenderError(obj, `spec.content ${err.message}`);
    throw err;
  }
  checkScriptSize(obj, text);
  const bundles = (c.spec.bundles ?? []).includes("*") ? [] : [...new Set(c.spec.bundles ?? [])].sort();
  return { name: c.metadata.name, weight, script: text, bundles };
}

/** Every selecting NodeGroupConfiguration rendered; all their errors at once, so each is reported. */
function scripts(configurations: NodeGroupConfigurationObject[], group: string, view: unknown): ScriptInput[] {
  const out: ScriptInput[] = [];
  const errors: RenderError[] = [];
  for (const c of configurations.filter((c) => selects(c.spec?.nodeGroups, group)).sort(byName)) {
    try {
      out.push(script(c, view));
    } catch (err) {
      if (!(err instanceof RenderError)) throw err;
      errors.push(err);
    }
  }
  if (errors.length === 1) throw errors[0];
  if (errors.length) throw new RenderError(errors[0]!.object, errors.map((e) => e.message).join("; "), errors);
  return out;
}

/** Packages that decide which node software steps a group gets. */
export const KUBELET_PACKAGE = "kubelet";
export const CONTAINERD_PACKAGES = { Containerd: "containerd", ContainerdV2: "containerd2" } as const;

/** Deckhouse's defaults for what a NodeGroup does not say. */
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
  clientCertTimeoutSeconds: 300,
} as const;
export const DEFAULT_SANDBOX_IMAGE = "registry.k8s.io/pause:3.10";

/** The CRD's spellings of the kubelet's topology manager policies. */
const TOPOLOGY_POLICIES: Record<string, string> = {
  None: "none",
  BestEffort: "best-effort",
  Restricted: "restricted",
  SingleNumaNode: "single-numa-node",
};

/** resourceReservation.static values are int-or-string in the CRD; the kubelet reads strings. */
function quantities(q: { cpu?: string | number; memory?: string | number; ephemeralStorage?: string | number }) {
  return Object.fromEntries(
    Object.entries(q)
      .filter(([, v]) => v !== undefined && v !== null)
      .map(([k, v]) => [k, String(v)]),
  );
}

/** A rendered spec checked against the contract, so a bad input is the renderer's error naming its source. */
function checked<K extends StepKind>(kind: K, spec: unknown, source: string, step: string): SpecOf<K> {
  try {
    return STEP_SPECS[kind].parse(spec, step) as SpecOf<K>;
  } catch (err) {
    if (err instanceof SpecError) throw new RenderError(source, err.message);
    throw err;
  }
}

interface NodeSoftware {
  /** What 007 installs: the agent and the containerd package the group does not use left out. */
  packages: RegistryPackageRef[];
  apiProxy?: CatalogueInput["apiProxy"];
  containerd?: ContainerdSpec;
  kubelet?: KubeletSpec;
  kubeletStart?: CatalogueInput["kubeletStart"];
  agent?: CatalogueInput["agent"];
}

/** containerd, the kubelet, the API proxy and the agent's own step, from the NodeGroup's kubelet/cri and the context. */
function nodeSoftware(
  ng: NodeGroupObject,
  ctx: ClusterContext,
  packages: RegistryPackageRef[],
  cleanupScript: string,
): NodeSoftware {
  const ngName = `NodeGroup/${ng.metadata.name}`;
  const spec = ng.spec ?? ({} as NodeGroupObject["spec"]);
  const cri = spec.cri?.type ?? "Containerd";
  if (!["Containerd", "ContainerdV2", "NotManaged"].includes(cri)) {
    throw new RenderError(ngName, `spec.cri.type '${cri}' is not one of Containerd, ContainerdV2, NotManaged`);
  }
  const containerdPkg = cri === "NotManaged" ? undefined : CONTAINERD_PACKAGES[cri as "Containerd" | "ContainerdV2"];
  const unused = new Set<string>(Object.values(CONTAINERD_PACKAGES).filter((p) => p !== containerdPkg));
  unused.add(ctx.agent.package);
  const byName = new Map(packages.map((p) => [p.name, p]));
  const out: NodeSoftware = { packages: packages.filter((p) => !unused.has(p.name)) };
  const agentRef = byName.get(ctx.agent.package);
  if (agentRef) {
    out.agent = checked("BashibleService", { agent: agentRef, cleanupScript }, "context", BUILTIN_STEPS.agent);
  }
  const cgroupDriver = "systemd";
  if (containerdPkg && byName.has(containerdPkg)) {
    const r = ctx.registry;
    out.containerd = checked(
      "Containerd",
      {
        cgroupDriver,
        sandboxImage: ctx.images?.pause ?? DEFAULT_SANDBOX_IMAGE,
        snapshotter: "overlayfs",
        maxConcurrentDownloads:
          (cri === "ContainerdV2" ? spec.cri?.containerdV2 : spec.cri?.containerd)?.maxConcurrentDownloads ?? 3,
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
        package: containerdPkg,
      },
      `${ngName} (spec.cri) or the context (registry, images)`,
      BUILTIN_STEPS.containerd,
    );
  }
  if (byName.has(KUBELET_PACKAGE)) {
    const k = spec.kubelet ?? {};
    const labels: Record<string, string> = {};
    for (const [key, value] of Object.entries(spec.nodeTemplate?.labels ?? {})) {
      // The cluster side sets these on the Node; a kubelet asked to would not start.
      if (kubeletMaySetLabel(key)) labels[key] = value;
    }
    labels[NODE_KEYS.group] = ng.metadata.name;
    labels[NODE_KEYS.nodeType] = spec.nodeType;
    const soft = KUBELET_DEFAULTS.evictionSoft;
    out.kubelet = checked(
      "Kubelet",
      {
        cgroupDriver,
        clusterDNS: [...(ctx.clusterDNS ?? KUBELET_DEFAULTS.clusterDNS)],
        clusterDomain: ctx.clusterDomain ?? KUBELET_DEFAULTS.clusterDomain,
        maxPods: k.maxPods ?? KUBELET_DEFAULTS.maxPods,
        containerLogMaxSize: k.containerLogMaxSize ?? KUBELET_DEFAULTS.containerLogMaxSize,
        containerLogMaxFiles: k.containerLogMaxFiles ?? KUBELET_DEFAULTS.containerLogMaxFiles,
        evictionHard: { ...KUBELET_DEFAULTS.evictionHard },
        evictionSoft: { ...soft },
        evictionSoftGracePeriod: Object.fromEntries(
          Object.keys(soft).map((s) => [s, KUBELET_DEFAULTS.softGracePeriod]),
        ),
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
        ...(cri === "NotManaged" && spec.cri?.notManaged?.criSocketPath
          ? { criSocket: spec.cri.notManaged.criSocketPath }
          : {}),
        ...(k.rootDir ? { rootDir: k.rootDir } : {}),
        nodeLabels: labels,
        nodeTaints: [
          { key: NODE_KEYS.uninitializedTaint, effect: "NoSchedule" },
          ...(spec.nodeTemplate?.taints ?? []).map((t) => ({
            key: t.key,
            ...(t.value ? { value: t.value } : {}),
            effect: t.effect,
          })),
        ],
        apiServer: `https://${API_PROXY_LISTEN}`,
        package: KUBELET_PACKAGE,
      },
      `${ngName} (spec.kubelet, spec.nodeTemplate) or the context (clusterDNS, clusterDomain, kubelet)`,
      BUILTIN_STEPS.kubelet,
    );
    out.kubeletStart = { clientCertTimeoutSeconds: KUBELET_DEFAULTS.clientCertTimeoutSeconds };
    out.apiProxy = checked(
      "KubernetesApiProxy",
      { listen: API_PROXY_LISTEN, upstreams: [...ctx.apiserverEndpoints] },
      "context",
      BUILTIN_STEPS.apiProxy,
    );
  }
  return out;
}

/** Renders one group; throws RenderError (naming the object at fault) on bad input. */
export function renderGroup(ng: NodeGroupObject, inputs: RenderInputs, nowMs: number): RenderedGroup {
  const group = ng.metadata?.name;
  checkGroupName(group);
  const ctx = inputs.context;
  checkContext(ctx);
  const context = bundleContext(ng, ctx, nowMs);
  const selected = inputs.users.filter((u) => selects(u.spec?.nodeGroups, group)).sort(byName);
  const packages = packageRefs(ctx);
  // A bad NodeUser and a bad NodeGroupConfiguration are both reported, not only the first.
  const errors: RenderError[] = [];
  const attempt = <T>(f: () => T): T | undefined => {
    try {
      return f();
    } catch (err) {
      if (!(err instanceof RenderError)) throw err;
      errors.push(...err.causes);
      return undefined;
    }
  };
  const specs = selected.map((u) => attempt(() => userSpec(u)));
  const valid = selected.filter((_, i) => specs[i] !== undefined);
  const scriptSteps = attempt(() => scripts(inputs.configurations, group, templateView(ng, valid, ctx, context)));
  if (errors.length || !scriptSteps) {
    const unique = [...new Map(errors.map((e) => [e.message, e])).values()];
    throw unique.length === 1
      ? unique[0]!
      : new RenderError(unique[0]!.object, unique.map((e) => e.message).join("; "), unique);
  }
  const users = specs as NodeUserSpec[];
  const cleanupScript = renderTemplate("cleanup_static_node.sh", {
    nodeGroup: group,
    paths: CLEANUP_PATHS,
    userMarker: USER_MARKER,
  });
  const software = nodeSoftware(ng, ctx, packages, cleanupScript);
  let steps: NodeGroupBundle["steps"];
  try {
    steps = catalogueSteps({
      users,
      clusterCA: ctx.clusterCA,
      registryCA: ctx.registry?.ca,
      scripts: scriptSteps,
      ...software,
    });
  } catch (err) {
    if (err instanceof StepNameClashError) {
      const source = err.message.match(/from (\S+)\)/)?.[1] ?? "NodeGroupConfiguration";
      throw new RenderError(source, err.message);
    }
    throw err;
  }
  const checksum = bundleChecksum({ nodeGroup: group, context, steps });
  const annotations = { [CHECKSUM_ANNOTATION]: checksum };
  const bundle: NodeGroupBundle = {
    apiVersion: API_VERSION,
    kind: "NodeGroupBundle",
    metadata: { name: group, annotations },
    nodeGroup: group,
    context,
    steps,
    checksum,
  };

  const agentRef = packages.find((p) => p.name === ctx.agent.package)!;
  const bashible: ServedObject = {
    apiVersion: API_VERSION,
    kind: "Bashible",
    metadata: { name: group, annotations },
    data: {
      "agent.package": agentRef.name,
      "agent.digest": agentRef.digest,
      "agent.repository": agentRef.repository,
      "agent.version": ctx.agent.version,
      "cleanup_static_node.sh": cleanupScript,
    },
  };
  const bootstrap: ServedObject = {
    apiVersion: API_VERSION,
    kind: "Bootstrap",
    metadata: { name: group, annotations },
    bootstrap: renderTemplate("bootstrap-phase2.sh", {
      nodeGroup: group,
      apiserverEndpoints: ctx.apiserverEndpoints,
      proxyEndpoints: ctx.packagesProxy.endpoints,
      proxyToken: ctx.packagesProxy.token,
      cleanupScript: cleanupScript.trimEnd(),
    }),
  };
  return {
    name: group,
    checksum,
    bundle,
    bashible,
    bootstrap,
    nextEpochChangeMs: nextEpochChangeMs(ctx.clusterUUID, group, nowMs),
  };
}

export interface RenderResult {
  groups: Map<string, RenderedGroup>;
  errors: Map<string, RenderError>;
}

/** Renders every group; one group's bad input does not stop the others. */
export function renderAll(inputs: RenderInputs, nowMs: number): RenderResult {
  const groups = new Map<string, RenderedGroup>();
  const errors = new Map<string, RenderError>();
  for (const ng of [...inputs.nodeGroups].sort(byName)) {
    try {
      groups.set(ng.metadata.name, renderGroup(ng, inputs, nowMs));
    } catch (err) {
      if (!(err instanceof RenderError)) throw err;
      errors.set(ng.metadata.name, err);
    }
  }
  return { groups, errors };
}

/** The bytes served for an object: canonical JSON, so equal content is equal bytes. */
export const serialize = (obj: unknown): string => canonicalJson(obj);
