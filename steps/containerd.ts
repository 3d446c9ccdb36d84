// Containerd (032_configure_containerd): containerd's configuration, its per-registry hosts files
// and its unit, for the containerd the registry package installed into /opt/deckhouse/bin, as
// Deckhouse's 032_configure_containerd and 002_add_system_proxy write them (docs/steps.md has
// the table, setting by setting).
//
// - /etc/containerd/config.toml: Deckhouse's configuration (version 2 for containerd 1.x, 3 for
//   2.x: the installed binary's `--version` decides) with this node's values (the sandbox image,
//   the kubelet's cgroup driver, the snapshotter, runc from /opt/deckhouse/bin, `config_path` =
//   /etc/containerd/registry.d, registry credentials), and the fragments of
//   /etc/containerd/conf.d (conf2.d for containerd 2) merged over it key by key as Deckhouse's
//   toml-merge merges them. Checked with `containerd --config CANDIDATE config dump` before it
//   replaces the live file.
// - /etc/containerd/registry.d/<host>/hosts.toml (+ ca.crt): server, mirrors, CA. containerd
//   reads these at each pull: changing them restarts nothing.
// - /etc/crictl.yaml: crictl finds this containerd without flags.
// - containerd-deckhouse.service (Deckhouse's unit name; the distribution's containerd.service is
//   left alone) and its proxy drop-in from the cluster's proxy; restarted when config.toml, the
//   unit (which names the installed package digest, so a new binary changes it) or the drop-in
//   changed.
//
// A change of containerd's major version is disruptive (running containers restart under a new
// runtime and a migrated configuration): the run asks for disruption approval first.
// NodeGroup cri.type NotManaged: the renderer leaves this step out, so nothing here is touched.
import { readFile } from "node:fs/promises";
import { asset } from "../lib/assets.ts";
import { sha256Hex } from "../bundles/checksum.ts";
import { PATHS } from "../bundles/paths.ts";
import { UNITS } from "../bundles/steps/index.ts";
import type { ContainerdProxy } from "../bundles/steps/containerd.ts";
import type { ContainerdRegistry, ContainerdSpec } from "../bundles/types.ts";
import type { Host } from "../host/host.ts";
import { planAbsent, planDir, planFile, unifiedDiff } from "../host/file-plan.ts";
import { RefusedError } from "../lib/errors.ts";
import type { FileChange, Primitive, Step } from "./types.ts";
import { binaryStamp } from "./lib/binary.ts";
import {
  isTable,
  lookup,
  mergeToml,
  parseToml,
  stringifyToml,
  table,
  type TomlTable,
  type TomlValue,
} from "./lib/toml.ts";
import { planUnit, reloadUnlessPlanned, startByRestart, unitPath } from "./lib/units.ts";

export const BIN = `${PATHS.binDir}/containerd`;
const RUNC = `${PATHS.binDir}/runc`;
const UNIT = UNITS.containerd;
const CONFIG = PATHS.containerdConfig;
const CONF_D = PATHS.containerdConfD;
const CONF2_D = PATHS.containerdConf2D;
const CRICTL_CONFIG = PATHS.crictlConfig;
/** Deckhouse's drop-in for containerd's proxy environment (002_add_system_proxy). */
export const PROXY_DROP_IN = `${PATHS.unitDir}/${UNITS.containerd}.d/proxy-environment.conf`;
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

type Toml = TomlTable;
const t = (entries: Record<string, TomlValue>): Toml => Object.assign(table(), entries);
const int = (n: number) => BigInt(n);

/** The platform containerd pulls for (runtime.v2.task platforms; Deckhouse writes linux/amd64). */
const PLATFORM = `linux/${process.arch === "x64" ? "amd64" : process.arch === "arm64" ? "arm64" : process.arch}`;

/** What neither version's base differs in: the daemon's own sections. */
function daemon(v3: boolean): Toml {
  return t({
    version: int(v3 ? 3 : 2),
    root: "/var/lib/containerd",
    state: "/run/containerd",
    plugin_dir: "",
    disabled_plugins: [],
    required_plugins: [],
    oom_score: int(0),
    grpc: t({
      address: PATHS.containerdSocket,
      tcp_address: "",
      tcp_tls_cert: "",
      tcp_tls_key: "",
      uid: int(0),
      gid: int(0),
      max_recv_message_size: int(16777216),
      max_send_message_size: int(16777216),
    }),
    ttrpc: t({ address: "", uid: int(0), gid: int(0) }),
    debug: t({ address: "", uid: int(0), gid: int(0), level: "" }),
    metrics: t({ address: "", grpc_histogram: false }),
  });
}

