// Kubelet (064_configure_kubelet): everything the kubelet reads, and its unit, as Deckhouse's
// 064_configure_kubelet and 068_configure_kubelet_systemd_unit write them (docs/steps.md has the
// table, setting by setting, with the few deliberate differences).
//
// - /var/lib/kubelet/config.yaml: the KubeletConfiguration: the bundle's values (NodeGroup and
//   cluster context) and the machine's (reservations and eviction thresholds sized from its
//   memory and disks with Deckhouse's formulas, resolv.conf of systemd-resolved where it runs,
//   failCgroupV1: false on cgroup v1), checked by the kubelet itself before it replaces the live
//   file (steps/checks/kubelet-config.sh: its own decoding and validation, unknown fields refused).
// - /etc/kubernetes/pki/ca.crt, /etc/kubernetes/bootstrap-kubelet.conf (the bootstrap token,
//   written only while the kubelet has no client certificate).
// - kubelet.service: the binary (its package digest is in the unit), the registration values
//   (the group and node type labels, the uninitialized taint), --node-ip/--address from
//   /var/lib/bashible/discovered-node-ip when it exists. Drop-ins of kubelet.service this step
//   does not own (Deckhouse's 10-deckhouse.conf, kubeadm's 10-kubeadm.conf) would override its
//   ExecStart: they are removed, in the plan like any other change.
// - What the kubelet's settings need from the system: logind's inhibitor delay long enough for
//   graceful node shutdown (a logind.conf.d file; logind told to reload). The kernel values
//   protectKernelDefaults makes it check are 041_configure_sysctl_tuner's, the one owner of
//   kernel values (this step's own sysctl.d file of earlier versions is removed).
//
// The kubelet is restarted (after this step, by the engine) only when one of the files it reads
// changed, or a script set kubelet-need-restart. 069_start_kubelet then waits for its client
// certificate.
import { isIP } from "node:net";
import { parse, stringify } from "yaml";
import { asset } from "../lib/assets.ts";
import { PATHS } from "../bundles/paths.ts";
import { kubeletMaySetLabel } from "../bundles/names.ts";
import { UNITS } from "../bundles/steps/index.ts";
import { kubelet as descriptor } from "../bundles/steps/kubelet.ts";
import type { KubeletSpec } from "../bundles/types.ts";
import type { Host } from "../host/host.ts";
import { planAbsent, planDir, planFile } from "../host/file-plan.ts";
import { RefusedError } from "../lib/errors.ts";
import type { FileChange, Primitive, Problem, Step } from "./types.ts";
import { binaryStamp } from "./lib/binary.ts";
import {
  AUTO_RESERVED,
  autoReservedMemoryBytes,
  type DiskEviction,
  diskEviction,
  type FsSize,
  memoryEvictionBytes,
  quantityBytes,
} from "./lib/kubelet-sizing.ts";
import { cgroupV1, fsSizeOf, memoryBytes } from "./lib/machine.ts";
import { planUnit, reloadUnlessPlanned, startByRestart, unitPath, unitState } from "./lib/units.ts";

export const BIN = `${PATHS.binDir}/kubelet`;
const UNIT = UNITS.kubelet;
const FLAG = "kubelet-need-restart";
export const CONFIG = PATHS.kubeletConfig;
export const BOOTSTRAP_KUBECONFIG = PATHS.kubeletBootstrapKubeconfig;
export const CA = PATHS.clusterCA;
const STATIC_PODS = "/etc/kubernetes/manifests";
const DEFAULT_ROOT_DIR = "/var/lib/kubelet";
/** containerd's root (032_configure_containerd): the imagefs the disk thresholds are sized from. */
const CONTAINERD_ROOT = "/var/lib/containerd";

/** Where systemd looks for kubelet.service drop-ins, most specific first. */
const DROP_IN_DIRS = [
  "/etc/systemd/system.control",
  "/run/systemd/system.control",
  "/etc/systemd/system",
  "/run/systemd/system",
  "/usr/local/lib/systemd/system",
  "/usr/lib/systemd/system",
  "/lib/systemd/system",
].map((d) => `${d}/${UNIT}.d`);

