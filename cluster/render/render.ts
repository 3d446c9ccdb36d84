// The renderer: one NodeGroup + the NodeGroupConfigurations and NodeUsers selecting it + the
// cluster context → the three objects served for that group (nodegroupbundles, bashibles,
// bootstrap). Pure: same inputs and same update epoch give byte-identical output.
import { canonicalJson, bundleChecksum } from "../../bundles/checksum.ts";
import { API_VERSION, CHECKSUM_ANNOTATION } from "../../bundles/types.ts";
import type { BundleContext, NodeGroupBundle, NodeUserSpec, RegistryPackageRef } from "../../bundles/types.ts";
import { CLEANUP_EMPTY_DIRS, CLEANUP_PATHS, defaultPackageRepository, NODE_USERS, PATHS } from "../../bundles/paths.ts";
import { DECKHOUSE, DECKHOUSE_ONLY_PATHS, DECKHOUSE_ONLY_UNITS } from "../../bundles/deckhouse-node.ts";
import {
  DENY_STARTS_MARKER,
  DISTRO_PACKAGES,
  PACKAGE_MANAGERS,
  type PackageRole,
  POLICY_RC_D,
  ROLE_PURGE_LEFTOVERS,
} from "../../bundles/os-families.ts";
import { BUILTIN_STEP_NAMES, CLEANUP_UNITS } from "../../bundles/steps/index.ts";
import { catalogueSteps, type ScriptInput, scriptStepName, StepNameClashError } from "./catalogue.ts";
import { RenderError } from "./errors.ts";
import { EngineError, renderGoTemplate, TemplateError } from "./go-template.ts";
import type {
  ClusterContext,
  NodeGroupConfigurationObject,
  NodeGroupObject,
  NodeUserObject,
  RenderInputs,
} from "./inputs.ts";
import { renderTemplate } from "./templates.ts";
import { nextEpochChangeMs, updateEpoch } from "./update-epoch.ts";
import { checkNodeUserCount, checkServable } from "./limits.ts";
import { KUBELET_DEFAULTS } from "./steps/kubelet.ts";
import {
  checkConfiguration,
  checkContext,
  checkGroupName,
  checkNodeUser,
  checkScriptSize,
  MAX_SCRIPT_BYTES,
} from "./validate.ts";

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
      return { name, digest: p.digest, repository, ...(p.layer ? { layer: p.layer } : {}) };
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
    // Only when set: an agent older than the setting refuses a context key it does not know.
    ...(ctx.agent.metricsSecureAddress ? { agent: { metricsSecureAddress: ctx.agent.metricsSecureAddress } } : {}),
  };
}

function proxyOf(p: NonNullable<ClusterContext["proxy"]>): NonNullable<BundleContext["proxy"]> {
  return {
    ...(p.httpProxy ? { httpProxy: p.httpProxy } : {}),
    ...(p.httpsProxy ? { httpsProxy: p.httpsProxy } : {}),
    ...(p.noProxy?.length ? { noProxy: [...p.noProxy] } : {}),
  };
}

/** A value the template context keeps out: true in `if`, refused with `why` anywhere else (go-template.ts). */
const keptOut = (why: string) => ({ $keptOut: why });

const NOT_KNOWN = (path: string, what: string) =>
  keptOut(`${path} is kept out: ${what}; this server does not know it, so a script cannot read it`);

/**
 * What a NodeGroupConfiguration's content sees: Deckhouse's context for a node group
 * (bashible-apiserver context_builder.go, bundleNGContext): runType, bundle, kubernetesVersion,
 * cri, nodeGroup (all of the NodeGroup's spec plus name, updateEpoch, …), nodeUsers (as
 * Deckhouse passes them), normal (apiserverEndpoints, kubernetesCA, clusterDomain,
 * clusterDNSAddress, moduleSourcesCA, bootstrapTokens), registry, proxy, packagesProxy,
 * cloudProvider and nodeStatusUpdateFrequency when set, and Deckhouse's version map (k8s,
 * bashible) and images. Secrets and what this server cannot know are kept out: usable as a
 * condition, refused when printed or passed on, with the reason (docs/deckhouse-compatibility.md).
 */