const GC = () =>
  t({
    pause_threshold: 0.02,
    deletion_threshold: int(0),
    mutation_threshold: int(100),
    schedule_delay: "0s",
    startup_delay: "100ms",
  });

const TIMEOUTS_V2 = () =>
  t({
    "io.containerd.timeout.shim.cleanup": "5s",
    "io.containerd.timeout.shim.load": "5s",
    "io.containerd.timeout.shim.shutdown": "3s",
    "io.containerd.timeout.task.state": "2s",
  });

/** The CRI streaming server both versions keep local (the kubelet proxies exec and logs to it). */
const STREAMING: Readonly<Record<string, TomlValue>> = {
  disable_tcp_service: true,
  stream_server_address: "127.0.0.1",
  stream_server_port: "0",
  stream_idle_timeout: "4h0m0s",
};

/** CRI's settings shared by both versions (Deckhouse's; device ownership from the pod's securityContext). */
function criRuntime(machine: { canLowerOomScores: boolean }): Record<string, TomlValue> {
  return {
    enable_selinux: false,
    selinux_category_range: int(1024),
    max_container_log_line_size: int(16384),
    disable_apparmor: false,
    // Where processes may not lower an OOM score (a machine that is itself a container), every
    // pod sandbox (-998) would fail in runc; containerd then keeps scores at or above its own.
    restrict_oom_score_adj: !machine.canLowerOomScores,
    disable_proc_mount: false,
    unset_seccomp_profile: "",
    tolerate_missing_hugetlb_controller: true,
    disable_hugetlb_controller: true,
    ignore_image_defined_volumes: false,
    device_ownership_from_security_context: true,
  };
}

function runcOptions(spec: ContainerdSpec): Record<string, TomlValue> {
  return { BinaryName: RUNC, SystemdCgroup: spec.cgroupDriver === "systemd" };
}

function registry(spec: ContainerdSpec): Toml {
  const configs = table();
  for (const r of spec.registries) if (r.auth) configs[r.host] = t({ auth: t({ auth: r.auth }) });
  return t({ config_path: REGISTRY_DIR, ...(Object.keys(configs).length ? { configs } : {}) });
}

/** Deckhouse's deckhouse.toml for containerd 1 (configuration version 2), with this node's values. */
function baseV2(spec: ContainerdSpec, machine: { canLowerOomScores: boolean }): Toml {
  const c = daemon(false);
  c.cgroup = t({ path: "" });
  c.timeouts = TIMEOUTS_V2();
  c.plugins = t({
    "io.containerd.gc.v1.scheduler": GC(),
    "io.containerd.grpc.v1.cri": t({
      ...STREAMING,
      sandbox_image: spec.sandboxImage,
      stats_collect_period: int(10),
      systemd_cgroup: false,
      enable_tls_streaming: false,
      disable_cgroup: false,
      max_concurrent_downloads: int(spec.maxConcurrentDownloads),
      ...criRuntime(machine),
      containerd: t({
        snapshotter: spec.snapshotter,
        default_runtime_name: "runc",
        no_pivot: false,
        disable_snapshot_annotations: true,
        discard_unpacked_layers: true,
        runtimes: t({
          runc: t({
            runtime_type: "io.containerd.runc.v2",
            runtime_engine: "",
            runtime_root: "",
            privileged_without_host_devices: false,
            base_runtime_spec: "",
            options: t(runcOptions(spec)),
          }),
        }),
      }),
      cni: t({ bin_dir: "/opt/cni/bin", conf_dir: "/etc/cni/net.d", max_conf_num: int(1), conf_template: "" }),
      registry: registry(spec),
      image_decryption: t({ key_model: "" }),
      x509_key_pair_streaming: t({ tls_cert_file: "", tls_key_file: "" }),
    }),
    "io.containerd.internal.v1.opt": t({ path: "/opt/containerd" }),
    "io.containerd.internal.v1.restart": t({ interval: "10s" }),
    "io.containerd.metadata.v1.bolt": t({ content_sharing_policy: "shared" }),
    "io.containerd.monitor.v1.cgroups": t({ no_prometheus: false }),
    "io.containerd.runtime.v2.task": t({ platforms: [PLATFORM] }),
    "io.containerd.service.v1.diff-service": t({ default: ["walking"] }),
  });
  return c;
}