/** Where earlier versions of this step kept the kubelet's kernel values (the sysctl tuner has them now). */
const SYSCTL_FILE = PATHS.kubeletLegacySysctl;
/** logind's delay inhibitor: the kubelet's graceful shutdown holds the machine's shutdown this long. */
const LOGIND_FILE = PATHS.kubeletLogind;
const LOGIND_UNIT = "systemd-logind.service";
/** systemd-resolved's list of the real upstream servers (its stub at 127.0.0.53 would loop in pods). */
const RESOLVED_RESOLV_CONF = "/run/systemd/resolve/resolv.conf";

/** Deckhouse's list (CIS): TLS 1.2 suites with forward secrecy, then the two RSA-GCM ones. */
export const TLS_CIPHER_SUITES = [
  "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
  "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
  "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
  "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
  "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
  "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
  "TLS_RSA_WITH_AES_256_GCM_SHA384",
  "TLS_RSA_WITH_AES_128_GCM_SHA256",
];

/** What the machine has: the kernel's, so the same in a sandbox tree as on its host. */
export interface MachineFacts {
  cgroupV1: boolean;
  memoryBytes: number;
  /** The kubelet's root dir's filesystem. */
  nodefs?: FsSize;
  /** containerd's root's filesystem (none when containerd is not managed). */
  imagefs?: FsSize;
}

export async function machineFacts(host: Host, spec: KubeletSpec): Promise<MachineFacts> {
  const nodefs = await fsSizeOf(host.path(spec.rootDir ?? DEFAULT_ROOT_DIR));
  const imagefs = spec.criSocket ? undefined : await fsSizeOf(host.path(CONTAINERD_ROOT));
  return {
    cgroupV1: cgroupV1(),
    memoryBytes: memoryBytes(),
    ...(nodefs ? { nodefs } : {}),
    ...(imagefs ? { imagefs } : {}),
  };
}

/** What the node's files say (read with the plan). */
export interface NodeFacts {
  /** The resolv.conf pods get: systemd-resolved's upstream list where it runs. */
  resolvConf: string;
  /** From /var/lib/bashible/discovered-node-ip. */
  nodeIP?: string;
}

const sorted = <T>(r: Record<string, T>) => Object.fromEntries(Object.entries(r).sort(([a], [b]) => (a < b ? -1 : 1)));

/** systemReserved in Deckhouse's form: memory in bytes, the rest as the NodeGroup wrote it. */
export function systemReserved(spec: KubeletSpec, m: MachineFacts): Record<string, string> {
  const r = spec.resourceReservation;
  if (r.mode === "Auto") {
    return {
      cpu: AUTO_RESERVED.cpu,
      memory: String(autoReservedMemoryBytes(m.memoryBytes)),
      "ephemeral-storage": AUTO_RESERVED.ephemeralStorage,
    };
  }
  if (r.mode === "Static") {
    return {
      ...(r.static?.cpu ? { cpu: r.static.cpu } : {}),
      ...(r.static?.memory ? { memory: String(quantityBytes(r.static.memory)) } : {}),
      ...(r.static?.ephemeralStorage ? { "ephemeral-storage": r.static.ephemeralStorage } : {}),
    };
  }
  return {};
}

type DiskSignals = DiskEviction["hard"];

/** The five eviction signals Deckhouse sets, in its order: containerd's disk, memory, the kubelet's disk. */
const evictionSignals = (imagefs: DiskSignals, memory: string, nodefs: DiskSignals) => ({
  "imagefs.available": imagefs.available,
  "imagefs.inodesFree": imagefs.inodesFree,
  "memory.available": memory,
  "nodefs.available": nodefs.available,
  "nodefs.inodesFree": nodefs.inodesFree,
});

