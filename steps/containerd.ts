// Containerd (032_configure_containerd): containerd's configuration, its per-registry hosts files
// and its unit, for the containerd the registry package installed into /opt/deckhouse/bin.
//
// - /etc/containerd/config.toml: configuration version 2 for containerd 1.x, version 3 for 2.x
//   (the installed binary's `--version` decides); the bundle's sandbox image, the cgroup driver
//   the kubelet uses (SystemdCgroup), the snapshotter, runc from /opt/deckhouse/bin, CNI from
//   /opt/cni/bin and /etc/cni/net.d, `config_path` = /etc/containerd/registry.d, registry
//   credentials (CRI `registry.configs.<host>.auth`, the one place upstream containerd reads
//   them with config_path) and `imports` of /etc/containerd/conf.d/*.toml. Checked with
//   `containerd --config CANDIDATE config dump` before it replaces the live file.
// - /etc/containerd/registry.d/<host>/hosts.toml (+ ca.crt): server, mirrors, CA. containerd
//   reads these at each pull: changing them restarts nothing.
// - containerd-deckhouse.service (Deckhouse's unit name; the distribution's containerd.service is
//   left alone), restarted when config.toml, a conf.d fragment or the unit (which names the
//   installed package digest, so a new binary changes it) changed.
//
// A change of containerd's major version is disruptive (running containers restart under a new
// runtime and a migrated configuration): the run asks for disruption approval first.
// NodeGroup cri.type NotManaged: the renderer leaves this step out, so nothing here is touched.
import { readFile } from "node:fs/promises";
import { asset } from "../lib/assets.ts";
import { PATHS } from "../bundles/paths.ts";
import { UNITS } from "../bundles/steps/index.ts";
import type { ContainerdRegistry, ContainerdSpec } from "../bundles/types.ts";
import type { Host } from "../host/host.ts";
import { planAbsent, planDir, planFile, unifiedDiff } from "../host/file-plan.ts";
import { RefusedError } from "../lib/errors.ts";
import type { FileChange, Primitive, Step } from "./types.ts";
import { binaryStamp } from "./lib/binary.ts";
import { planUnit, startByRestart, unitPath } from "./lib/units.ts";

export const BIN = `${PATHS.binDir}/containerd`;
const RUNC = `${PATHS.binDir}/runc`;
const UNIT = UNITS.containerd;
const CONFIG = PATHS.containerdConfig;
const CONF_D = PATHS.containerdConfD;
const REGISTRY_DIR = PATHS.containerdRegistryDir;
/** First line of every hosts.toml this step writes: only those are ever removed. */
const HOSTS_MARK = "# Managed by bashible (032_configure_containerd)";
/** Deckhouse's flag for a containerd restart (NodeGroupConfiguration scripts set it). */
const DECKHOUSE_FLAG = "containerd-need-restart";
const ENGINE_FLAG = `${UNIT.replace(/\.service$/, "")}-need-restart`;

export interface ContainerdVersion {
  major: number;
  minor: number;
  text: string;
}

/** The installed containerd's version, from `containerd --version`. */
export async function installedVersion(host: Host): Promise<ContainerdVersion> {
  const r = await host.mustRun([host.path(BIN), "--version"], { timeoutMs: 30_000 });
  // "containerd github.com/containerd/containerd/v2 v2.1.4 75cb2b7…", Debian: "… 1.6.20~ds1 1.6.20~ds1-1"
  const m = r.stdout.match(/\s(v?(\d+)\.(\d+)\.\d+\S*)/);
  if (!m) throw new RefusedError(`${BIN} --version printed no version: ${r.stdout.trim().slice(0, 200)}`);
  return { major: Number(m[2]), minor: Number(m[3]), text: m[1] as string };
}

const q = (s: string) => JSON.stringify(s);

const CAP_SYS_RESOURCE = 24n;

