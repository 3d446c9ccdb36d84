// Everything the end-to-end scenario and its benchmark share: the artifacts (the agent built from
// this checkout, the registry packages, the container images), the cluster side, the node's
// root, and what an operator does on a machine (make the control plane's name resolve, copy
// bootstrap.sh over and run it).
import type { ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { buildDist } from "../../build.ts";
import { type BuiltPackage, buildPackages } from "../../package.ts";
import { debianRoot } from "../debian-root.ts";
import { type LocalRepo, localDebianRepo, type RepoServer, serveRepo } from "../debian-mirror.ts";
import { bootNode, type NodeOptions, type NspawnNode } from "../nspawn-node.ts";
import { bootVm, type VmNode } from "../vm-node.ts";
import { vmImage } from "../vm-image.ts";
import { distroPackagesFor, PACKAGE_ROLES } from "../../../bundles/os-families.ts";
import { isNotFound } from "../../../lib/kube/errors.ts";
import { CONTROL_PLANE_HOST, type E2eCluster, startE2eCluster } from "./cluster.ts";
import { buildImages, type ImageArchive } from "./images.ts";

/**
 * The machine, bare as a cloud image has it: minbase Debian with systemd, D-Bus, iproute2, procps
 * and kmod (scripts/lib/vm-image.ts VM_PACKAGES, less what only a VM needs: udev, an ssh server).
 * No curl, sudo, nginx, ca-certificates or iptables: bootstrap.sh installs curl, the agent
 * (000_add_mandatory_packages) the rest, from the machine's mirror.
 */
export const E2E_NODE_PACKAGES: readonly string[] = ["systemd", "systemd-sysv", "dbus", "iproute2", "procps", "kmod"];

/**
 * The machine's distribution mirror (scripts/lib/debian-mirror.ts, served on its veth's host
 * address): every Debian package of every role 000_add_mandatory_packages knows, curl for
 * bootstrap.sh among them, with all their dependencies.
 */
export const E2E_MIRROR_PACKAGES: readonly string[] = distroPackagesFor("debian", PACKAGE_ROLES);

/** What a node of the scenario needs from systemd-nspawn (see scripts/lib/nspawn-node.ts). */
export const E2E_NODE_OPTIONS: NodeOptions = {
  // containerd's overlayfs snapshots cannot have their upper dirs on the overlay a node usually is.
  copyRoot: true,
  // containerd and the kubelet make cgroups; the kubelet and the bridge plugin write sysctls.
  writableCgroups: true,
  kubeletSysctls: true,
  // cleanup_static_node.sh reboots the machine; the node comes back on the same disk.
  restartOnReboot: true,
};

/** Why this machine cannot run a world (a tap `skip`), or false when it can. */
export function worldSkip(): string | false {
  const missing = [
    "/usr/bin/systemd-nspawn",
    "/usr/sbin/debootstrap",
    "/usr/bin/docker-registry",
    "/usr/bin/openssl",
  ].filter((p) => !existsSync(p));
  return process.getuid?.() !== 0
    ? "needs root (boots systemd-nspawn machines, runs a control plane)"
    : missing.length
      ? `needs ${missing.join(", ")} (apt-get install systemd-container debootstrap docker-registry openssl)`
      : false;
}

/** What the operator's steps need of a machine: an nspawn machine or a VM (scripts/lib/vm-node.ts). */
export type Machine = Pick<NspawnNode & VmNode, "name" | "hostAddress" | "mustExec" | "writeFile" | "spawn">;

export interface World {
  work: string;
  dist: string;
  packages: BuiltPackage[];
  images: { pause: ImageArchive; busybox: ImageArchive };
  /** The cached Debian root the machines start from. */
  root: string;
  /** The machines' Debian mirror (one server per machine, on its host address). */
  mirror: LocalRepo;
  /** What each machine's mirror served, by machine name. */
  mirrorServers: Map<string, RepoServer>;
  cluster: E2eCluster;
  /** A fresh machine, prepared as its operator has it (names resolve), not yet a node. */
  machine(name: string): Promise<NspawnNode>;
  /**
   * The same as a QEMU VM (a kernel of its own; software-emulated here, so minutes where a
   * container takes seconds): the VM image is as bare as the machine's root (VM_PACKAGES).
   */
  vm(name: string, o?: { memoryMiB?: number }): Promise<VmNode>;
  stop(): Promise<void>;
}

export async function startWorld(
  o: {
    log?: (line: string) => void;
    keepWork?: () => boolean;
    /** What the cluster side runs besides the defaults (startE2eCluster's scheduler, serverArgs). */
    cluster?: { scheduler?: boolean; serverArgs?: string[] };
  } = {},
): Promise<World> {
  const say = o.log ?? (() => undefined);
  const work = await mkdtemp(path.join(process.env.BASHIBLE_E2E_WORK ?? os.tmpdir(), "bashible-e2e-"));
  const nodes: (NspawnNode | VmNode)[] = [];
  const mirrorServers = new Map<string, RepoServer>();
  let cluster: E2eCluster | undefined;
  let failed = false;
  const stop = async () => {
    // A node with pods takes a while to power off; nothing in it is needed any more.
    for (const n of nodes) await n.stop(15_000).catch(() => undefined);
    for (const n of nodes) await n.dispose().catch(() => undefined);
    for (const s of mirrorServers.values()) await s.close().catch(() => undefined);
    await cluster?.stop();
    if (!failed && !o.keepWork?.()) await rm(work, { recursive: true, force: true });
  };
  try {
    let t = Date.now();
    const lap = (what: string) => {
      say(`${what} (${((Date.now() - t) / 1000).toFixed(1)} s)`);
      t = Date.now();
    };
    const root = (await debianRoot({ packages: E2E_NODE_PACKAGES, log: say })).dir;
    lap("node root ready");
    const mirror = await localDebianRepo({ packages: E2E_MIRROR_PACKAGES, log: say });
    lap(`Debian mirror ready (${mirror.packages.length} packages)`);
    const dist = path.join(work, "dist");
    await buildDist(dist);
    lap("agent built from this checkout");
    const packages = await buildPackages({ out: path.join(work, "packages"), dist, log: () => undefined });
    lap(`registry packages built: ${packages.map((p) => p.name).join(", ")}`);
    const images = await buildImages(path.join(work, "images"));
    lap("images built (busybox, pause)");
    cluster = await startE2eCluster({ dir: work, dist, packages, log: say, ...o.cluster });
    lap("cluster side up");
    const c = cluster;
    /** Keeps `node` for stop(), serves it its mirror on its host address and prepares it. */
    const prepared = async <M extends NspawnNode | VmNode>(node: M): Promise<M> => {
      nodes.push(node);
      const server = await serveRepo(mirror.dir, node.hostAddress);
      mirrorServers.set(node.name, server);
      await prepareMachine(node, server.sourcesLine);
      return node;
    };
    return {
      work,
      dist,
      packages,
      images,
      root,
      mirror,
      mirrorServers,
      cluster: c,
      async machine(name) {
        return prepared(await bootNode({ ...E2E_NODE_OPTIONS, root, name, parentDir: work }));
      },
      async vm(name, vo = {}) {
        const image = await vmImage({ log: say });
        return prepared(await bootVm({ image, name, parentDir: work, memoryMiB: vo.memoryMiB ?? 2048 }));
      },
      stop,
    };
  } catch (err) {
    failed = true;
    await stop();
    (err as Error).message += `\n(work dir kept: ${work})`;
    throw err;
  }
}

/**
 * The world's container images (busybox, pause) imported into a joined machine's containerd, as
 * a registry mirror would have served them: the e2e pods use `imagePullPolicy: Never`.
 */
export async function importImages(world: World, machine: NspawnNode | VmNode): Promise<void> {
  for (const img of Object.values(world.images)) {
    const dest = `/tmp/${path.basename(img.file)}`;
    await machine.copyIn(img.file, dest);
    await machine.mustExec(["/opt/deckhouse/bin/ctr", "-n", "k8s.io", "images", "import", dest]);
  }
}

/**
 * What the machine's operator has set up: its own name resolves (Debian's installer writes
 * 127.0.1.1 <hostname>; without it the kubelet's node address lookup waits for DNS servers this
 * node cannot reach, 10 s), the control plane's name resolves to this node's host, and its apt
 * source is its distribution's mirror (here the local one: the only mirror it can reach).
 */
export async function prepareMachine(node: Machine, sourcesLine: string): Promise<void> {
  await node.mustExec([
    "sh",
    "-c",
    'printf "%s\\n" "127.0.1.1 $1" "$2 $3" >>/etc/hosts && printf "%s\\n" "$4" >/etc/apt/sources.list && rm -f /etc/apt/sources.list.d/*',
    "sh",
    node.name,
    node.hostAddress,
    CONTROL_PLANE_HOST,
    sourcesLine,
  ]);
}

export interface Line {
  /** ms since the script started. */
  at: number;
  text: string;
}

export interface ScriptRun {
  exitCode: number;
  lines: Line[];
  startedAt: number;
  endedAt: number;
  output: string;
}

/**
 * Runs a script on the machine as an operator does (copied to /tmp, `bash /tmp/NAME ARGS`),
 * recording each output line with its time.
 */
export async function runScript(
  node: Machine,
  name: string,
  content: string,
  args: string[] = [],
  o: { timeoutMs?: number; onLine?: (l: Line) => void } = {},
): Promise<ScriptRun> {
  await node.writeFile(`/tmp/${name}`, content, 0o700);
  const startedAt = Date.now();
  const lines: Line[] = [];
  const child: ChildProcess = node.spawn(["bash", `/tmp/${name}`, ...args]);
  child.stdin?.end();
  const collect = (stream: NodeJS.ReadableStream | null) => {
    let rest = "";
    stream?.on("data", (d: Buffer) => {
      rest += d.toString("utf8");
      const parts = rest.split("\n");
      rest = parts.pop() ?? "";
      for (const text of parts) {
        const l = { at: Date.now() - startedAt, text };
        lines.push(l);
        o.onLine?.(l);
      }
    });
    stream?.on("end", () => {
      if (rest) lines.push({ at: Date.now() - startedAt, text: rest });
    });
  };
  collect(child.stdout);
  collect(child.stderr);
  const timer = setTimeout(() => child.kill("SIGKILL"), o.timeoutMs ?? 15 * 60_000);
  const exitCode = await new Promise<number>((resolve) => child.once("close", (code) => resolve(code ?? 128)));
  clearTimeout(timer);
  return { exitCode, lines, startedAt, endedAt: Date.now(), output: lines.map((l) => l.text).join("\n") };
}

export interface KubeNode {
  metadata: { name: string; uid?: string; labels?: Record<string, string>; annotations?: Record<string, string> };
  spec?: { taints?: { key: string; effect: string }[]; unschedulable?: boolean };
  status?: { conditions?: { type: string; status: string }[]; capacity?: Record<string, string> };
}

/** The Node object, or undefined when there is none. */
export function getNode(cluster: E2eCluster, name: string): Promise<KubeNode | undefined> {
  return cluster.cp.admin.request<KubeNode>("GET", `/api/v1/nodes/${name}`).catch((err: unknown) => {
    if (isNotFound(err)) return undefined;
    throw err;
  });
}

export const isReady = (n?: KubeNode): boolean =>
  n?.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True") === true;

export interface Join {
  run: ScriptRun;
  /** ms from bootstrap.sh's start until the Node was seen Ready (polled every 200 ms); NaN if never. */
  readyMs: number;
  node: KubeNode | undefined;
}

/**
 * Runs bootstrap.sh on the machine while watching its Node: the join time is bootstrap.sh's
 * start → the Node seen Ready. Resolves once the script has ended and the Node is Ready (or
 * the script failed, or the Node did not become Ready in time: then node is undefined).
 */
export async function joinMachine(
  cluster: E2eCluster,
  machine: Machine,
  script: string,
  o: { readyTimeoutMs?: number; onLine?: (l: Line) => void } = {},
): Promise<Join> {
  const readyTimeoutMs = o.readyTimeoutMs ?? 300_000;
  let startedAt = Date.now();
  let stop = false;
  const ready = (async () => {
    const deadline = Date.now() + readyTimeoutMs;
    for (;;) {
      const n = await getNode(cluster, machine.name).catch(() => undefined);
      if (n && isReady(n)) return { node: n, at: Date.now() };
      if (stop || Date.now() > deadline) return undefined;
      await new Promise((r) => setTimeout(r, 200));
    }
  })();
  // bootstrap.sh may take as long as the Node may take to turn Ready (runScript's default is 15 minutes).
  const run = await runScript(machine, "bootstrap.sh", script, [], {
    timeoutMs: Math.max(15 * 60_000, readyTimeoutMs),
    ...(o.onLine ? { onLine: o.onLine } : {}),
  });
  startedAt = run.startedAt;
  if (run.exitCode !== 0) stop = true;
  const seen = await ready;
  return seen ? { run, readyMs: seen.at - startedAt, node: seen.node } : { run, readyMs: Number.NaN, node: undefined };
}