/** Deckhouse's deckhouse.toml for containerd 2 (configuration version 3), with this node's values. */
function baseV3(spec: ContainerdSpec, v: ContainerdVersion, machine: { canLowerOomScores: boolean }): Toml {
  const c = daemon(true);
  c.plugins = t({
    "io.containerd.cri.v1.images": t({
      snapshotter: spec.snapshotter,
      disable_snapshot_annotations: true,
      discard_unpacked_layers: true,
      max_concurrent_downloads: int(spec.maxConcurrentDownloads),
      image_pull_with_sync_fs: false,
      image_pull_progress_timeout: "5m0s",
      stats_collect_period: int(10),
      pinned_images: t({ sandbox: spec.sandboxImage }),
      registry: registry(spec),
      image_decryption: t({ key_model: "" }),
    }),
    "io.containerd.cri.v1.runtime": t({
      ...criRuntime(machine),
      netns_mounts_under_state_dir: false,
      enable_unprivileged_ports: true,
      enable_unprivileged_icmp: true,
      enable_cdi: true,
      cdi_spec_dirs: ["/etc/cdi", "/var/run/cdi"],
      drain_exec_sync_io_timeout: "0s",
      ignore_deprecation_warnings: [],
      containerd: t({
        default_runtime_name: "runc",
        ignore_blockio_not_enabled_errors: false,
        ignore_rdt_not_enabled_errors: false,
        runtimes: t({
          runc: t({
            runtime_type: "io.containerd.runc.v2",
            runtime_path: "",
            pod_annotations: [],
            container_annotations: [],
            privileged_without_host_devices: false,
            privileged_without_host_devices_all_devices_allowed: false,
            base_runtime_spec: "",
            cni_conf_dir: "",
            cni_max_conf_num: int(0),
            sandboxer: "podsandbox",
            io_type: "",
            options: t({
              ...runcOptions(spec),
              CriuImagePath: "",
              CriuWorkPath: "",
              IoGid: int(0),
              IoUid: int(0),
              NoNewKeyring: false,
              Root: "",
              ShimCgroup: "",
            }),
          }),
        }),
      }),
      // 2.1 reads bin_dirs (bin_dir is deprecated there); 2.0 only bin_dir.
      cni: t({
        ...(v.minor >= 1 ? { bin_dirs: ["/opt/cni/bin"] } : { bin_dir: "/opt/cni/bin" }),
        conf_dir: "/etc/cni/net.d",
        max_conf_num: int(1),
        setup_serially: false,
        conf_template: "",
        ip_pref: "",
        use_internal_loopback: false,
      }),
    }),
    "io.containerd.gc.v1.scheduler": GC(),
    "io.containerd.grpc.v1.cri": t({
      ...STREAMING,
      enable_tls_streaming: false,
      x509_key_pair_streaming: t({ tls_cert_file: "", tls_key_file: "" }),
    }),
    "io.containerd.internal.v1.opt": t({ path: "/opt/containerd" }),
    "io.containerd.metadata.v1.bolt": t({ content_sharing_policy: "shared", no_sync: false }),
    "io.containerd.monitor.container.v1.restart": t({ interval: "10s" }),
    "io.containerd.monitor.task.v1.cgroups": t({ no_prometheus: false }),
    "io.containerd.runtime.v2.task": t({ platforms: [PLATFORM] }),
    "io.containerd.service.v1.diff-service": t({ default: ["walking"], sync_fs: false }),
    "io.containerd.service.v1.tasks-service": t({ blockio_config_file: "", rdt_config_file: "" }),
    "io.containerd.shim.v1.manager": t({ env: [] }),
    "io.containerd.transfer.v1.local": t({
      max_concurrent_downloads: int(spec.maxConcurrentDownloads),
      concurrent_layer_fetch_buffer: int(0),
      max_concurrent_uploaded_layers: int(3),
      check_platform_supported: false,
      config_path: "",
    }),
  });
  c.cgroup = t({ path: "" });
  c.timeouts = t({
    "io.containerd.timeout.bolt.open": "0s",
    "io.containerd.timeout.cri.defercleanup": "1m0s",
    "io.containerd.timeout.metrics.shimstats": "2s",
    ...TIMEOUTS_V2(),
  });
  return c;
}

/** Deckhouse's base configuration for this containerd: version 2 for containerd 1.x, 3 for 2.x. */
export function baseConfig(
  spec: ContainerdSpec,
  v: ContainerdVersion,
  machine: { canLowerOomScores: boolean } = { canLowerOomScores: true },
): TomlTable {
  return v.major >= 2 ? baseV3(spec, v, machine) : baseV2(spec, machine);
}

/** A fragment of conf.d (conf2.d): its node path and text. */
export interface Fragment {
  path: string;
  text: string;
}

/** Where NodeGroupConfiguration scripts put fragments for this containerd (Deckhouse: conf.d for 1, conf2.d for 2). */
const fragmentDir = (v: ContainerdVersion) => (v.major >= 2 ? CONF2_D : CONF_D);

