// The NodeGroupBundle: what the bundle server renders for one node group and what the agent
// converges to. Self-contained and deterministic; its checksum is sha256 over the canonical
// serialisation of {nodeGroup, context, steps} (bundles/checksum.ts). Step specs and the
// context are defined as schemas in bundles/specs.ts (a built-in step's in its descriptor,
// bundles/steps/); this file is the envelope.
import type { BundleContext, BundleStep } from "./specs.ts";

export type {
  BashibleServiceSpec,
  BundleContext,
  BundleStep,
  CACertificatesSpec,
  ContainerdRegistry,
  ContainerdSpec,
  KubeletSpec,
  KubernetesApiProxySpec,
  NodeTaint,
  NodeUserSpec,
  RegistryPackageRef,
  RegistryPackagesSpec,
  ScriptSpec,
  SpecOf,
  StepKind,
} from "./specs.ts";

export const API_GROUP = "bashible.deckhouse.io";
export const API_VERSION = `${API_GROUP}/v1alpha1`;
export const CHECKSUM_ANNOTATION = `${API_GROUP}/configuration-checksum`;

export interface NodeGroupBundle {
  apiVersion: typeof API_VERSION;
  kind: "NodeGroupBundle";
  metadata: { name: string; resourceVersion?: string; annotations?: Record<string, string> };
  nodeGroup: string;
  context: BundleContext;
  /** Ordered by name (`NNN_name`). */
  steps: BundleStep[];
  checksum: string;
}
