// The step catalogue: a group's built-in steps, each named by its descriptor (bundles/steps/)
// and built by its spec builder (cluster/render/steps/), and the custom NodeGroupConfiguration
// scripts among them, ordered by name. The renderer validates its inputs and hands this module
// plain values; the output is the `steps` list of a NodeGroupBundle (bundles/types.ts).
import { BUILTIN_LIST, BUILTIN_STEP_NAMES, type BuiltinKind } from "../../bundles/steps/index.ts";
import type { BundleStep } from "../../bundles/types.ts";
import { agentSpec } from "./steps/bashible-service.ts";
import { caCertificatesSpec } from "./steps/ca-certificates.ts";
import { containerdSpec } from "./steps/containerd.ts";
import { deckhousePathSpec } from "./steps/deckhouse-path.ts";
import { kubeletSpec } from "./steps/kubelet.ts";
import { kubeletStartSpec } from "./steps/kubelet-start.ts";
import { kernelModulesSpec } from "./steps/kernel-modules.ts";
import { hostnameCheckSpec, hostnameUniquenessSpec } from "./steps/hostname.ts";
import { networkdIpRulesSpec, rpFilterSpec } from "./steps/network.ts";
import { journaldSpec, logRotationSpec, rsyslogKubeletSpec } from "./steps/logging.ts";
import { swapSpec } from "./steps/swap.ts";
import { sysctlTunerSpec } from "./steps/sysctl-tuner.ts";
import { nodeIpSpec } from "./steps/node-ip.ts";
import { bootstrapCleanupSpec, filePermissionsSpec } from "./steps/after-bootstrap.ts";
import { distroPackagesSpec } from "./steps/distro-packages.ts";
import { apiProxySpec } from "./steps/kubernetes-api-proxy.ts";
import { nodeUsersSpec } from "./steps/node-users.ts";
import { registryPackagesSpec } from "./steps/registry-packages.ts";
import type { SpecBuilder, StepInput } from "./steps/spec-builder.ts";

/** Each built-in kind's spec builder (typed over every kind: a kind without one does not compile). */
const BUILDERS: { [K in BuiltinKind]: SpecBuilder<K> } = {
  DistributionPackages: distroPackagesSpec,
  NodeUsers: nodeUsersSpec,
  NodeIp: nodeIpSpec,
  KubernetesApiProxy: apiProxySpec,
  CACertificates: caCertificatesSpec,
  DeckhousePath: deckhousePathSpec,
  KernelModules: kernelModulesSpec,
  HostnameCheck: hostnameCheckSpec,
  HostnameUniqueness: hostnameUniquenessSpec,
  RpFilter: rpFilterSpec,
  Swap: swapSpec,
  SysctlTuner: sysctlTunerSpec,
  NetworkdIpRules: networkdIpRulesSpec,
  RsyslogKubeletFilter: rsyslogKubeletSpec,
  Journald: journaldSpec,
  LogRotation: logRotationSpec,
  RegistryPackages: registryPackagesSpec,
  Containerd: containerdSpec,
  Kubelet: kubeletSpec,
  KubeletStart: kubeletStartSpec,
  BashibleService: agentSpec,
  BootstrapCleanup: bootstrapCleanupSpec,
  FilePermissions: filePermissionsSpec,
};

export interface ScriptInput {
  name: string;
  weight: number;
  script: string;
  bundles: string[];
}

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
  /** The object whose step it would be: NodeGroupConfiguration/<name>. */
  readonly source: string;
  constructor(step: string, source: string) {
    super(`step name ${step} (from ${source}) is taken by a built-in step; rename the object or change its weight`);
    this.step = step;
    this.source = source;
  }
}

/** A built-in step of the group, or undefined when its builder leaves it out. */
function builtin<K extends BuiltinKind>(d: { name: string; kind: K }, input: StepInput): BundleStep | undefined {
  const spec = BUILDERS[d.kind](input);
  return spec === undefined ? undefined : ({ name: d.name, kind: d.kind, spec } as BundleStep);
}

export function catalogueSteps(input: StepInput, scripts: ScriptInput[]): BundleStep[] {
  const steps: BundleStep[] = [];
  for (const d of BUILTIN_LIST) {
    const step = builtin(d, input);
    if (step) steps.push(step);
  }
  for (const s of scripts) {
    const name = scriptStepName(s.weight, s.name);
    const source = `NodeGroupConfiguration/${s.name}`;
    if (BUILTIN_STEP_NAMES.has(name)) throw new StepNameClashError(name, source);
    steps.push({ name, kind: "Script", spec: { script: s.script, weight: s.weight, source, bundles: s.bundles } });
  }
  // Code-unit order, not locale order: the same on every machine.
  return steps.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
}