/** The KubeletConfiguration as an object, in Deckhouse's order of keys. */
export function kubeletConfig(spec: KubeletSpec, m: MachineFacts, n: NodeFacts): Record<string, unknown> {
  const memory = memoryEvictionBytes(m.memoryBytes);
  const nodefs = diskEviction(m.nodefs);
  const imagefs = diskEviction(m.imagefs);
  const reserved = systemReserved(spec, m);
  const grace = "1m30s";
  const diskGrace = { available: grace, inodesFree: grace };
  const topology = spec.topologyManager;
  const gates = sorted({
    RotateKubeletServerCertificate: true,
    ...(topology ? { MemoryManager: true } : {}),
    ...spec.featureGates,
  });
  return {
    apiVersion: "kubelet.config.k8s.io/v1beta1",
    kind: "KubeletConfiguration",
    authentication: {
      x509: { clientCAFile: CA },
      webhook: { enabled: true, cacheTTL: "2m0s" },
      anonymous: { enabled: false },
    },
    authorization: { mode: "Webhook", webhook: { cacheAuthorizedTTL: "5m0s", cacheUnauthorizedTTL: "30s" } },
    cgroupRoot: "/",
    cgroupsPerQOS: true,
    cgroupDriver: spec.cgroupDriver,
    // Kubernetes 1.31+ refuses cgroup v1 unless told; on a cgroup v1 machine it is told.
    ...(m.cgroupV1 ? { failCgroupV1: false } : {}),
    clusterDomain: spec.clusterDomain,
    clusterDNS: spec.clusterDNS,
    containerRuntimeEndpoint: `unix://${spec.criSocket ?? PATHS.containerdSocket}`,
    cpuManagerReconcilePeriod: "10s",
    enableControllerAttachDetach: true,
    enableDebuggingHandlers: true,
    enableServer: true,
    enforceNodeAllocatable: ["pods"],
    eventRecordQPS: 50,
    eventBurst: 50,
    evictionHard: evictionSignals(imagefs.hard, String(memory.hard), nodefs.hard),
    evictionSoft: evictionSignals(imagefs.soft, String(memory.soft), nodefs.soft),
    evictionSoftGracePeriod: evictionSignals(diskGrace, grace, diskGrace),
    evictionPressureTransitionPeriod: "4m0s",
    evictionMaxPodGracePeriod: 90,
    failSwapOn: !spec.swapBehavior,
    ...(spec.swapBehavior ? { memorySwap: { swapBehavior: spec.swapBehavior } } : {}),
    tlsCipherSuites: TLS_CIPHER_SUITES,
    serverTLSBootstrap: true,
    featureGates: gates,
    fileCheckFrequency: "20s",
    imageMinimumGCAge: "2m0s",
    imageGCHighThresholdPercent: 70,
    imageGCLowThresholdPercent: 65,
    kubeAPIBurst: 50,
    kubeAPIQPS: 50,
    hairpinMode: "promiscuous-bridge",
    httpCheckFrequency: "20s",
    maxOpenFiles: 1000000,
    maxPods: spec.maxPods,
    nodeStatusUpdateFrequency: `${spec.nodeStatusUpdateFrequencySeconds}s`,
    podsPerCore: 0,
    podPidsLimit: -1,
    readOnlyPort: 0,
    registryPullQPS: 10,
    registryBurst: 20,
    resolvConf: n.resolvConf,
    rotateCertificates: true,
    runtimeRequestTimeout: "2m0s",
    serializeImagePulls: true,
    staticPodPath: STATIC_PODS,
    syncFrequency: "1m0s",
    ...(Object.keys(reserved).length ? { systemReserved: reserved } : {}),
    volumeStatsAggPeriod: "1m0s",
    healthzBindAddress: "127.0.0.1",
    healthzPort: 10248,
    // A bundle from a server before this setting: the kubelet's own default here, true.
    protectKernelDefaults: spec.protectKernelDefaults ?? true,
    containerLogMaxSize: spec.containerLogMaxSize,
    containerLogMaxFiles: spec.containerLogMaxFiles,
    allowedUnsafeSysctls: ["net.*"],
    shutdownGracePeriod: descriptor.shutdownGracePeriod.total,
    shutdownGracePeriodCriticalPods: descriptor.shutdownGracePeriod.criticalPods,
    ...(spec.providerID ? { providerID: spec.providerID } : {}),
    ...(spec.seccompDefault !== undefined ? { seccompDefault: spec.seccompDefault } : {}),
    // The topology manager aligns what the CPU and memory managers hand out: Deckhouse turns
    // both static on with it, the memory reserved on NUMA node 0 being exactly what the
    // kubelet holds back (system reservation + hard eviction), as the kubelet requires.
    ...(topology
      ? {
          cpuManagerPolicy: "static",
          memoryManagerPolicy: "Static",
          reservedMemory: [{ numaNode: 0, limits: { memory: String(Number(reserved.memory ?? 0) + memory.hard) } }],
          topologyManagerScope: topology.scope,
          topologyManagerPolicy: topology.policy,
        }
      : {}),
  };
}

export function renderConfig(spec: KubeletSpec, m: MachineFacts, n: NodeFacts): string {
  return `# Managed by bashible (064_configure_kubelet); changes restart ${UNIT}.\n${stringify(kubeletConfig(spec, m, n), { lineWidth: 0 })}`;
}

