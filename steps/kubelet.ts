// Kubelet (064_configure_kubelet): everything the kubelet reads, and its unit.
//
// - /var/lib/kubelet/config.yaml: the KubeletConfiguration from the bundle (cgroup driver, cluster
//   DNS and domain, eviction thresholds, maxPods, container log rotation, the NodeGroup's
//   resource reservation, feature gates; failCgroupV1: false where the machine has cgroup v1),
//   checked by the kubelet itself before it replaces the live file (steps/checks/kubelet-config.sh:
//   its own decoding and validation, unknown fields refused).
// - /etc/kubernetes/pki/ca.crt: the cluster CA (client certificates, the API server's identity).
// - /etc/kubernetes/bootstrap-kubelet.conf: the bootstrap token (/var/lib/bashible/bootstrap-token)
//   against the local API proxy, written only while the kubelet has no client certificate; after
//   TLS bootstrap the kubelet writes /etc/kubernetes/kubelet.conf itself and rotates its
//   certificate, and the bootstrap file is left alone.
// - kubelet.service: the binary (its package digest is in the unit, so a new binary changes it),
//   the node's labels and taints (registered with the Node; the taint
//   node.deckhouse.io/bashible-uninitialized keeps workloads off until the first run finished).
//
// The kubelet is restarted (after this step, by the engine) only when one of those files changed,
// or a script set kubelet-need-restart; a kubelet that is not running is started the same way.
// 069_start_kubelet then waits for its client certificate.
import os from "node:os";
import { existsSync } from "node:fs";
import { stringify } from "yaml";
import { asset } from "../lib/assets.ts";
import { PATHS } from "../bundles/paths.ts";
import { kubeletMaySetLabel } from "../bundles/names.ts";
import { UNITS } from "../bundles/steps/index.ts";
import type { KubeletSpec } from "../bundles/types.ts";
import type { Host } from "../host/host.ts";
import { planDir, planFile } from "../host/file-plan.ts";
import { RefusedError } from "../lib/errors.ts";
import type { Primitive, Problem, Step } from "./types.ts";
import { binaryStamp } from "./lib/binary.ts";
import { planUnit, startByRestart, unitPath } from "./lib/units.ts";

export const BIN = `${PATHS.binDir}/kubelet`;
const UNIT = UNITS.kubelet;
const FLAG = "kubelet-need-restart";
export const CONFIG = PATHS.kubeletConfig;
export const BOOTSTRAP_KUBECONFIG = PATHS.kubeletBootstrapKubeconfig;
export const CA = PATHS.clusterCA;
const STATIC_PODS = "/etc/kubernetes/manifests";

/** What the machine has: the kernel's, so the same in a sandbox tree as on its host. */
export interface MachineFacts {
  cgroupV1: boolean;
  memoryBytes: number;
  cpus: number;
}

export function machineFacts(): MachineFacts {
  return {
    cgroupV1: !existsSync("/sys/fs/cgroup/cgroup.controllers"),
    memoryBytes: os.totalmem(),
    cpus: os.availableParallelism(),
  };
}

const MI = 1024 * 1024;
const GI = 1024 * MI;

/**
 * resourceReservation Auto: what the system keeps back from pods, graded by size the way the
 * large managed offerings do it (memory: 25 % of the first 4 GiB, 20 % of the next 4, 10 % of
 * the next 8, 6 % of the next 112, 2 % above; 255 MiB on machines under 1 GiB; CPU: 6 % of the
 * first core, 1 % of the second, 0.5 % of the next two, 0.25 % above four).
 */
export function autoReservation(m: MachineFacts): { cpu: string; memory: string } {
  let memory = 0;
  if (m.memoryBytes < GI) memory = 255 * MI;
  else {
    let left = m.memoryBytes;
    for (const [size, share] of [
      [4 * GI, 0.25],
      [4 * GI, 0.2],
      [8 * GI, 0.1],
      [112 * GI, 0.06],
      [Number.POSITIVE_INFINITY, 0.02],
    ] as const) {
      const part = Math.min(left, size);
      memory += part * share;
      left -= part;
      if (left <= 0) break;
    }
  }
  let milli = 0;
  for (let core = 1; core <= m.cpus; core++) milli += core === 1 ? 60 : core === 2 ? 10 : core <= 4 ? 5 : 2.5;
  return { cpu: `${Math.ceil(milli)}m`, memory: `${Math.ceil(memory / MI)}Mi` };
}