function templateView(ng: NodeGroupObject, users: NodeUserObject[], ctx: ClusterContext, context: BundleContext) {
  const spec = structuredClone(ng.spec ?? {}) as Record<string, unknown>;
  const cri = (spec.cri as { type?: string } | undefined)?.type ?? "Containerd";
  const registryAuth = ctx.registry?.auth;
  return {
    runType: "Normal",
    // Deckhouse renders a node group once per OS bundle; here one render serves every OS.
    bundle: keptOut(
      ".bundle is kept out: it is the node's OS bundle, and this server renders one script for every OS of a group: test $BUNDLE (or bb-is-bundle) in the script, or list the bundles in spec.bundles",
    ),
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
        ...(u.spec.sshPublicKey ? { sshPublicKey: u.spec.sshPublicKey } : {}),
        ...(u.spec.sshPublicKeys?.length ? { sshPublicKeys: [...u.spec.sshPublicKeys] } : {}),
        passwordHash: u.spec.passwordHash
          ? keptOut(".nodeUsers[].spec.passwordHash is a secret, kept out of scripts (the NodeUser step sets it)")
          : "",
        isSudoer: u.spec.isSudoer === true,
        nodeGroups: u.spec.nodeGroups ? [...u.spec.nodeGroups] : null,
        ...(u.spec.extraGroups?.length ? { extraGroups: [...u.spec.extraGroups] } : {}),
      },
    })),
    normal: {
      apiserverEndpoints: [...ctx.apiserverEndpoints],
      kubernetesCA: ctx.clusterCA,
      clusterDomain: ctx.clusterDomain ?? KUBELET_DEFAULTS.clusterDomain,
      clusterDNSAddress: (ctx.clusterDNS ?? KUBELET_DEFAULTS.clusterDNS)[0] ?? "",
      // No ModuleSource objects here, so none has a CA.
      moduleSourcesCA: {},
      bootstrapTokens: keptOut(".normal.bootstrapTokens is a secret, kept out of scripts"),
    },
    registry: ctx.registry
      ? {
          address: ctx.registry.address,
          path: ctx.registry.path.startsWith("/") ? ctx.registry.path : `/${ctx.registry.path}`,
          scheme: ctx.registry.scheme ?? "https",
          ...(ctx.registry.ca ? { ca: ctx.registry.ca } : {}),
          auth: registryAuth
            ? keptOut(".registry.auth is a secret, kept out of scripts: read $REGISTRY_AUTH in the script")
            : "",
          dockerCfg: registryAuth ? keptOut(".registry.dockerCfg is a secret, kept out of scripts") : null,
        }
      : {},
    ...(context.proxy ? { proxy: structuredClone(context.proxy) } : {}),
    packagesProxy: {
      addresses: [...ctx.packagesProxy.endpoints],
      token: keptOut(".packagesProxy.token is a secret, kept out of scripts: read $PACKAGES_PROXY_TOKEN in the script"),
    },
    ...(ctx.cloudProvider ? { cloudProvider: structuredClone(ctx.cloudProvider) } : {}),
    ...(ctx.nodeStatusUpdateFrequency !== undefined
      ? { nodeStatusUpdateFrequency: ctx.nodeStatusUpdateFrequency }
      : {}),
    k8s: NOT_KNOWN(".k8s", "Deckhouse's version map (candi/version_map.yml)"),
    bashible: NOT_KNOWN(".bashible", "Deckhouse's version map (candi/version_map.yml)"),
    images: NOT_KNOWN(".images", "the digests of Deckhouse's module images"),
  };
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
    text = renderGoTemplate(c.spec.content, view, { name: step, maxOutput: MAX_SCRIPT_BYTES });
  } catch (err) {
    if (err instanceof TemplateError) throw new RenderError(obj, `spec.content ${err.message}`);
    // Never a script rendered some other way: the group keeps its last good bundle.
    if (err instanceof EngineError) throw new RenderError(obj, `spec.content cannot be rendered: ${err.message}`);
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

/** Each package manager's removal, as cleanup_static_node.sh runs it (the argv are plain words). */
function cleanupPackageManagers() {
  return Object.entries(PACKAGE_MANAGERS).map(([name, m]) => ({
    name,
    env: Object.entries({ ...m.env, ...m.removeEnv })
      .map(([k, v]) => `${k}=${v}`)
      .join(" "),
    unhold: m.unhold?.join(" ") ?? "",
    remove: m.remove.join(" "),
  }));
}

/** Renders one group; throws RenderError (naming the object at fault) on bad input. */
export function renderGroup(ng: NodeGroupObject, inputs: RenderInputs, nowMs: number): RenderedGroup {
  const group = ng.metadata?.name;
  checkGroupName(group);
  const ctx = inputs.context;
  checkContext(ctx);
  const context = bundleContext(ng, ctx, nowMs);
  const selected = inputs.users.filter((u) => selects(u.spec?.nodeGroups, group)).sort(byName);
  checkNodeUserCount(group, selected.length);
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
  const cleanupScript = renderTemplate("cleanup_static_node.sh", {
    nodeGroup: group,
    units: [...CLEANUP_UNITS, ...DECKHOUSE_ONLY_UNITS].join(" "),
    // What Deckhouse's own bashible left on a node this agent adopted from it, too.
    paths: [...CLEANUP_PATHS, ...DECKHOUSE_ONLY_PATHS],
    deckhouseUser: DECKHOUSE.user.name,
    deckhouseId: String(DECKHOUSE.user.id),
    emptyDirs: CLEANUP_EMPTY_DIRS.join(" "),
    // GECOS of users the NodeUsers step creates: cleanup removes only those.
    userMarker: NODE_USERS.marker,
    // What the operating-system steps recorded, for cleanup to undo (swap, distribution packages).
    swapRecord: PATHS.swapRecord,
    packagesRecord: PATHS.distroPackagesRecord,
    policyRcD: POLICY_RC_D,
    denyStartsMarker: DENY_STARTS_MARKER,
    packageManagers: cleanupPackageManagers(),
    // Only where the agent installed the role's packages.
    purgeLeftovers: Object.entries(ROLE_PURGE_LEFTOVERS).map(([role, l]) => ({
      packages: [...new Set(Object.values(DISTRO_PACKAGES).flatMap((f) => f[role as PackageRole]))].join("|"),
      files: l?.files.join(" ") ?? "",
      dirs: l?.dirs.join(" ") ?? "",
    })),
  });
  let steps: NodeGroupBundle["steps"];
  try {
    steps = catalogueSteps(
      { nodeGroup: ng, context: ctx, users: specs as NodeUserSpec[], packages, cleanupScript },
      scriptSteps,
    );
  } catch (err) {
    if (err instanceof StepNameClashError) throw new RenderError(err.source, err.message);
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
  checkServable(bundle);

  const agentRef = packages.find((p) => p.name === ctx.agent.package)!;
  const bashible: ServedObject = {
    apiVersion: API_VERSION,
    kind: "Bashible",
    metadata: { name: group, annotations },
    data: {
      "agent.package": agentRef.name,
      "agent.digest": agentRef.digest,
      "agent.repository": agentRef.repository,
      ...(agentRef.layer ? { "agent.layer": agentRef.layer } : {}),
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