/** The CRI registry table a fragment must not give mirrors in: config_path is set, containerd refuses both. */
const registryPath = (v: ContainerdVersion) =>
  v.major >= 2
    ? ["plugins", "io.containerd.cri.v1.images", "registry"]
    : ["plugins", "io.containerd.grpc.v1.cri", "registry"];

/**
 * config.toml: the base, every fragment merged over it in name order as Deckhouse's toml-merge
 * merges them (so a fragment naming one key of the CRI plugin changes that key, not the whole
 * table), with a header naming the fragments. A fragment that does not parse, gives a key
 * another type, or sets registry mirrors (containerd refuses them beside config_path: they go
 * into /etc/containerd/registry.d/<host>/hosts.toml) is refused, naming the file.
 */
export function renderConfig(
  spec: ContainerdSpec,
  v: ContainerdVersion,
  machine: { canLowerOomScores: boolean } = { canLowerOomScores: true },
  fragments: Fragment[] = [],
): string {
  const config = baseConfig(spec, v, machine);
  const v3 = v.major >= 2;
  const header = [
    "# Managed by bashible (032_configure_containerd).",
    `# containerd major version: ${v.major} (configuration version ${v3 ? 3 : 2})`,
    `# Deckhouse's configuration with ${fragmentDir(v)}/*.toml merged over it key by key, in name order;`,
    "# a change there is merged the next time this step runs.",
    `# Registry mirrors and CAs: ${REGISTRY_DIR}/<host>/hosts.toml (read at each pull).`,
  ];
  for (const f of fragments) {
    let parsed: TomlTable;
    try {
      parsed = parseToml(f.text, f.path);
    } catch (err) {
      throw new RefusedError(`${(err as Error).message}; fix or remove the fragment (config.toml stays as it is)`);
    }
    const reg = lookup(parsed, registryPath(v));
    if (isTable(reg) && "mirrors" in reg) {
      throw new RefusedError(
        `${f.path} sets registry mirrors, which containerd refuses beside config_path; put them in ${REGISTRY_DIR}/<host>/hosts.toml instead (config.toml stays as it is)`,
      );
    }
    try {
      mergeToml(config, parsed);
    } catch (err) {
      throw new RefusedError(`${f.path}: ${(err as Error).message}; fix the fragment (config.toml stays as it is)`);
    }
    header.push(`#   merged: ${f.path} (sha256:${sha256Hex(f.text).slice(0, 16)})`);
  }
  return `${header.join("\n")}\n${stringifyToml(config)}`;
}

/** The fragments of this containerd's directory, in name order (as the shell's glob orders them). */
async function readFragments(host: Host, v: ContainerdVersion): Promise<Fragment[]> {
  const dir = fragmentDir(v);
  const out: Fragment[] = [];
  for (const name of (await host.listDir(dir)).filter((n) => n.endsWith(".toml")).sort()) {
    const p = `${dir}/${name}`;
    const st = await host.stat(p);
    if (!st?.isFile && !st?.isSymlink) continue;
    out.push({ path: p, text: (await host.readText(p, 1 << 20)) ?? "" });
  }
  return out;
}

/** /etc/crictl.yaml: crictl talks to this containerd without flags (Deckhouse's file, our socket). */
export function renderCrictl(): string {
  const sock = `unix://${PATHS.containerdSocket}`;
  return `# Managed by bashible (032_configure_containerd).
runtime-endpoint: ${sock}
image-endpoint: ${sock}
timeout: 2
debug: false
pull-image-on-create: false
`;
}

/** systemd's Environment= quoting: every value in double quotes, % doubled (a specifier otherwise). */
const envValue = (k: string, v: string) =>
  `"${`${k}=${v}`.replaceAll("\\", "\\\\").replaceAll('"', '\\"').replaceAll("%", "%%")}"`;

/** The drop-in that gives containerd the cluster's proxy (Deckhouse's 002_add_system_proxy). */
function renderProxyDropIn(p: ContainerdProxy): string {
  const vars: [string, string][] = [];
  if (p.httpProxy) vars.push(["HTTP_PROXY", p.httpProxy], ["http_proxy", p.httpProxy]);
  if (p.httpsProxy) vars.push(["HTTPS_PROXY", p.httpsProxy], ["https_proxy", p.httpsProxy]);
  const no = p.noProxy.join(",");
  vars.push(["NO_PROXY", no], ["no_proxy", no]);
  return `# Managed by bashible (032_configure_containerd): pulls go through the cluster's proxy.
[Service]
Environment=${vars.map(([k, v]) => envValue(k, v)).join(" ")}
`;
}

