// What a built-in step's spec builder gets and returns. Each builder (one per built-in step,
// beside this file) turns the NodeGroup and the cluster context into its step's spec, or leaves
// the step out of the group's bundle (undefined); the catalogue names and orders them.
import type { Infer } from "../../../bundles/schema.ts";
import { SpecError } from "../../../bundles/schema.ts";
import type { BuiltinStep } from "../../../bundles/steps/descriptor.ts";
import type { BuiltinKind } from "../../../bundles/steps/index.ts";
import type { NodeUserSpec, RegistryPackageRef, SpecOf } from "../../../bundles/types.ts";
import { RenderError } from "../errors.ts";
import type { ClusterContext, NodeGroupObject } from "../inputs.ts";

export interface StepInput {
  nodeGroup: NodeGroupObject;
  context: ClusterContext;
  /** The NodeUsers selecting the group, checked, by name. */
  users: NodeUserSpec[];
  /** Every registry package of the context with its repository, by name. */
  packages: RegistryPackageRef[];
  /** cleanup_static_node.sh for the group, as bashibles/<group> serves it. */
  cleanupScript: string;
}

export type SpecBuilder<K extends BuiltinKind> = (input: StepInput) => SpecOf<K> | undefined;

/**
 * A built spec checked against the step's schema, so a bad input is the renderer's error naming
 * `source` (where the value came from) rather than a bundle every node refuses.
 */
export function checked<D extends BuiltinStep>(step: D, spec: unknown, source: string): Infer<D["spec"]> {
  try {
    return step.spec.parse(spec, step.name) as Infer<D["spec"]>;
  } catch (err) {
    if (err instanceof SpecError) throw new RenderError(source, err.message);
    throw err;
  }
}

/** `NodeGroup/<name>`, as errors name it. */
export const nodeGroupName = (i: StepInput) => `NodeGroup/${i.nodeGroup.metadata.name}`;

/** The NodeGroup's spec; an object from a config dir may have none. */
export const nodeGroupSpec = (i: StepInput): NodeGroupObject["spec"] =>
  i.nodeGroup.spec ?? ({} as NodeGroupObject["spec"]);
