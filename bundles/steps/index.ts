// The built-in steps, from their descriptors: the one list of them. The step names, the spec
// table (bundles/specs.ts), the unit names and the units cleanup_static_node.sh removes are
// derived here, so a new built-in step is its descriptor plus one line below.
import { agent } from "./bashible-service.ts";
import { caCertificates } from "./ca-certificates.ts";
import { containerd } from "./containerd.ts";
import { deckhousePath } from "./deckhouse-path.ts";
import { kubelet } from "./kubelet.ts";
import { kubeletStart } from "./kubelet-start.ts";
import { kernelModules } from "./kernel-modules.ts";
import { hostnameCheck, hostnameUniqueness } from "./hostname.ts";
import { networkdIpRules, rpFilter } from "./network.ts";
import { journald, logRotation, rsyslogKubelet } from "./logging.ts";
import { swap } from "./swap.ts";
import { sysctlTuner } from "./sysctl-tuner.ts";
import { nodeIp } from "./node-ip.ts";
import { bootstrapCleanup, filePermissions } from "./after-bootstrap.ts";
import { distroPackages } from "./distro-packages.ts";
import { apiProxy } from "./kubernetes-api-proxy.ts";
import { nodeUsers } from "./node-users.ts";
import { registryPackages } from "./registry-packages.ts";

/** Every built-in step's descriptor, under the key `BUILTIN_STEPS` names it with. */
export const BUILTINS = {
  distroPackages,
  nodeUsers,
  nodeIp,
  apiProxy,
  caCertificates,
  deckhousePath,
  kernelModules,
  hostnameCheck,
  hostnameUniqueness,
  rpFilter,
  swap,
  networkdIpRules,
  sysctlTuner,
  rsyslogKubelet,
  journald,
  logRotation,
  registryPackages,
  containerd,
  kubelet,
  kubeletStart,
  agent,
  bootstrapCleanup,
  filePermissions,
} as const;

type Builtins = typeof BUILTINS;
type Builtin = Builtins[keyof Builtins];
export type BuiltinKind = Builtin["kind"];
export type BuiltinOf<K extends BuiltinKind> = Extract<Builtin, { kind: K }>;

const byName = (a: Builtin, b: Builtin) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);

/** The descriptors in the order the bundle runs them: by name, in code-unit order. */
export const BUILTIN_LIST: readonly Builtin[] = Object.values(BUILTINS).sort(byName);

/** Built-in step names by key (`BUILTIN_STEPS.kubelet` = `064_configure_kubelet`). */
export const BUILTIN_STEPS = Object.fromEntries(Object.entries(BUILTINS).map(([key, d]) => [key, d.name])) as {
  readonly [K in keyof Builtins]: Builtins[K]["name"];
};

export const BUILTIN_STEP_NAMES: ReadonlySet<string> = new Set(BUILTIN_LIST.map((d) => d.name));

/** Each built-in kind's spec schema. */
export const BUILTIN_SPECS = Object.fromEntries(BUILTIN_LIST.map((d) => [d.kind, d.spec])) as {
  readonly [K in keyof Builtins as Builtins[K]["kind"]]: Builtins[K]["spec"];
};

type Intersection<U> = (U extends unknown ? (u: U) => void : never) extends (i: infer I) => void ? I : never;

/** systemd units the built-in steps manage, by key (`UNITS.kubelet` = `kubelet.service`). */
export const UNITS = Object.assign({}, ...BUILTIN_LIST.map((d) => d.units)) as Intersection<Builtin["units"]>;

/**
 * What cleanup_static_node.sh stops, disables and removes: each step's cleanup units, the last
 * step's first, so the agent stops before what it manages and the kubelet before containerd.
 */
export const CLEANUP_UNITS: readonly string[] = [...BUILTIN_LIST]
  .reverse()
  .flatMap((d) => ("cleanupUnits" in d ? d.cleanupUnits : Object.values(d.units)));