/** user:password of proxy URLs: secrets (the password, and the two together). */
function proxyCredentials(spec: ContainerdSpec): string[] {
  const out: string[] = [];
  for (const u of [spec.proxy?.httpProxy, spec.proxy?.httpsProxy]) {
    const m = u?.match(/^https?:\/\/([^@/]+)@/);
    if (!m) continue;
    const userinfo = m[1] as string;
    out.push(userinfo, userinfo.slice(userinfo.indexOf(":") + 1), decodeURIComponent(userinfo));
  }
  return [...new Set(out)].filter((s) => s.length >= 4);
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
async function planConfig(
  host: Host,
  spec: ContainerdSpec,
  content: string,
  more: string[] = [],
): Promise<FileChange | undefined> {
  const secrets = [...credentials(spec), ...more];
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

/** Credentials a fragment carries (registry auth): kept out of the plan's diff like the bundle's. */
function fragmentSecrets(fragments: Fragment[]): string[] {
  const out: string[] = [];
  const walk = (v: TomlValue | undefined) => {
    if (Array.isArray(v)) v.forEach(walk);
    else if (isTable(v)) {
      for (const [k, x] of Object.entries(v)) {
        if (typeof x === "string" && /^(auth|password|identitytoken)$/i.test(k) && x.length >= 4) out.push(x);
        else walk(x);
      }
    }
  };
  for (const f of fragments) {
    try {
      walk(parseToml(f.text, f.path));
    } catch {
      // renderConfig refuses it, naming the file.
    }
  }
  return out;
}

/** The proxy drop-in, or its removal when the cluster has no proxy (any more). */
async function planProxy(host: Host, spec: ContainerdSpec): Promise<Primitive[]> {
  if (!spec.proxy) {
    const gone = await planAbsent(host, PROXY_DROP_IN);
    return gone ? [{ ...gone, summary: `${gone.summary} (the cluster has no proxy)` }] : [];
  }
  const secret = proxyCredentials(spec).length > 0;
  const dir = await planDir(host, `${PATHS.unitDir}/${UNIT}.d`, { mode: 0o755 });
  const file = await planFile(host, {
    path: PROXY_DROP_IN,
    content: renderProxyDropIn(spec.proxy),
    mode: secret ? 0o600 : 0o644,
    ...(secret ? { secret: true } : {}),
  });
  return [...(dir ? [dir] : []), ...(file ? [file] : [])];
}

const step: Step<"Containerd"> = {
  kind: "Containerd",
  async plan(spec, host) {
    const stamp = await binaryStamp(host, BIN, spec.package);
    const version = (await recordedVersion(host, stamp)) ?? (await installedVersion(host));
    const changes: Primitive[] = [];
    for (const dir of ["/etc/containerd", fragmentDir(version), REGISTRY_DIR]) {
      const c = await planDir(host, dir, { mode: 0o755 });
      if (c) changes.push(c);
    }
    changes.push(...(await planRegistries(host, spec)));
    const fragments = await readFragments(host, version);
    const config = await planConfig(
      host,
      spec,
      renderConfig(spec, version, { canLowerOomScores: await canLowerOomScores() }, fragments),
      fragmentSecrets(fragments),
    );
    if (config) {
      const before = await configuredMajor(host);
      if (before !== undefined && before !== version.major) {
        config.disruptive = `containerd major version ${before} → ${version.major} (${version.text}): containerd restarts with a migrated configuration`;
      }
      changes.push(config);
    }
    const crictl = await planFile(host, { path: CRICTL_CONFIG, content: renderCrictl(), mode: 0o644 });
    if (crictl) changes.push(crictl);
    const proxy = await planProxy(host, spec);
    const unit = await planUnit(host, UNIT, renderUnit(stamp, version));
    changes.push(...proxy, ...unit.changes);
    if (proxy.some((c) => c.kind === "file")) {
      changes.push(...reloadUnlessPlanned(unit.changes, UNIT, `${PROXY_DROP_IN} changed`));
    }
    if (!unit.state.active) {
      changes.push(startByRestart(UNIT, ENGINE_FLAG));
    }
    return { changes, problems: [] };
  },
  // What containerd reads: config.toml (fragments reach it merged), its unit and the proxy
  // drop-in. Deckhouse's scripts ask for a restart with containerd-need-restart.
  services: () => [
    { unit: UNIT, reads: [CONFIG, unitPath(UNIT), PROXY_DROP_IN], onChange: "restart", flags: [DECKHOUSE_FLAG] },
  ],
  secrets: (spec) => [...credentials(spec), ...proxyCredentials(spec)],
};

export default step;
