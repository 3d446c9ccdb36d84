// Throwaway Debian nodes: a cached debootstrap root (scripts/lib/debian-root.ts) booted with
// `systemd-nspawn -b`, so systemd is PID 1 and the agent meets a real init, real units, real
// shadow tools and a real journal.
//
// Each node is an overlayfs (lower = the cached root, read-only; upper and work in the node's
// own temp dir), so any number boot from one root side by side and the upper dir is afterwards
// exactly what the node changed (`diff()`). Each node has its own network namespace with a veth
// pair to the host: the node is `address` (eth0), the host is `hostAddress`; a service the test
// runs on the host listening on `hostAddress` (or 0.0.0.0) is reachable from inside. The default
// route points at the host, which does not forward, so nothing leaves the machine.
//
// Commands run inside with `nsenter -t <PID 1> -a` (there is no systemd on the host, so no
// machined and no `machinectl shell`), with a clean environment.
//
// What the container cannot offer, compared with a machine:
// - No watchdog device (/dev/watchdog): fencing needs a stand-in with the same interface.
// - PSI (/proc/pressure/*) and /proc/meminfo are the host's, not the node's: pressure caused by
//   other work on the machine shows inside, and the node's own limits do not.
// - cgroups: the host has cgroup v1 controllers (and a controller-less cgroup2). Each node runs
//   in a cgroup of its own in every hierarchy (…/bashible-nodes/<name>, below the test process's),
//   which is the root of its cgroup namespace; commands run with `exec()` join it too. nspawn
//   mounts the v1 controllers read-only inside; with `writableCgroups` the node remounts them
//   writable (what containerd and the kubelet need) and can then create groups below its own.
//   There is no cgroup v2 with controllers here: what needs it (v2 PSI per group, memory.high)
//   cannot be tried in a node on this machine.
// - The kernel is the host's: modules cannot be loaded, sysctls outside the network namespace
//   (vm.*, kernel.*) are the host's. /proc/sys is read-only unless `writableProcSys`, and with it
//   a node that writes vm.* or kernel.* changes the machine (a kubelet does: panic_on_oops...).
// - Seccomp is off (SYSTEMD_SECCOMP=0) and the node has every capability: containerd's session
//   keyrings need it; the node is a test part, not a security boundary.
// - No reboot: a reboot request ends the container (nspawn exits); the test sees a stopped node.
// - The host's /dev/kmsg is bound in (`kmsg`, on by default; the kubelet wants it), so the
//   node's journal also shows the host's kernel messages.
//
// Needs root and the Debian packages systemd-container (systemd-nspawn), util-linux (nsenter,
// mount), iproute2 (ip) and debootstrap (for the root).
import { copyInto, writeInto } from "./machine-files.ts";
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { lstat, mkdir, mkdtemp, open, readdir, readFile, readlink, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { debianRoot } from "./debian-root.ts";
import { reapSlots, type SlotPool, slotAddresses, slotFile, takeSlot } from "./net-slots.ts";

/** Host side bookkeeping: a node's resources, so a later run can reap what a killed one left. */
const STATE_DIR = "/run/bashible-test-nodes";
/** Each node gets a /30 of 10.213.0.0/16 (scripts/lib/net-slots.ts). */
const NET: SlotPool = { stateDir: STATE_DIR, prefix: "10.213", owner: "nspawn-node" };
const NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

export interface NodeOptions {
  /** Lower layer (default: the cached node root from debianRoot()). */
  root?: string;
  /** Machine name and hostname (default bn-<random>). */
  name?: string;
  /** Parent of the node's temp dir (default os.tmpdir()). */
  parentDir?: string;
  /** Called with the merged root before boot: seed files, units, configuration. */
  beforeBoot?: (rootfs: string) => Promise<void>;
  /** Bind the host's /dev/kmsg (default true). */
  kmsg?: boolean;
  /** Remount the cgroup v1 controllers writable inside after boot (containerd, kubelet). */
  writableCgroups?: boolean;
  /** /proc/sys writable (SYSTEMD_NSPAWN_API_VFS_WRITABLE=1). Read the warning above. */
  writableProcSys?: boolean;
  /**
   * What a kubelet and a CNI plugin need of /proc/sys without touching the machine: the node's
   * own network sysctls writable (/proc/sys/net is the node's network namespace), and stand-ins
   * for the kernel-wide ones a kubelet sets (KUBELET_KERNEL_SYSCTLS: files in the node's /run with
   * the host's values, bound over the /proc/sys entries; writes stay in the node).
   */
  kubeletSysctls?: boolean;
  /**
   * The root is a copy of the cached root on the host's filesystem instead of an overlay over it:
   * for what cannot live on overlayfs (containerd's overlayfs snapshotter needs its upper dirs on
   * a real filesystem). diff() then compares the two trees.
   */
  copyRoot?: boolean;
  /**
   * A reboot inside (exit 133 of nspawn) starts the node again on the same root, network and
   * cgroups, as systemd-nspawn@.service does; default: the node stops.
   */
  restartOnReboot?: boolean;
  /** Extra systemd-nspawn arguments (e.g. --bind=/host/dir:/node/dir). */
  nspawnArgs?: string[];
  /** Give up waiting for boot after this long (default 120 s). */
  bootTimeoutMs?: number;
}

export interface ExecOptions {
  input?: string | Buffer;
  env?: Record<string, string>;
  /** Working directory inside the node (default /root). */
  cwd?: string;
  timeoutMs?: number;
}

export interface ExecResult {
  exitCode: number;
  stdout: string;
  stderr: string;
}

export interface DiffEntry {
  /** Absolute path inside the node. */
  path: string;
  kind: "added" | "changed" | "deleted";
  type: "file" | "dir" | "symlink" | "other";
}

export interface NodeDiff {
  /** Every path the upper dir holds, minus directories that only exist to hold a change. */
  entries: DiffEntry[];
  users: { added: string[]; removed: string[]; changed: string[] };
  groups: { added: string[]; removed: string[]; changed: string[] };
  /** Unit files and enablement links under /etc/systemd and /lib/systemd, /usr/lib/systemd. */
  units: DiffEntry[];
}

export interface NspawnNode {
  name: string;
  /** How many times the node has booted to running (a restartOnReboot node counts its reboots). */
  readonly boots: number;
  /** Waits until the node has booted `n` times (restartOnReboot), or throws when it stopped. */
  waitBoot(n: number, timeoutMs?: number): Promise<string>;
  /** The node's temp dir (upper, work, merged, boot log). */
  dir: string;
  /** The merged root as the host sees it (nspawn's own /tmp, /run, /dev, /proc are not in it). */
  rootfs: string;
  lower: string;
  upper: string;
  /** Container's PID 1 (systemd) as the host sees it (a new one after a reboot). */
  readonly pid: number;
  /** The node's address on its veth (eth0). */
  address: string;
  /** The host's address on the node's veth: what the node dials to reach host services. */
  hostAddress: string;
  /** The host side veth interface. */
  hostInterface: string;
  /** Console output of the boot so far. */
  bootLog(): Promise<string>;
  /** `systemctl is-system-running` once boot finished (running or degraded). */
  state: string;
  /** Units that failed during boot (the reason for "degraded"). */
  failedUnits: string[];
  exec(argv: string[], opts?: ExecOptions): Promise<ExecResult>;
  /** Like exec, throws with the output on a non-zero exit. */
  mustExec(argv: string[], opts?: ExecOptions): Promise<ExecResult>;
  /** Starts a command inside and returns at once (for servers, followers). */
  spawn(argv: string[], opts?: { env?: Record<string, string>; cwd?: string }): ChildProcess;
  /** Copies a host file or directory (contents, modes) to `dest` inside; works for /tmp, /run too. */
  copyIn(src: string, dest: string): Promise<void>;
  /** Writes a file inside (parents created). */
  writeFile(dest: string, content: string | Buffer, mode?: number): Promise<void>;
  /** Waits until `systemctl is-system-running` is running or degraded. */
  waitRunning(timeoutMs?: number): Promise<string>;
  /** What the node changed, from the upper dir (call after stop() for a settled answer). */
  diff(): Promise<NodeDiff>;
  /** Clean shutdown (poweroff, then SIGKILL after timeoutMs), unmount, network gone; keeps dir. */
  stop(timeoutMs?: number): Promise<void>;
  /** stop() and remove the temp dir. */
  dispose(): Promise<void>;
  /** True until the container has exited. */
  running(): boolean;
}

interface NodeState {
  owner: number;
  name: string;
  nspawnPid?: number;
  pid?: number;
  dir: string;
  merged: string;
  netns: string;
  hostIf: string;
  slot: number;
  /** The node's own cgroup in every hierarchy (removed, children first, on teardown). */
  cgroups?: string[];
}

const live = new Map<string, NodeState>();

function sh(argv: string[], input?: string): { status: number; out: string } {
  const r = spawnSync(argv[0] as string, argv.slice(1), { encoding: "utf8", input });
  return { status: r.status ?? 1, out: `${r.stdout ?? ""}${r.stderr ?? ""}`.trim() };
}

function must(argv: string[]): string {
  const r = sh(argv);
  if (r.status !== 0) throw new Error(`${argv.join(" ")} failed (${r.status}): ${r.out}`);
  return r.out;
}

/** Running (a zombie counts as gone: its parent may be the very process waiting for it). */
function alive(pid: number | undefined): boolean {
  if (!pid) return false;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return false;
  }
}