export function renderBootstrapKubeconfig(server: string, token: string): string {
  return `# Managed by bashible (064_configure_kubelet): the kubelet's TLS bootstrap credentials.\n${stringify(
    {
      apiVersion: "v1",
      kind: "Config",
      clusters: [{ name: "kubernetes", cluster: { "certificate-authority": CA, server } }],
      contexts: [
        { name: "kubelet-bootstrap@kubernetes", context: { cluster: "kubernetes", user: "kubelet-bootstrap" } },
      ],
      "current-context": "kubelet-bootstrap@kubernetes",
      users: [{ name: "kubelet-bootstrap", user: { token } }],
    },
    { lineWidth: 0 },
  )}`;
}

export function renderUnit(
  spec: KubeletSpec,
  o: { stamp: string; nodeName: string; labels: Record<string, string>; nodeIP?: string },
): string {
  const labels = Object.entries(o.labels)
    .sort(([a], [b]) => (a < b ? -1 : 1))
    .map(([k, v]) => `${k}=${v}`)
    .join(",");
  const taints = spec.registerTaints.map((t) => `${t.key}${t.value ? `=${t.value}` : ""}:${t.effect}`).join(",");
  const flags = [
    `--config=${CONFIG}`,
    `--bootstrap-kubeconfig=${BOOTSTRAP_KUBECONFIG}`,
    `--kubeconfig=${PATHS.kubeletKubeconfig}`,
    `--hostname-override=${o.nodeName}`,
    ...(spec.rootDir ? [`--root-dir=${spec.rootDir}`] : []),
    ...(labels ? [`--node-labels=${labels}`] : []),
    ...(taints ? [`--register-with-taints=${taints}`] : []),
    // The address 000_discover_node_ip found: the Node's InternalIP, and where the kubelet listens.
    ...(o.nodeIP ? [`--node-ip=${o.nodeIP}`, `--address=${o.nodeIP}`] : []),
    "--v=2",
  ];
  return `# Managed by bashible (064_configure_kubelet).
# Binary: ${o.stamp}
# The labels and taints are what a new Node registers with; the cluster side keeps the
# NodeGroup's nodeTemplate on it.
[Unit]
Description=kubelet: the Kubernetes node agent
Documentation=https://kubernetes.io/docs/reference/command-line-tools-reference/kubelet/
After=network-online.target ${UNITS.containerd} ${UNITS.apiProxy}
Wants=network-online.target
StartLimitIntervalSec=0

[Service]
ExecStart=${BIN} \\
${flags.map((f) => `    ${f}`).join(" \\\n")}
Restart=always
RestartSec=10

[Install]
WantedBy=multi-user.target
`;
}

function renderLogind(): string {
  return `# Managed by bashible (064_configure_kubelet): graceful node shutdown. The kubelet holds a
# delay inhibitor while it stops pods (shutdownGracePeriod ${descriptor.shutdownGracePeriod.total}); logind waits at most this long.
[Login]
InhibitDelayMaxSec=${descriptor.shutdownGracePeriod.totalSeconds}
`;
}

/** The registration labels the kubelet may set, and a problem for each it may not. */
export function registrableLabels(spec: KubeletSpec): { labels: Record<string, string>; problems: Problem[] } {
  const labels: Record<string, string> = {};
  const problems: Problem[] = [];
  for (const [k, v] of Object.entries(spec.registerLabels)) {
    if (kubeletMaySetLabel(k)) labels[k] = v;
    else {
      problems.push({
        subject: `label ${k}`,
        message:
          "the kubelet may not set labels in the kubernetes.io and k8s.io namespaces (NodeRestriction); left out of --node-labels",
      });
    }
  }
  return { labels, problems };
}

/**
 * systemd-resolved's upstream list when /etc/resolv.conf is its stub (nameserver 127.0.0.53, or
 * a link into /run/systemd/resolve/) and the list exists; /etc/resolv.conf otherwise (as
 * Deckhouse's 064 decides).
 */
async function resolvConfOf(host: Host): Promise<string> {
  const st = await host.stat("/etc/resolv.conf");
  let resolved = false;
  if (st?.isSymlink) resolved = ((await host.fs.readLink("/etc/resolv.conf")) ?? "").includes("systemd/resolve/");
  else if (st?.isFile) resolved = /^nameserver 127\.0\.0\.53\b/m.test((await host.readText("/etc/resolv.conf")) ?? "");
  return resolved && (await host.stat(RESOLVED_RESOLV_CONF))?.isFile ? RESOLVED_RESOLV_CONF : "/etc/resolv.conf";
}

