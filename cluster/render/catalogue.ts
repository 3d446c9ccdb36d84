// The step catalogue: which built-in steps every bundle has, under which names, in which
// order, and how custom NodeGroupConfiguration scripts join them. The renderer (cluster/render)
// validates its inputs and hands this module plain values; the output is the `steps` list of a
// NodeGroupBundle (bundles/types.ts), ordered by name.
import type {
  BashibleServiceSpec,
  BundleStep,
  ContainerdSpec,
  KubeletSpec,
  KubernetesApiProxySpec,
  NodeUserSpec,
  RegistryPackageRef,
  SpecOf,
} from "../../bundles/types.ts";
import { BUILTIN_STEPS } from "../../bundles/names.ts";

export interface CatalogueInput {
  users: NodeUserSpec[];
  clusterCA: string;
  registryCA?: string | undefined;
  packages: RegistryPackageRef[];
  scripts: { name: string; weight: number; script: string; bundles: string[] }[];
  /** Present when the group's nodes run a kubelet (the API proxy serves it). */
  apiProxy?: KubernetesApiProxySpec;
  /** Absent for cri.type NotManaged or without a containerd package. */
  containerd?: ContainerdSpec;
  kubelet?: KubeletSpec;
  kubeletStart?: SpecOf<"KubeletStart">;
  agent?: BashibleServiceSpec;
}

export { BUILTIN_STEPS };

export const BUILTIN_STEP_NAMES: ReadonlySet<string> = new Set(Object.values(BUILTIN_STEPS));

/**
 * `NNN_<name>`: the weight formatted as Go's `%03d` (Deckhouse's name for the step), so custom
 * steps order among built-ins by weight: 5 → `005_`, 1000 → `1000_`, -5 → `-05_`.
 */
export function scriptStepName(weight: number, name: string): string {
  const digits = String(Math.abs(weight));
  const sign = weight < 0 ? "-" : "";
  return `${sign}${digits.padStart(3 - sign.length, "0")}_${name}`;
}

export class StepNameClashError extends Error {
  override name = "StepNameClashError";
  readonly step: string;
  constructor(step: string, source: string) {
    super(`step name ${step} (from ${source}) is taken by a built-in step; rename the object or change its weight`);
    this.step = step;
  }
}

export function catalogueSteps(input: CatalogueInput): BundleStep[] {
  const certificates = [{ name: "kubernetes-ca", pem: input.clusterCA }];
  if (input.registryCA) certificates.push({ name: "registry-ca", pem: input.registryCA });
  const steps: BundleStep[] = [
    { name: BUILTIN_STEPS.nodeUsers, kind: "NodeUsers", spec: { users: input.users } },
    { name: BUILTIN_STEPS.caCertificates, kind: "CACertificates", spec: { certificates } },
    { name: BUILTIN_STEPS.deckhousePath, kind: "DeckhousePath", spec: {} },
    { name: BUILTIN_STEPS.registryPackages, kind: "RegistryPackages", spec: { packages: input.packages } },
  ];
  if (input.apiProxy) steps.push({ name: BUILTIN_STEPS.apiProxy, kind: "KubernetesApiProxy", spec: input.apiProxy });
  if (input.containerd) steps.push({ name: BUILTIN_STEPS.containerd, kind: "Containerd", spec: input.containerd });
  if (input.kubelet) steps.push({ name: BUILTIN_STEPS.kubelet, kind: "Kubelet", spec: input.kubelet });
  if (input.kubeletStart) {
    steps.push({ name: BUILTIN_STEPS.kubeletStart, kind: "KubeletStart", spec: input.kubeletStart });
  }
  if (input.agent) steps.push({ name: BUILTIN_STEPS.agent, kind: "BashibleService", spec: input.agent });
  for (const s of input.scripts) {
    const name = scriptStepName(s.weight, s.name);
    const source = `NodeGroupConfiguration/${s.name}`;
    if (BUILTIN_STEP_NAMES.has(name)) throw new StepNameClashError(name, source);
    steps.push({ name, kind: "Script", spec: { script: s.script, weight: s.weight, source, bundles: s.bundles } });
  }
  // Code-unit order, not locale order: the same on every machine.
  return steps.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
}