/** Synchronous, best-effort teardown: usable from an exit handler and for stale nodes. */
function teardownSync(s: NodeState, keepDir = false): void {
  if (alive(s.pid)) process.kill(s.pid as number, "SIGKILL");
  if (alive(s.nspawnPid)) process.kill(s.nspawnPid as number, "SIGKILL");
  for (let i = 0; i < 200 && (alive(s.pid) || alive(s.nspawnPid)); i++) spawnSync("sleep", ["0.05"]);
  // nspawn's per-image lock (named after the root's device and inode) outlives a killed nspawn.
  const st = statSync(s.merged, { throwIfNoEntry: false });
  if (st) sh(["rm", "-f", `/run/systemd/nspawn/locks/inode-${st.dev}:${st.ino}`]);
  if (sh(["mountpoint", "-q", s.merged]).status === 0) sh(["umount", "-l", s.merged]);
  sh(["rm", "-rf", "--one-file-system", `/run/systemd/nspawn/propagate/${s.name}`]);
  for (const cg of s.cgroups ?? []) {
    if (existsSync(cg)) sh(["find", cg, "-depth", "-type", "d", "-exec", "rmdir", "{}", ";"]);
  }
  if (s.slot >= 0) {
    sh(["ip", "netns", "delete", s.netns]);
    sh(["ip", "link", "delete", s.hostIf]);
    sh(["rm", "-f", slotFile(NET, s.slot)]);
  }
  s.pid = undefined;
  s.nspawnPid = undefined;
  if (keepDir) return;
  // --one-file-system: never into a mount that is somehow still there.
  sh(["rm", "-rf", "--one-file-system", s.dir]);
  sh(["rm", "-f", path.join(STATE_DIR, `${s.name}.json`)]);
  live.delete(s.name);
}