/** The address 000_discover_node_ip wrote, or none (and a problem when the file holds something else). */
export async function discoveredNodeIP(host: Host): Promise<{ ip?: string; problem?: Problem }> {
  const text = (await host.readText(PATHS.discoveredNodeIP, 4096))?.trim();
  if (!text) return {};
  if (isIP(text)) return { ip: text };
  return {
    problem: {
      subject: PATHS.discoveredNodeIP,
      message: `holds ${JSON.stringify(text.slice(0, 60))}, not an IP address: the kubelet runs without --node-ip (the next discovery rewrites the file)`,
    },
  };
}

/** The live configuration's CPU and memory manager policies (absent = none). */
async function managerPolicies(host: Host): Promise<string | undefined> {
  const text = await host.readText(CONFIG, 1 << 20);
  if (text === undefined) return undefined;
  try {
    const c = parse(text) as { cpuManagerPolicy?: string; memoryManagerPolicy?: string } | null;
    return `${c?.cpuManagerPolicy ?? "none"}/${c?.memoryManagerPolicy ?? "None"}`;
  } catch {
    // Not ours to read (a hand edit); the new configuration replaces it either way.
    return "unreadable";
  }
}

/**
 * The CPU and memory managers keep their assignments in checkpoint files and refuse to start on
 * a checkpoint of another policy: when the policy changes, the checkpoints go (Kubernetes' own
 * procedure), which is disruptive (pods keep running, without the pinning they had).
 */
async function planManagerReset(host: Host, spec: KubeletSpec, config: FileChange): Promise<Primitive[]> {
  const before = await managerPolicies(host);
  const after = spec.topologyManager ? "static/Static" : "none/None";
  if (before === undefined || before === after) return [];
  const root = spec.rootDir ?? DEFAULT_ROOT_DIR;
  const out: Primitive[] = [];
  for (const f of ["cpu_manager_state", "memory_manager_state"]) {
    const gone = await planAbsent(host, `${root}/${f}`);
    if (gone)
      out.push({ ...gone, summary: `${gone.summary} (the CPU/memory manager policy changes: ${before} → ${after})` });
  }
  if (out.length) config.disruptive = `the kubelet's CPU/memory manager policy changes (${before} → ${after})`;
  return out;
}

/** Drop-ins of kubelet.service from anyone else: they would override this step's unit. */
async function planForeignDropIns(host: Host): Promise<FileChange[]> {
  const out: FileChange[] = [];
  // On a merged-/usr system /lib is /usr/lib: the same directory once.
  const libIsLink = (await host.stat("/lib"))?.isSymlink === true;
  for (const dir of DROP_IN_DIRS) {
    if (libIsLink && dir.startsWith("/lib/")) continue;
    const st = await host.stat(dir);
    if (!st?.isDirectory) continue;
    for (const name of (await host.listDir(dir)).sort()) {
      if (!name.endsWith(".conf")) continue;
      const gone = await planAbsent(host, `${dir}/${name}`);
      if (gone)
        out.push({ ...gone, summary: `${gone.summary} (a drop-in this step does not own would override ${UNIT})` });
    }
  }
  return out;
}

/** logind's inhibitor delay, and logind told to reload it (as the kubelet itself would). */
async function planInhibitor(host: Host): Promise<{ changes: Primitive[]; problems: Problem[] }> {
  const file = await planFile(host, { path: LOGIND_FILE, content: renderLogind(), mode: 0o644 });
  const logindRuns = host.sandbox || (await unitState(host, LOGIND_UNIT)).active;
  const problems: Problem[] = logindRuns
    ? []
    : [
        {
          subject: LOGIND_UNIT,
          message:
            "is not running: the kubelet's graceful node shutdown works through logind's inhibitor locks (install or start systemd-logind and dbus), so pods are not stopped before a shutdown",
        },
      ];
  if (!file) return { changes: [], problems };
  const reload: Primitive = {
    kind: "command",
    argv: ["systemctl", "kill", "--signal=SIGHUP", "--", LOGIND_UNIT],
    recordInSandbox: true,
    summary: `tell ${LOGIND_UNIT} to reload ${LOGIND_FILE}`,
  };
  return { changes: logindRuns ? [file, reload] : [file], problems };
}