export function renderConfig(spec: KubeletSpec, m: MachineFacts): string {
  const reserved =
    spec.resourceReservation.mode === "Auto"
      ? autoReservation(m)
      : spec.resourceReservation.mode === "Static"
        ? {
            ...(spec.resourceReservation.static?.cpu ? { cpu: spec.resourceReservation.static.cpu } : {}),
            ...(spec.resourceReservation.static?.memory ? { memory: spec.resourceReservation.static.memory } : {}),
            ...(spec.resourceReservation.static?.ephemeralStorage
              ? { "ephemeral-storage": spec.resourceReservation.static.ephemeralStorage }
              : {}),
          }
        : {};
  const sorted = <T>(r: Record<string, T>) =>
    Object.fromEntries(Object.entries(r).sort(([a], [b]) => (a < b ? -1 : 1)));
  const config: Record<string, unknown> = {
    apiVersion: "kubelet.config.k8s.io/v1beta1",
    kind: "KubeletConfiguration",
    authentication: {
      anonymous: { enabled: false },
      webhook: { enabled: true, cacheTTL: "2m0s" },
      x509: { clientCAFile: CA },
    },
    authorization: { mode: "Webhook", webhook: { cacheAuthorizedTTL: "5m0s", cacheUnauthorizedTTL: "30s" } },
    cgroupDriver: spec.cgroupDriver,
    clusterDNS: spec.clusterDNS,
    clusterDomain: spec.clusterDomain,
    containerLogMaxFiles: spec.containerLogMaxFiles,
    containerLogMaxSize: spec.containerLogMaxSize,
    containerRuntimeEndpoint: `unix://${spec.criSocket ?? PATHS.containerdSocket}`,
    evictionHard: sorted(spec.evictionHard),
    ...(Object.keys(spec.evictionSoft).length
      ? { evictionSoft: sorted(spec.evictionSoft), evictionSoftGracePeriod: sorted(spec.evictionSoftGracePeriod) }
      : {}),
    // Kubernetes 1.31+ refuses cgroup v1 unless told; on a cgroup v1 machine it is told.
    ...(m.cgroupV1 ? { failCgroupV1: false } : {}),
    ...(spec.swapBehavior ? { failSwapOn: false } : {}),
    ...(Object.keys(spec.featureGates).length ? { featureGates: sorted(spec.featureGates) } : {}),
    maxPods: spec.maxPods,
    ...(spec.swapBehavior ? { memorySwap: { swapBehavior: spec.swapBehavior } } : {}),
    readOnlyPort: 0,
    rotateCertificates: true,
    serverTLSBootstrap: true,
    staticPodPath: STATIC_PODS,
    ...(spec.seccompDefault !== undefined ? { seccompDefault: spec.seccompDefault } : {}),
    ...(Object.keys(reserved).length ? { systemReserved: reserved } : {}),
    ...(spec.topologyManager
      ? { topologyManagerPolicy: spec.topologyManager.policy, topologyManagerScope: spec.topologyManager.scope }
      : {}),
  };
  return `# Managed by bashible (064_configure_kubelet); changes restart ${UNIT}.\n${stringify(config, { lineWidth: 0 })}`;
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
  o: { stamp: string; nodeName: string; labels: Record<string, string> },
): string {
  const labels = Object.entries(o.labels)
    .sort(([a], [b]) => (a < b ? -1 : 1))
    .map(([k, v]) => `${k}=${v}`)
    .join(",");
  const taints = spec.nodeTaints.map((t) => `${t.key}${t.value ? `=${t.value}` : ""}:${t.effect}`).join(",");
  const flags = [
    `--config=${CONFIG}`,
    `--bootstrap-kubeconfig=${BOOTSTRAP_KUBECONFIG}`,
    `--kubeconfig=${PATHS.kubeletKubeconfig}`,
    `--hostname-override=${o.nodeName}`,
    ...(spec.rootDir ? [`--root-dir=${spec.rootDir}`] : []),
    ...(labels ? [`--node-labels=${labels}`] : []),
    ...(taints ? [`--register-with-taints=${taints}`] : []),
    "--v=2",
  ];
  return `# Managed by bashible (064_configure_kubelet).
# Binary: ${o.stamp}
# Labels and taints are registered with the Node when the kubelet creates it.
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

/** The node's labels the kubelet may register, and a problem for each it may not. */
export function registrableLabels(spec: KubeletSpec): { labels: Record<string, string>; problems: Problem[] } {
  const labels: Record<string, string> = {};
  const problems: Problem[] = [];
  for (const [k, v] of Object.entries(spec.nodeLabels)) {
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
  const facts = o.facts ?? machineFacts();
  const changes: Primitive[] = [];
  for (const dir of ["/etc/kubernetes", "/etc/kubernetes/pki", STATIC_PODS, "/var/lib/kubelet"]) {
    const c = await planDir(host, dir, { mode: 0o755 });
    if (c) changes.push(c);
  }
  const ca = await planFile(host, {
    path: CA,
    content: o.clusterCA.endsWith("\n") ? o.clusterCA : `${o.clusterCA}\n`,
    mode: 0o644,
  });
  if (ca) changes.push(ca);
  const config = await planFile(host, {
    path: CONFIG,
    content: renderConfig(spec, facts),
    mode: 0o644,
    check: ["sh", asset("steps/checks/kubelet-config.sh"), host.path(BIN), host.root, "{}"],
  });
  if (config) changes.push(config);
  const problems: Problem[] = [];
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
  const unit = await planUnit(host, UNIT, renderUnit(spec, { stamp, nodeName: o.nodeName, labels }));
  changes.push(...unit.changes);
  return { changes, problems, active: unit.state.active };
}

const step: Step<"Kubelet"> = {
  kind: "Kubelet",
  async plan(spec, host, ctx) {
    const p = await planKubelet(spec, host, { nodeName: ctx.nodeName, clusterCA: ctx.bundle.context.clusterCA });
    if (!p.active && !(await ctx.flags.has(FLAG))) p.changes.push(startByRestart(UNIT, FLAG));
    return { changes: p.changes, problems: p.problems };
  },
  services: () => [{ unit: UNIT, reads: [CONFIG, BOOTSTRAP_KUBECONFIG, CA, unitPath(UNIT)], onChange: "restart" }],
};

export default step;