/**
 * Whether processes systemd starts may lower an OOM score (CAP_SYS_RESOURCE in PID 1's bounding
 * set). Not so on machines that are themselves containers with a reduced set: there every pod
 * sandbox (oom_score_adj -998) fails in runc ("can't get final child's PID from pipe"), unless
 * containerd keeps scores at or above its own (`restrict_oom_score_adj`, as kind does rootless).
 */
export async function canLowerOomScores(): Promise<boolean> {
  // The kernel's, like the kubelet step's machine facts: the same under a sandbox tree.
  for (const file of ["/proc/1/status", "/proc/self/status"]) {
    const text = await readFile(file, "utf8").catch(() => undefined);
    const hex = text?.match(/^CapBnd:\s*([0-9a-f]+)$/m)?.[1];
    if (hex) return ((BigInt(`0x${hex}`) >> CAP_SYS_RESOURCE) & 1n) === 1n;
  }
  return true;
}

/** Configuration version 2 (containerd 1.x) or 3 (2.x). */
export function renderConfig(
  spec: ContainerdSpec,
  v: ContainerdVersion,
  machine: { canLowerOomScores: boolean } = { canLowerOomScores: true },
): string {
  const restrictOom = machine.canLowerOomScores ? [] : ["  restrict_oom_score_adj = true"];
  const v3 = v.major >= 2;
  const images = v3 ? `plugins."io.containerd.cri.v1.images"` : `plugins."io.containerd.grpc.v1.cri"`;
  const runtime = v3 ? `plugins."io.containerd.cri.v1.runtime"` : `plugins."io.containerd.grpc.v1.cri"`;
  const auths = spec.registries.flatMap((r) =>
    r.auth ? [`  [${images}.registry.configs.${q(r.host)}.auth]`, `    auth = ${q(r.auth)}`] : [],
  );
  const lines = [
    "# Managed by bashible (032_configure_containerd).",
    `# containerd major version: ${v.major} (configuration version ${v3 ? 3 : 2})`,
    `# Fragments in ${CONF_D}/*.toml are imported over this file, in name order.`,
    ...(v3
      ? ["# containerd 2 merges them key by key."]
      : [
          "# containerd 1 replaces a whole plugin table with an imported one: a fragment that names",
          '# [plugins."io.containerd.grpc.v1.cri"...] takes the place of everything below for that plugin.',
        ]),
    `# Registry mirrors and CAs: ${REGISTRY_DIR}/<host>/hosts.toml (read at each pull).`,
    `version = ${v3 ? 3 : 2}`,
    `root = "/var/lib/containerd"`,
    `state = "/run/containerd"`,
    `imports = [${q(`${CONF_D}/*.toml`)}]`,
    "",
    "[grpc]",
    `  address = ${q(PATHS.containerdSocket)}`,
    "",
  ];
  if (v3) {
    lines.push(
      `[${images}]`,
      `  snapshotter = ${q(spec.snapshotter)}`,
      `  max_concurrent_downloads = ${spec.maxConcurrentDownloads}`,
      `  [${images}.pinned_images]`,
      `    sandbox = ${q(spec.sandboxImage)}`,
      `  [${images}.registry]`,
      `    config_path = ${q(REGISTRY_DIR)}`,
      ...auths.map((l) => `  ${l}`),
      "",
      `[${runtime}]`,
      ...restrictOom,
      `  [${runtime}.containerd]`,
      `    default_runtime_name = "runc"`,
      `    [${runtime}.containerd.runtimes.runc]`,
      `      runtime_type = "io.containerd.runc.v2"`,
      `      [${runtime}.containerd.runtimes.runc.options]`,
      `        BinaryName = ${q(RUNC)}`,
      `        SystemdCgroup = ${spec.cgroupDriver === "systemd"}`,
      `  [${runtime}.cni]`,
      // 2.1 reads bin_dirs (bin_dir is deprecated there); 2.0 only bin_dir.
      v.minor >= 1 ? `    bin_dirs = ["/opt/cni/bin"]` : `    bin_dir = "/opt/cni/bin"`,
      `    conf_dir = "/etc/cni/net.d"`,
    );
  } else {
    lines.push(
      `[${images}]`,
      `  sandbox_image = ${q(spec.sandboxImage)}`,
      `  max_concurrent_downloads = ${spec.maxConcurrentDownloads}`,
      ...restrictOom,
      `  [${runtime}.containerd]`,
      `    snapshotter = ${q(spec.snapshotter)}`,
      `    default_runtime_name = "runc"`,
      `    [${runtime}.containerd.runtimes.runc]`,
      `      runtime_type = "io.containerd.runc.v2"`,
      `      [${runtime}.containerd.runtimes.runc.options]`,
      `        BinaryName = ${q(RUNC)}`,
      `        SystemdCgroup = ${spec.cgroupDriver === "systemd"}`,
      `  [${runtime}.cni]`,
      `    bin_dir = "/opt/cni/bin"`,
      `    conf_dir = "/etc/cni/net.d"`,
      `  [${images}.registry]`,
      `    config_path = ${q(REGISTRY_DIR)}`,
      ...auths.map((l) => `  ${l}`),
    );
  }
  return `${lines.join("\n")}\n`;
}

export function renderHosts(r: ContainerdRegistry, caPath: string | undefined): string {
  const ca = caPath ? [`ca = ${q(caPath)}`] : [];
  const lines = [
    HOSTS_MARK,
    `# How containerd reaches ${r.host}: ${r.mirrors.length ? "its mirrors in order, then the registry" : "the registry itself"}.`,
    `server = ${q(`${r.scheme}://${r.host}`)}`,
    ...ca,
  ];
  for (const m of r.mirrors) {
    lines.push("", `[host.${q(m)}]`, `  capabilities = ["pull", "resolve"]`, ...ca.map((l) => `  ${l}`));
  }
  return `${lines.join("\n")}\n`;
}

export function renderUnit(stamp: string, v: ContainerdVersion): string {
  return `# Managed by bashible (032_configure_containerd).
# Binary: ${stamp}
# Version: ${v.major}.${v.minor} ${v.text}
[Unit]
Description=containerd container runtime (Deckhouse node)
Documentation=https://containerd.io
After=network.target local-fs.target

[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=${BIN} --config ${CONFIG}
Environment=PATH=${PATHS.binDir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
Type=notify
Delegate=yes
KillMode=process
Restart=always
RestartSec=5
LimitNPROC=infinity
LimitCORE=infinity
LimitNOFILE=infinity
TasksMax=infinity
OOMScoreAdjust=-999

[Install]
WantedBy=multi-user.target
`;
}

/** Every registry credential and the password inside it: never shown. */
export function credentials(spec: ContainerdSpec): string[] {
  return spec.registries.flatMap((r) => {
    if (!r.auth) return [];
    const decoded = Buffer.from(r.auth, "base64").toString("utf8");
    const password = decoded.slice(decoded.indexOf(":") + 1);
    return [r.auth, decoded, password].filter((s) => s.length >= 4);
  });
}

const redactAll = (text: string, secrets: string[]) =>
  secrets.reduce((t, s) => t.split(s).join("<registry credentials>"), text);

/**
 * The configuration change with credentials left out of its diff (the rest of the diff stays
 * readable); the file is root's alone when it holds credentials.
 */
async function planConfig(host: Host, spec: ContainerdSpec, content: string): Promise<FileChange | undefined> {
  const secrets = credentials(spec);
  const change = await planFile(host, {
    path: CONFIG,
    content,
    mode: secrets.length ? 0o600 : 0o644,
    check: ["sh", asset("steps/checks/containerd-config.sh"), host.path(BIN), "{}"],
  });
  if (change && secrets.length && change.diff && !change.diff.startsWith("(")) {
    const before = change.action === "create" ? "" : ((await host.readText(CONFIG)) ?? "");
    change.diff = await unifiedDiff(CONFIG, redactAll(before, secrets), redactAll(content, secrets));
  }
  return change;
}

/**
 * The version the live unit recorded for this very binary (same package digest, or same size and
 * time): asking the binary again would only repeat it, and costs a process start per plan.
 */
async function recordedVersion(host: Host, stamp: string): Promise<ContainerdVersion | undefined> {
  const text = await host.readText(unitPath(UNIT), 1 << 16);
  if (!text?.includes(`\n# Binary: ${stamp}\n`)) return undefined;
  const m = text.match(/^# Version: (\d+)\.(\d+) (\S+)$/m);
  return m ? { major: Number(m[1]), minor: Number(m[2]), text: m[3] as string } : undefined;
}

/** The major version the live configuration was written for, from its header. */
async function configuredMajor(host: Host): Promise<number | undefined> {
  const text = await host.readText(CONFIG, 1 << 20);
  const m = text?.match(/^# containerd major version: (\d+)/m);
  return m ? Number(m[1]) : undefined;
}

async function planRegistries(host: Host, spec: ContainerdSpec): Promise<Primitive[]> {
  const changes: Primitive[] = [];
  const wanted = new Set(spec.registries.map((r) => r.host));
  for (const r of spec.registries) {
    const dir = `${REGISTRY_DIR}/${r.host}`;
    const d = await planDir(host, dir, { mode: 0o755 });
    if (d) changes.push(d);
    const caPath = r.ca ? `${dir}/ca.crt` : undefined;
    if (r.ca && caPath) {
      const ca = await planFile(host, { path: caPath, content: r.ca.endsWith("\n") ? r.ca : `${r.ca}\n`, mode: 0o644 });
      if (ca) changes.push(ca);
    } else {
      const gone = await planAbsent(host, `${dir}/ca.crt`);
      if (gone) changes.push(gone);
    }
    const hosts = await planFile(host, { path: `${dir}/hosts.toml`, content: renderHosts(r, caPath), mode: 0o644 });
    if (hosts) changes.push(hosts);
  }
  // Hosts files this step wrote for registries the bundle no longer names.
  for (const name of await host.listDir(REGISTRY_DIR)) {
    if (wanted.has(name)) continue;
    const file = `${REGISTRY_DIR}/${name}/hosts.toml`;
    const st = await host.stat(file);
    if (!st?.isFile || !((await host.readText(file, 1 << 20)) ?? "").startsWith(HOSTS_MARK)) continue;
    for (const f of ["hosts.toml", "ca.crt"]) {
      const gone = await planAbsent(host, `${REGISTRY_DIR}/${name}/${f}`);
      if (gone) changes.push({ ...gone, summary: `${gone.summary} (registry ${name} is no longer in the bundle)` });
    }
  }
  return changes;
}

const step: Step<"Containerd"> = {
  kind: "Containerd",
  async plan(spec, host) {
    const stamp = await binaryStamp(host, BIN, spec.package);
    const version = (await recordedVersion(host, stamp)) ?? (await installedVersion(host));
    const changes: Primitive[] = [];
    for (const dir of ["/etc/containerd", CONF_D, REGISTRY_DIR]) {
      const c = await planDir(host, dir, { mode: 0o755 });
      if (c) changes.push(c);
    }
    changes.push(...(await planRegistries(host, spec)));
    const config = await planConfig(
      host,
      spec,
      renderConfig(spec, version, { canLowerOomScores: await canLowerOomScores() }),
    );
    if (config) {
      const before = await configuredMajor(host);
      if (before !== undefined && before !== version.major) {
        config.disruptive = `containerd major version ${before} → ${version.major} (${version.text}): containerd restarts with a migrated configuration`;
      }
      changes.push(config);
    }
    const unit = await planUnit(host, UNIT, renderUnit(stamp, version));
    changes.push(...unit.changes);
    if (!unit.state.active) {
      changes.push(startByRestart(UNIT, ENGINE_FLAG));
    }
    return { changes, problems: [] };
  },
  // Deckhouse's scripts ask for a restart with containerd-need-restart.
  services: () => [
    { unit: UNIT, reads: [CONFIG, `${CONF_D}/`, unitPath(UNIT)], onChange: "restart", flags: [DECKHOUSE_FLAG] },
  ],
  secrets: (spec) => credentials(spec),
};

export default step;
