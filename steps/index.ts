// Step kind → module. Modules load on demand, so a converge only loads the steps its bundle
// names. A built-in kind's name and spec schema are in its descriptor (bundles/steps/<kind>.ts).
import type { SpecOf, StepKind } from "../bundles/types.ts";
import type { Host } from "../host/host.ts";
import type { Change, OwnChange, Plan, Problem, ServiceDecl, Step, StepContext } from "./types.ts";

type Modules = { [K in StepKind]: () => Promise<{ default: Step<K, Change> }> };

export const STEPS: Modules = {
  DistributionPackages: () => import("./distro-packages.ts"),
  NodeUsers: () => import("./node-users.ts"),
  NodeIp: () => import("./node-ip.ts"),
  CACertificates: () => import("./ca-certificates.ts"),
  DeckhousePath: () => import("./deckhouse-path.ts"),
  KernelModules: () => import("./kernel-modules.ts"),
  HostnameCheck: () => import("./hostname-check.ts"),
  HostnameUniqueness: () => import("./hostname-uniqueness.ts"),
  RpFilter: () => import("./rp-filter.ts"),
  Swap: () => import("./swap.ts"),
  SysctlTuner: () => import("./sysctl-tuner.ts"),
  NetworkdIpRules: () => import("./networkd-ip-rules.ts"),
  RsyslogKubeletFilter: () => import("./rsyslog-kubelet.ts"),
  Journald: () => import("./journald.ts"),
  LogRotation: () => import("./log-rotation.ts"),
  RegistryPackages: () => import("./registry-packages.ts"),
  Script: () => import("./script.ts"),
  KubernetesApiProxy: () => import("./kubernetes-api-proxy.ts"),
  Containerd: () => import("./containerd.ts"),
  Kubelet: () => import("./kubelet.ts"),
  KubeletStart: () => import("./kubelet-start.ts"),
  BashibleService: () => import("./bashible-service.ts"),
  BootstrapCleanup: () => import("./bootstrap-cleanup.ts"),
  FilePermissions: () => import("./file-permissions.ts"),
};

/** A step bound to its spec: what the engine drives, without casts. */
export interface BoundStep {
  kind: StepKind;
  plan(host: Host, ctx: StepContext): Promise<Plan<Change>>;
  applyOwn(change: OwnChange, host: Host, ctx: StepContext): Promise<void>;
  services(host: Host): ServiceDecl[];
  secrets(): string[];
  report(problems: Problem[], ctx: StepContext): Promise<void>;
}

export async function bindStep<K extends StepKind>(kind: K, spec: SpecOf<K>): Promise<BoundStep> {
  const impl = (await STEPS[kind]()).default;
  return {
    kind,
    plan: (host, ctx) => impl.plan(spec, host, ctx),
    async applyOwn(change, host, ctx) {
      if (!impl.applyOwn) throw new Error(`step kind ${kind} planned a '${change.kind}' change it cannot apply`);
      await impl.applyOwn(change, spec, host, ctx);
    },
    services: (host) => impl.services?.(spec, host) ?? [],
    secrets: () => impl.secrets?.(spec) ?? [],
    async report(problems, ctx) {
      await impl.report?.(problems, spec, ctx);
    },
  };
}