export async function planKubelet(
  spec: KubeletSpec,
  host: Host,
  o: { nodeName: string; clusterCA: string; facts?: MachineFacts },
): Promise<{ changes: Primitive[]; problems: Problem[]; active: boolean }> {
  if (!o.clusterCA.includes("BEGIN CERTIFICATE")) {
    throw new RefusedError(
      "the bundle carries no cluster CA (context.clusterCA): the kubelet could not verify the API server or its clients",
    );
  }
  const stamp = await binaryStamp(host, BIN, spec.package);
  const facts = o.facts ?? (await machineFacts(host, spec));
  const changes: Primitive[] = [];
  const problems: Problem[] = [];
  for (const dir of ["/etc/kubernetes", "/etc/kubernetes/pki", STATIC_PODS, "/var/lib/kubelet"]) {
    const c = await planDir(host, dir, { mode: 0o755 });
    if (c) changes.push(c);
  }
  const legacySysctl = await planAbsent(host, SYSCTL_FILE);
  if (legacySysctl)
    changes.push({ ...legacySysctl, summary: `${legacySysctl.summary} (the sysctl tuner owns these values)` });
  const inhibitor = await planInhibitor(host);
  changes.push(...inhibitor.changes);
  problems.push(...inhibitor.problems);
  const ca = await planFile(host, {
    path: CA,
    content: o.clusterCA.endsWith("\n") ? o.clusterCA : `${o.clusterCA}\n`,
    mode: 0o644,
  });
  if (ca) changes.push(ca);
  const nodeIP = await discoveredNodeIP(host);
  if (nodeIP.problem) problems.push(nodeIP.problem);
  const config = await planFile(host, {
    path: CONFIG,
    content: renderConfig(spec, facts, { resolvConf: await resolvConfOf(host) }),
    // Deckhouse's (CIS): the configuration is root's alone.
    mode: 0o600,
    check: ["sh", asset("steps/checks/kubelet-config.sh"), host.path(BIN), host.root, "{}"],
  });
  if (config) {
    changes.push(...(await planManagerReset(host, spec, config)), config);
  }
  if (!(await host.exists(PATHS.kubeletClientPem))) {
    const token = (await host.readText(PATHS.bootstrapToken, 4096))?.trim();
    if (token) {
      const kubeconfig = await planFile(host, {
        path: BOOTSTRAP_KUBECONFIG,
        content: renderBootstrapKubeconfig(spec.apiServer, token),
        mode: 0o600,
        secret: true,
      });
      if (kubeconfig) changes.push({ ...kubeconfig, summary: `${kubeconfig.summary} (bootstrap token)` });
    } else if (!(await host.exists(BOOTSTRAP_KUBECONFIG))) {
      problems.push({
        subject: UNIT,
        message: `the kubelet has no client certificate and there is no bootstrap token (${PATHS.bootstrapToken}) to get one with; bootstrap the node with bootstrap.sh from Secret d8-cloud-instance-manager/manual-bootstrap-for-<group>`,
      });
    }
  }
  const { labels, problems: labelProblems } = registrableLabels(spec);
  problems.push(...labelProblems);
  const dropIns = await planForeignDropIns(host);
  const unit = await planUnit(host, UNIT, renderUnit(spec, { stamp, nodeName: o.nodeName, labels, nodeIP: nodeIP.ip }));
  changes.push(...dropIns, ...unit.changes);
  if (dropIns.length) changes.push(...reloadUnlessPlanned(unit.changes, UNIT, `drop-ins of ${UNIT} removed`));
  return { changes, problems, active: unit.state.active };
}

const step: Step<"Kubelet"> = {
  kind: "Kubelet",
  async plan(spec, host, ctx) {
    const p = await planKubelet(spec, host, { nodeName: ctx.nodeName, clusterCA: ctx.bundle.context.clusterCA });
    if (!p.active && !(await ctx.flags.has(FLAG))) p.changes.push(startByRestart(UNIT, FLAG));
    return { changes: p.changes, problems: p.problems };
  },
  services: () => [
    {
      unit: UNIT,
      reads: [CONFIG, BOOTSTRAP_KUBECONFIG, CA, unitPath(UNIT), ...DROP_IN_DIRS.map((d) => `${d}/`)],
      onChange: "restart",
    },
  ],
};

export default step;
