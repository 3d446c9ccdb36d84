// The renderer: one NodeGroup + the NodeGroupConfigurations and NodeUsers selecting it + the
// cluster context → the three objects served for that group (nodegroupbundles, bashibles,
// bootstrap). Pure: same inputs and same update epoch give byte-identical output.
import { canonicalJson, bundleChecksum } from "../../bundles/checksum.ts";
import { catalogueSteps, StepNameClashError } from "./catalogue.ts";
import { API_VERSION, CHECKSUM_ANNOTATION } from "../../bundles/types.ts";
import type { BundleContext, NodeGroupBundle, NodeUserSpec, RegistryPackageRef } from "../../bundles/types.ts";
import { RenderError } from "./errors.ts";
import type {
  ClusterContext,
  NodeGroupConfigurationObject,
  NodeGroupObject,
  NodeUserObject,
  RenderInputs,
} from "./inputs.ts";
import { renderTemplate, renderText } from "./templates.ts";
import { nextEpochChangeMs, updateEpoch } from "./update-epoch.ts";
import { CLEANUP_PATHS, defaultPackageRepository, NODE_USERS } from "../../bundles/paths.ts";
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

const selects = (nodeGroups: string[] | undefined, group: string) =>
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

function userSpec(u: NodeUserObject): NodeUserSpec {
  checkNodeUser(u);
  return {
    name: u.metadata.name,
    uid: u.spec.uid,
    sshPublicKeys: [...(u.spec.sshPublicKeys ?? [])],
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
    packagesProxy: { endpoints: [...ctx.packagesProxy.endpoints], token: ctx.packagesProxy.token },
  };
}

/** What a NodeGroupConfiguration's content may refer to with {{…}}: no secrets. */
function scriptView(context: BundleContext) {
  const { packagesProxy: _secret, ...rest } = context;
  return { ...rest, packagesProxy: { endpoints: context.packagesProxy.endpoints } };
}

function scripts(group: string, configurations: NodeGroupConfigurationObject[], context: BundleContext) {
  const view = scriptView(context);
  return configurations
    .filter((c) => selects(c.spec?.nodeGroups, group))
    .sort(byName)
    .map((c) => {
      checkConfiguration(c);
      const obj = `NodeGroupConfiguration/${c.metadata.name}`;
      checkScriptSize(obj, c.spec.content);
      const script = renderText(obj, c.spec.content, view);
      checkScriptSize(obj, script);
      const bundles = (c.spec.bundles ?? []).includes("*") ? [] : [...(c.spec.bundles ?? [])].sort();
      return { name: c.metadata.name, weight: c.spec.weight ?? 100, script, bundles };
    });
}

/** Renders one group; throws RenderError (naming the object at fault) on bad input. */
export function renderGroup(ng: NodeGroupObject, inputs: RenderInputs, nowMs: number): RenderedGroup {
  const group = ng.metadata?.name;
  checkGroupName(group);
  const ctx = inputs.context;
  checkContext(ctx);
  const context = bundleContext(ng, ctx, nowMs);
  const users = inputs.users
    .filter((u) => selects(u.spec?.nodeGroups, group))
    .sort(byName)
    .map(userSpec);
  const packages = packageRefs(ctx);
  let steps: NodeGroupBundle["steps"];
  try {
    steps = catalogueSteps({
      users,
      clusterCA: ctx.clusterCA,
      registryCA: ctx.registry?.ca,
      packages,
      scripts: scripts(group, inputs.configurations, context),
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
  const cleanupScript = renderTemplate("cleanup_static_node.sh", {
    nodeGroup: group,
    paths: CLEANUP_PATHS,
    userMarker: USER_MARKER,
  });
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