let handlersInstalled = false;
function installExitHandlers(): void {
  if (handlersInstalled) return;
  handlersInstalled = true;
  process.on("exit", () => {
    for (const s of [...live.values()]) teardownSync(s);
  });
  for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"] as const) {
    process.once(sig, () => {
      // Someone else handles the signal (the by-hand CLI below): leave it to them.
      if (process.listenerCount(sig) > 0) return;
      for (const s of [...live.values()]) teardownSync(s);
      process.kill(process.pid, sig);
    });
  }
}

/** Tears down nodes whose owning process is gone (killed test runs). */
export async function reapStaleNodes(): Promise<string[]> {
  const reaped: string[] = [];
  for (const f of await readdir(STATE_DIR).catch(() => [] as string[])) {
    if (!f.endsWith(".json")) continue;
    const s = JSON.parse(await readFile(path.join(STATE_DIR, f), "utf8").catch(() => "{}")) as NodeState;
    if (!s.name || alive(s.owner)) continue;
    teardownSync(s);
    reaped.push(s.name);
  }
  // Slots whose node record is gone (a crash between taking the slot and writing the record).
  await reapSlots(NET, alive);
  return reaped;
}

/** The direct child of nspawn that became the container's init, once it runs systemd. */
async function containerInit(nspawnPid: number, deadline: number, child: ChildProcess): Promise<number> {
  for (;;) {
    const children = (await readFile(`/proc/${nspawnPid}/task/${nspawnPid}/children`, "utf8").catch(() => ""))
      .trim()
      .split(/\s+/)
      .filter(Boolean)
      .map(Number);
    for (const pid of children) {
      const comm = (await readFile(`/proc/${pid}/comm`, "utf8").catch(() => "")).trim();
      if (comm === "systemd") return pid;
    }
    if (child.exitCode !== null || child.signalCode !== null) throw new Error("systemd-nspawn exited during boot");
    if (Date.now() > deadline) throw new Error("the node's systemd did not start");
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** Shell that joins the cgroups given before `--`, then execs the rest (keeping its pid). */
const JOIN_CGROUPS = 'while [ "$1" != -- ]; do echo $$ >"$1/cgroup.procs" || exit 97; shift; done; shift; exec "$@"';

function runInside(
  pid: number,
  argv: string[],
  opts: ExecOptions & { pipeStdin?: boolean; cgroups?: string[] } = {},
): { child: ChildProcess; done: Promise<ExecResult> } {
  const env = Object.entries({ PATH: NODE_PATH, HOME: "/root", LANG: "C.UTF-8", TERM: "dumb", ...opts.env }).map(
    ([k, v]) => `${k}=${v}`,
  );
  const nsenter = ["nsenter", "-t", String(pid), "-a", "env", "-i", "-C", opts.cwd ?? "/root", ...env, ...argv];
  const child = spawn("sh", ["-c", JOIN_CGROUPS, "sh", ...(opts.cgroups ?? []), "--", ...nsenter], {
    stdio: ["pipe", "pipe", "pipe"],
    timeout: opts.timeoutMs,
    killSignal: "SIGKILL",
  });
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  child.stdout?.on("data", (d: Buffer) => out.push(d));
  child.stderr?.on("data", (d: Buffer) => err.push(d));
  const done = new Promise<ExecResult>((resolve, reject) => {
    child.once("error", reject);
    child.once("close", (code, signal) =>
      resolve({
        exitCode: code ?? 128,
        stdout: Buffer.concat(out).toString("utf8"),
        stderr: Buffer.concat(err).toString("utf8") + (signal ? `\n(killed by ${signal})` : ""),
      }),
    );
  });
  child.stdin?.on("error", () => undefined);
  if (!opts.pipeStdin) child.stdin?.end(opts.input);
  return { child, done };
}

/**
 * A cgroup of the node's own in every hierarchy, below this process's (so limits on the test
 * run still apply): nspawn is started inside it, so the node's cgroup namespace root is its own
 * directory, and what the node creates there (containerd's, the kubelet's groups) stays apart
 * from the host's and from other nodes'.
 */
function makeNodeCgroups(name: string): string[] {
  const own = new Map<string, string>();
  for (const line of readFileSync("/proc/self/cgroup", "utf8").trim().split("\n")) {
    const [, controllers = "", rel = "/"] = /^\d+:([^:]*):(.*)$/.exec(line) ?? [];
    own.set(controllers, rel);
  }
  const dirs: string[] = [];
  for (const line of readFileSync("/proc/self/mountinfo", "utf8").trim().split("\n")) {
    const [pre = "", post = ""] = line.split(" - ");
    const [fstype, , superOpts = ""] = post.split(" ");
    const [, , , root, mountPoint] = pre.split(" ");
    if ((fstype !== "cgroup" && fstype !== "cgroup2") || root !== "/" || !mountPoint) continue;
    const key =
      fstype === "cgroup2"
        ? ""
        : superOpts
            .split(",")
            .filter((o) => o !== "rw" && o !== "ro" && !o.startsWith("clone_children") && o !== "xattr")
            .join(",");
    const rel = own.get(key);
    if (rel === undefined) continue;
    const base = path.join(mountPoint, rel, "bashible-nodes");
    const dir = path.join(base, name);
    mkdirSync(dir, { recursive: true });
    // A new cpuset has no CPUs or memory nodes until given its parent's.
    for (const f of ["cpuset.cpus", "cpuset.mems"]) {
      const parent = path.join(mountPoint, rel, f);
      if (!existsSync(parent)) continue;
      const value = readFileSync(parent, "utf8");
      writeFileSync(path.join(base, f), value);
      writeFileSync(path.join(dir, f), value);
    }
    dirs.push(dir);
  }
  return dirs;
}

const CGROUP_V1_CONTROLLERS = ["memory", "cpu", "cpuacct", "cpuset", "devices", "freezer", "blkio", "pids"];

/** Kernel-wide sysctls a kubelet sets (its "kernel tunables"); kubeletSysctls gives the node stand-ins. */
export const KUBELET_KERNEL_SYSCTLS = [
  "vm/overcommit_memory",
  "vm/panic_on_oom",
  "kernel/panic",
  "kernel/panic_on_oops",
  "kernel/keys/root_maxkeys",
  "kernel/keys/root_maxbytes",
];

/** What runs inside after every boot, for the options that need it. */
function afterBootScript(opts: NodeOptions): string | undefined {
  const lines: string[] = [];
  if (opts.writableCgroups) {
    for (const c of CGROUP_V1_CONTROLLERS) {
      lines.push(
        `if [ -d /sys/fs/cgroup/${c} ]; then umount -l /sys/fs/cgroup/${c} && mount -t cgroup -o ${c} cgroup /sys/fs/cgroup/${c}; fi`,
      );
    }
  }
  if (opts.kubeletSysctls) {
    lines.push(
      "mount --bind /proc/sys/net /proc/sys/net && mount -o remount,bind,rw /proc/sys/net",
      "mkdir -p /run/nspawn-node/sysctl",
      `for f in ${KUBELET_KERNEL_SYSCTLS.join(" ")}; do`,
      '  s=/run/nspawn-node/sysctl/$(echo "$f" | tr / .)',
      '  cat "/proc/sys/$f" >"$s" && mount --bind "$s" "/proc/sys/$f"',
      "done",
    );
  }
  return lines.length ? lines.join("\n") : undefined;
}

/** Boots a node and waits until its systemd reports running or degraded. */
export async function bootNode(opts: NodeOptions = {}): Promise<NspawnNode> {
  if (process.getuid?.() !== 0) throw new Error("nspawn-node: needs root");
  installExitHandlers();
  await reapStaleNodes();
  const lower = opts.root ?? (await debianRoot()).dir;
  const id = randomBytes(3).toString("hex");
  const name = opts.name ?? `bn-${id}`;
  const dir = await mkdtemp(path.join(opts.parentDir ?? os.tmpdir(), `bashible-node-${name}-`));
  const merged = path.join(dir, "rootfs");
  // A copied root is its own upper dir: everything in it is what the node has.
  const upper = opts.copyRoot ? merged : path.join(dir, "upper");
  const work = path.join(dir, "work");
  for (const d of opts.copyRoot ? [merged] : [upper, work, merged]) await mkdir(d);
  const slot = await takeSlot(NET, name);
  const s: NodeState = {
    owner: process.pid,
    name,
    dir,
    merged,
    netns: `bashible-${name}`,
    hostIf: `bnh-${id}`,
    slot,
  };
  live.set(name, s);
  const writeState = () => writeFile(path.join(STATE_DIR, `${name}.json`), JSON.stringify(s));
  await writeState();
  const bootLogFile = path.join(dir, "boot.log");
  let child: ChildProcess | undefined;
  let exited: Promise<void> = Promise.resolve();
  let pid = 0;
  let boots = 0;
  let stopping = false;
  /** A boot after a reboot, while it runs. */
  let rebooting: Promise<void> | undefined;
  try {
    if (opts.copyRoot) must(["cp", "-a", `${lower}/.`, `${merged}/`]);
    else {
      must(["mount", "-t", "overlay", "overlay", "-o", `lowerdir=${lower},upperdir=${upper},workdir=${work}`, merged]);
    }
    // Every node its own machine id (the cached root has none).
    await writeFile(path.join(merged, "etc/machine-id"), `${randomBytes(16).toString("hex")}\n`);
    await writeFile(path.join(merged, "etc/hostname"), `${name}\n`);
    await opts.beforeBoot?.(merged);

    const addr = slotAddresses(NET, slot);
    const nodeIf = `bnn-${id}`;
    must(["ip", "netns", "add", s.netns]);
    must(["ip", "link", "add", s.hostIf, "type", "veth", "peer", "name", nodeIf, "netns", s.netns]);
    must(["ip", "addr", "add", `${addr.host}/30`, "dev", s.hostIf]);
    must(["ip", "link", "set", s.hostIf, "up"]);
    const ns = ["ip", "-n", s.netns];
    must([...ns, "link", "set", nodeIf, "name", "eth0"]);
    must([...ns, "addr", "add", `${addr.machine}/30`, "dev", "eth0"]);
    must([...ns, "link", "set", "eth0", "up"]);
    must([...ns, "link", "set", "lo", "up"]);
    must([...ns, "route", "add", "default", "via", addr.host]);

    const args = [
      "-q",
      "--register=no",
      "--keep-unit",
      "-b",
      "-D",
      merged,
      `--machine=${name}`,
      `--network-namespace-path=/run/netns/${s.netns}`,
      "--capability=all",
      "--console=read-only",
      // Leave the root's own resolv.conf, timezone and journal alone: the upper dir should hold
      // what the node did, not what nspawn copied in.
      "--resolv-conf=off",
      "--timezone=off",
      "--link-journal=no",
      ...(opts.kmsg === false ? [] : ["--bind=/dev/kmsg"]),
      ...(opts.nspawnArgs ?? []),
    ];
    s.cgroups = makeNodeCgroups(name);
    await writeState();
    // Commands run inside join the node's cgroups too (nspawn keeps systemd's tree in payload/),
    // so they are accounted to the node and see "/" as their cgroup, like the node's own.
    const cgroups = () =>
      (s.cgroups ?? []).map((d) => (existsSync(path.join(d, "payload")) ? path.join(d, "payload") : d));
    const inside = (argv: string[], o: ExecOptions & { pipeStdin?: boolean } = {}) =>
      runInside(pid, argv, { ...o, cgroups: cgroups() });
    const running = () => child !== undefined && child.exitCode === null && child.signalCode === null;

    /** Starts nspawn (again, after a reboot) and finds the container's PID 1. */
    const launch = async (deadline: number) => {
      const log = await open(bootLogFile, "a");
      // The shell joins the node's cgroups, then becomes nspawn (same pid).
      const c = spawn("sh", ["-c", JOIN_CGROUPS, "sh", ...(s.cgroups ?? []), "--", "systemd-nspawn", ...args], {
        env: {
          PATH: process.env.PATH ?? NODE_PATH,
          SYSTEMD_SECCOMP: "0",
          ...(opts.writableProcSys ? { SYSTEMD_NSPAWN_API_VFS_WRITABLE: "1" } : {}),
        },
        stdio: ["ignore", log.fd, log.fd],
      });
      await log.close();
      child = c;
      exited = new Promise((r) => c.once("exit", () => r()));
      c.once("exit", (code) => {
        // 133: the node asked for a reboot.
        if (code === 133 && opts.restartOnReboot && !stopping) {
          rebooting = (async () => {
            // nspawn's per-image lock is released with it; a killed one's is not.
            await launch(Date.now() + (opts.bootTimeoutMs ?? 120_000));
            await booted(Date.now() + (opts.bootTimeoutMs ?? 120_000));
          })().finally(() => {
            rebooting = undefined;
          });
          rebooting.catch(() => undefined);
        }
      });
      s.nspawnPid = c.pid;
      await writeState();
      pid = await containerInit(c.pid as number, deadline, c);
      s.pid = pid;
      await writeState();
    };

    /** Waits for running/degraded, then does what the options need after every boot. */
    const booted = async (deadline: number) => {
      node.state = await node.waitRunning(Math.max(1000, deadline - Date.now()));
      const script = afterBootScript(opts);
      if (script) await node.mustExec(["sh", "-ec", script]);
      node.failedUnits = [];
      if (node.state === "degraded") {
        const r = await node.exec(["systemctl", "list-units", "--failed", "--plain", "--no-legend"]);
        node.failedUnits = r.stdout
          .split("\n")
          .map((l) => l.trim().split(/\s+/)[0] ?? "")
          .filter(Boolean);
      }
      boots++;
    };

    const node: NspawnNode = {
      name,
      dir,
      rootfs: merged,
      lower,
      upper,
      get pid() {
        return pid;
      },
      get boots() {
        return boots;
      },
      address: addr.machine,
      hostAddress: addr.host,
      hostInterface: s.hostIf,
      state: "",
      failedUnits: [],
      bootLog: () => readFile(bootLogFile, "utf8").catch(() => ""),
      running,
      exec: (argv, o) => inside(argv, o).done,
      async mustExec(argv, o) {
        const r = await inside(argv, o).done;
        if (r.exitCode !== 0) {
          throw new Error(`${name}: ${argv.join(" ")} exited ${r.exitCode}:\n${(r.stderr || r.stdout).trim()}`);
        }
        return r;
      },
      spawn: (argv, o) => inside(argv, o ?? {}).child,
      copyIn: (src, dest) => copyInto(inside, name, src, dest),
      writeFile: (dest, content, mode) => writeInto(inside, name, dest, content, mode),
      async waitRunning(timeoutMs = 120_000) {
        const until = Date.now() + timeoutMs;
        for (;;) {
          // --wait blocks until boot is over; it fails at once while PID 1 has no bus socket yet.
          const r = await inside(["systemctl", "is-system-running", "--wait"], {
            timeoutMs: Math.max(1000, until - Date.now()),
          }).done;
          const st = r.stdout.trim();
          if (st === "running" || st === "degraded") return st;
          if (r.exitCode === 126 || r.exitCode === 127) throw new Error(`${name}: cannot run systemctl: ${r.stderr}`);
          if (!node.running()) throw new Error(`${name}: the node stopped during boot:\n${await node.bootLog()}`);
          if (Date.now() > until) {
            throw new Error(`${name}: not booted after ${timeoutMs} ms (state '${st}' ${r.stderr.trim()})`);
          }
          await new Promise((res) => setTimeout(res, 100));
        }
      },
      async waitBoot(n, timeoutMs = 180_000) {
        const until = Date.now() + timeoutMs;
        for (;;) {
          if (boots >= n) return node.state;
          if (rebooting) {
            await rebooting;
            continue;
          }
          // Between nspawn's exit and the exit handler that relaunches it, nothing runs.
          if (!running() && !rebooting) {
            await new Promise((res) => setTimeout(res, 100));
            if (!running() && !rebooting && boots < n) {
              throw new Error(`${name}: stopped (exit ${child?.exitCode ?? child?.signalCode}) before boot ${n}`);
            }
            continue;
          }
          if (Date.now() > until) throw new Error(`${name}: boot ${n} did not come within ${timeoutMs} ms`);
          await new Promise((res) => setTimeout(res, 200));
        }
      },
      diff: () => (opts.copyRoot ? diffTrees(lower, merged) : diffUpper(lower, upper)),
      async stop(timeoutMs = 60_000) {
        stopping = true;
        await rebooting?.catch(() => undefined);
        if (running()) {
          const c = child as ChildProcess;
          const init = pid;
          // nspawn turns SIGTERM into a poweroff request to the node's systemd.
          c.kill("SIGTERM");
          const timer = setTimeout(() => {
            if (alive(init)) process.kill(init, "SIGKILL");
            c.kill("SIGKILL");
          }, timeoutMs);
          await exited;
          clearTimeout(timer);
        }
        teardownSync(s, true);
        await writeState();
      },
      async dispose() {
        await node.stop();
        teardownSync(s);
      },
    };
    const deadline = Date.now() + (opts.bootTimeoutMs ?? 120_000);
    await launch(deadline);
    await booted(deadline);
    return node;
  } catch (err) {
    const bootLog = await readFile(bootLogFile, "utf8").catch(() => "");
    if (child?.pid) s.nspawnPid = child.pid;
    teardownSync(s);
    (err as Error).message += bootLog ? `\nboot log:\n${bootLog.slice(-3000)}` : "";
    throw err;
  }
}

/** A node disposed when the tap test ends, whatever the outcome. */
export async function nodeForTest(
  t: { teardown(fn: () => unknown): void },
  opts: NodeOptions = {},
): Promise<NspawnNode> {
  const node = await bootNode(opts);
  t.teardown(() => node.dispose());
  return node;
}

// ---- the upper dir diff ----

const isWhiteout = (st: { isCharacterDevice(): boolean; rdev: number }) => st.isCharacterDevice() && st.rdev === 0;

function typeOf(st: { isFile(): boolean; isDirectory(): boolean; isSymbolicLink(): boolean }): DiffEntry["type"] {
  if (st.isSymbolicLink()) return "symlink";
  if (st.isDirectory()) return "dir";
  if (st.isFile()) return "file";
  return "other";
}

async function exists(p: string): Promise<boolean> {
  return lstat(p).then(
    () => true,
    () => false,
  );
}

/** Walks the upper dir: what the node added, changed or deleted relative to the lower root. */
export async function diffUpper(lower: string, upper: string): Promise<NodeDiff> {
  const entries: DiffEntry[] = [];
  async function walk(rel: string): Promise<void> {
    for (const name of (await readdir(path.join(upper, rel))).sort()) {
      const r = path.join(rel, name);
      const st = await lstat(path.join(upper, r));
      const inLower = await exists(path.join(lower, r));
      const p = `/${r}`;
      if (isWhiteout(st)) {
        entries.push({ path: p, kind: "deleted", type: "other" });
        continue;
      }
      if (st.isDirectory()) {
        // A directory that also exists below is only a container for changes, unless its
        // metadata changed; new directories are changes themselves.
        if (!inLower) entries.push({ path: p, kind: "added", type: "dir" });
        await walk(r);
        continue;
      }
      entries.push({ path: p, kind: inLower ? "changed" : "added", type: typeOf(st) });
    }
  }
  await walk("");
  return { entries, ...(await accountsAndUnits(lower, upper, entries)) };
}

/** Users and groups (from etc/passwd and etc/group of each side) and unit entries. */
async function accountsAndUnits(
  lower: string,
  upper: string,
  entries: DiffEntry[],
): Promise<Omit<NodeDiff, "entries">> {
  const accounts = async (file: string) => {
    const parse = async (root: string) => {
      const m = new Map<string, string>();
      const text = await readFile(path.join(root, "etc", file), "utf8").catch(() => "");
      for (const line of text.split("\n").filter(Boolean)) m.set(line.split(":")[0] as string, line);
      return m;
    };
    const before = await parse(lower);
    const upperHas = await exists(path.join(upper, "etc", file));
    const after = upperHas ? await parse(upper) : before;
    return {
      added: [...after.keys()].filter((k) => !before.has(k)),
      removed: [...before.keys()].filter((k) => !after.has(k)),
      changed: [...after.keys()].filter((k) => before.has(k) && before.get(k) !== after.get(k)),
    };
  };
  const unitDirs = ["/etc/systemd/", "/lib/systemd/system/", "/usr/lib/systemd/system/"];
  return {
    users: await accounts("passwd"),
    groups: await accounts("group"),
    units: entries.filter((e) => unitDirs.some((d) => e.path.startsWith(d)) && e.type !== "dir"),
  };
}

/**
 * A copied root against the root it was copied from (copyRoot): what the node added, changed or
 * deleted. A file counts as changed when its type, mode, owner, bytes or link target differ (a
 * file rewritten with the same bytes is not a change: only what is left matters); a directory
 * only when it was added or deleted, or its mode or owner changed (its mtime moves with every
 * entry made or removed in it, which the entries themselves show).
 */
export async function diffTrees(lower: string, root: string): Promise<NodeDiff> {
  const entries: DiffEntry[] = [];
  const list = (d: string) => readdir(d).catch(() => [] as string[]);
  async function walkAdded(rel: string): Promise<void> {
    for (const name of (await list(path.join(root, rel))).sort()) {
      const r = path.join(rel, name);
      const st = await lstat(path.join(root, r));
      entries.push({ path: `/${r}`, kind: "added", type: typeOf(st) });
      if (st.isDirectory()) await walkAdded(r);
    }
  }
  async function walk(rel: string): Promise<void> {
    const names = new Set([...(await list(path.join(lower, rel))), ...(await list(path.join(root, rel)))]);
    for (const name of [...names].sort()) {
      const r = path.join(rel, name);
      const p = `/${r}`;
      const [a, b] = await Promise.all([
        lstat(path.join(lower, r)).catch(() => undefined),
        lstat(path.join(root, r)).catch(() => undefined),
      ]);
      if (a && !b) {
        entries.push({ path: p, kind: "deleted", type: typeOf(a) });
        continue;
      }
      if (!a && b) {
        entries.push({ path: p, kind: "added", type: typeOf(b) });
        if (b.isDirectory()) await walkAdded(r);
        continue;
      }
      if (!a || !b) continue;
      const sameOwner = a.mode === b.mode && a.uid === b.uid && a.gid === b.gid;
      if (a.isDirectory() && b.isDirectory()) {
        if (!sameOwner) entries.push({ path: p, kind: "changed", type: "dir" });
        await walk(r);
        continue;
      }
      let same = sameOwner && typeOf(a) === typeOf(b) && a.size === b.size && a.rdev === b.rdev;
      if (same && a.isSymbolicLink()) {
        same = (await readlink(path.join(lower, r))) === (await readlink(path.join(root, r)));
      } else if (same && a.isFile() && a.mtimeMs !== b.mtimeMs) {
        // Rewritten: a trace only if the bytes differ (a regenerated file may equal the original).
        same = (await readFile(path.join(lower, r))).equals(await readFile(path.join(root, r)));
      }
      if (!same) entries.push({ path: p, kind: "changed", type: typeOf(b) });
      if (a.isDirectory() !== b.isDirectory() && b.isDirectory()) await walkAdded(r);
    }
  }
  await walk("");
  return { entries, ...(await accountsAndUnits(lower, root, entries)) };
}

// ---- a root to run commands in, without booting it ----

export interface RootSandbox {
  rootfs: string;
  lower: string;
  upper: string;
  /**
   * Runs argv in a fresh `systemd-nspawn` container over the sandbox's overlay (changes persist
   * between runs, in the upper dir). It shares the host's network, so apt reaches the mirror.
   */
  run(
    argv: string[],
    opts?: {
      user?: string;
      /** Read-only bind mounts, `HOST:CONTAINER`. */
      binds?: string[];
      /** Writable bind mounts, `HOST:CONTAINER` (caches kept outside the sandbox). */
      rwBinds?: string[];
      env?: Record<string, string>;
      timeoutMs?: number;
      cwd?: string;
    },
  ): Promise<ExecResult>;
  diff(): Promise<NodeDiff>;
  dispose(): Promise<void>;
}

/**
 * An overlay over `lower` (a debianRoot) for running programs in a root that has no init: a
 * fresh machine for prerequisite checks, a target for package installs. Disposed like a node.
 */
export async function rootSandbox(lower: string, opts: { parentDir?: string } = {}): Promise<RootSandbox> {
  if (process.getuid?.() !== 0) throw new Error("nspawn-node: needs root");
  installExitHandlers();
  await reapStaleNodes();
  const name = `bs-${randomBytes(3).toString("hex")}`;
  const dir = await mkdtemp(path.join(opts.parentDir ?? os.tmpdir(), `bashible-root-${name}-`));
  const upper = path.join(dir, "upper");
  const work = path.join(dir, "work");
  const merged = path.join(dir, "rootfs");
  for (const d of [upper, work, merged]) await mkdir(d);
  const s: NodeState = { owner: process.pid, name, dir, merged, netns: "", hostIf: "", slot: -1 };
  live.set(name, s);
  await mkdir(STATE_DIR, { recursive: true });
  await writeFile(path.join(STATE_DIR, `${name}.json`), JSON.stringify(s));
  try {
    must(["mount", "-t", "overlay", "overlay", "-o", `lowerdir=${lower},upperdir=${upper},workdir=${work}`, merged]);
  } catch (err) {
    teardownSync(s);
    throw err;
  }
  return {
    rootfs: merged,
    lower,
    upper,
    run(argv, o = {}) {
      const args = [
        "-q",
        "--register=no",
        "--keep-unit",
        "--as-pid2",
        "--pipe",
        "-D",
        merged,
        `--machine=${name}`,
        "--resolv-conf=copy-host",
        "--timezone=off",
        "--link-journal=no",
        ...(o.user ? [`--user=${o.user}`] : []),
        ...(o.cwd ? [`--chdir=${o.cwd}`] : []),
        ...(o.binds ?? []).map((b) => `--bind-ro=${b}`),
        ...(o.rwBinds ?? []).map((b) => `--bind=${b}`),
        ...Object.entries(o.env ?? {}).map(([k, v]) => `--setenv=${k}=${v}`),
        "--",
        ...argv,
      ];
      return new Promise((resolve, reject) => {
        const child = spawn("systemd-nspawn", args, {
          stdio: ["ignore", "pipe", "pipe"],
          timeout: o.timeoutMs,
          killSignal: "SIGKILL",
        });
        const out: Buffer[] = [];
        const err: Buffer[] = [];
        child.stdout.on("data", (d: Buffer) => out.push(d));
        child.stderr.on("data", (d: Buffer) => err.push(d));
        child.once("error", reject);
        child.once("close", (code, signal) =>
          resolve({
            exitCode: code ?? 128,
            stdout: Buffer.concat(out).toString("utf8"),
            stderr: Buffer.concat(err).toString("utf8") + (signal ? `\n(killed by ${signal})` : ""),
          }),
        );
      });
    },
    diff: () => diffUpper(lower, upper),
    async dispose() {
      teardownSync(s);
    },
  };
}

// By hand, for debugging: boots a node and keeps it until Ctrl-C, then prints what it changed.
//   node scripts/lib/nspawn-node.ts [--writable-cgroups] [--writable-proc-sys] [nspawn args, e.g. --bind-ro=/src:/mnt]
if (import.meta.main) {
  const args = process.argv.slice(2);
  const node = await bootNode({
    writableCgroups: args.includes("--writable-cgroups"),
    writableProcSys: args.includes("--writable-proc-sys"),
    nspawnArgs: args.filter((a) => a !== "--writable-cgroups" && a !== "--writable-proc-sys"),
  });
  console.log(
    [
      `node ${node.name}: ${node.state}${node.failedUnits.length ? ` (failed: ${node.failedUnits.join(", ")})` : ""}`,
      `  enter:    nsenter -t ${node.pid} -a bash -l`,
      `  address:  ${node.address} (the host is ${node.hostAddress} on ${node.hostInterface})`,
      `  rootfs:   ${node.rootfs} (upper: ${node.upper})`,
      `  boot log: ${path.join(node.dir, "boot.log")}`,
      "Ctrl-C stops and removes it.",
    ].join("\n"),
  );
  await new Promise<void>((resolve) => process.once("SIGINT", () => resolve()));
  await node.stop();
  for (const e of (await node.diff()).entries) console.log(`  ${e.kind.padEnd(7)} ${e.path}`);
  await node.dispose();
  process.exit(0);
}
