// Throwaway virtual machines for what a container node (scripts/lib/nspawn-node.ts) cannot show:
// a kernel of its own (modules, swap, vm.* and kernel.* sysctls), cgroup v2 with per-cgroup PSI,
// a watchdog device that really panics the machine, a real reboot. The interface follows
// NspawnNode where it makes sense (exec, copyIn, writeFile, spawn, waitRunning, reboot, stop,
// diff, dispose, vmForTest).
//
// A VM is QEMU with software emulation (`-machine q35 -accel tcg,thread=multi -cpu max`: the
// machine's /dev/kvm is a PVM build stock kernels cannot use), booting Debian's cloud kernel
// directly with a busybox initramfs (scripts/lib/vm-image.ts, cached). Its disk is a qcow2
// overlay in the VM's own temp dir backed by the cached raw image, which stays untouched:
// booting is cheap, and `diff()` compares what the overlay holds with the image.
//
// Network: each VM takes a /30 of 10.214.0.0/16 (slots are files created exclusively in
// /run/bashible-test-vms/net/) on a tap device of its own on the host (`bvt-<id>`): the host side
// is `hostAddress`, the guest's eth0 is `address` (set from the kernel's `ip=` argument by
// systemd-networkd), the guest's default route points at the host, which does not forward. So a
// service the test runs on `hostAddress` is reachable from the guest, the guest's ports (ssh, a
// kubelet) from the host, and nothing leaves the machine. A tap (and not QEMU in a network
// namespace of its own) because the point-to-point link needs nothing else: no bridge, no veth,
// and the one thing to remove afterwards is the tap.
//
// Commands run over ssh as root, with a key made once per cache (vm/ssh/) and the image's host
// key pinned (known_hosts under HOST_KEY_ALIAS): a real channel a real machine has, which
// streams stdin, stdout and stderr and so gives `spawn()` and `copyIn()` (tar through ssh) for
// free; one multiplexed master connection per boot keeps each command cheap under emulation
// (the guest agent, qemu-guest-agent, returns output only once a command ends and needs a
// package in the guest beyond what a cloud image has).
//
// The serial console goes to `consoleFile` (appended across reboots); `waitForConsole(re)`
// waits for a line on it. A kernel panic on the console (with `panic=0` on the kernel command
// line the guest then halts, spinning a host core) makes the harness kill QEMU once the panic's
// end marker is out (`killOnPanic`, default on); `panic` then holds the panic's text.
//
// Reboots: QEMU runs with `-no-reboot`, so a reset inside ends QEMU, and the harness starts it
// again on the same disk and network (faster than a reboot inside one QEMU process under
// emulation); `reboot()` asks the guest, `restartOnReboot` restarts after any reset the guest
// makes itself (a watchdog reset, an agent's reboot). Without it, a reset leaves the VM stopped.
//
// Cost: CPU is the limit (every guest instruction is emulated): 2 vCPUs and 1 GiB by default,
// and VMs boot one at a time (an flock in the cache, held from QEMU's start until systemd is
// ready). A killed test leaves a record in /run/bashible-test-vms/<name>.json; the next boot (or
// `reapStaleVms()`) kills its QEMU and removes its tap and temp dir. Only VMs are reaped: nspawn
// nodes have their own records and reaper.
//
// Needs root and the Debian packages qemu-system-x86, qemu-utils, openssh-client, iproute2,
// util-linux, e2fsprogs, busybox-static, debootstrap.
import { copyInto, writeInto } from "./machine-files.ts";
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { mkdir, mkdtemp, open, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import { connect } from "node:net";
import os from "node:os";
import path from "node:path";
import { StringDecoder } from "node:string_decoder";
import { acquireLock } from "./flock.ts";
import { diffTrees, type ExecOptions, type ExecResult, type NodeDiff } from "./nspawn-node.ts";
import { reapSlots, type SlotPool, slotAddresses, slotFile, takeSlot } from "./net-slots.ts";
import { connectQmp, type Qmp } from "./qmp.ts";
import { HOST_KEY_ALIAS, VM_CACHE, vmImage, type VmImage, type VmImageOptions } from "./vm-image.ts";

const STATE_DIR = "/run/bashible-test-vms";
/** Each VM gets a /30 of 10.214.0.0/16 (scripts/lib/net-slots.ts). */
const NET: SlotPool = { stateDir: STATE_DIR, prefix: "10.214", owner: "vm-node" };
/** The network the VMs' taps are in. */
export const VM_NETWORK = `${NET.prefix}.0.0/16`;
const GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/** One VM boots at a time on the machine: boots are CPU-bound under emulation. */
const BOOT_LOCK = path.join(VM_CACHE, "boot.lock");
const PANIC = /Kernel panic - not syncing/;
const PANIC_END = /---\[ end Kernel panic[^\n]*/;

export interface VmOptions {
  /** The image (from vmImage()) or how to make it (default: VM_PACKAGES). */
  image?: VmImage | VmImageOptions;
  /** Hostname and machine name (default bv-<random>). */
  name?: string;
  /** Parent of the VM's temp dir (default os.tmpdir()). */
  parentDir?: string;
  /** vCPUs (default 2). */
  cpus?: number;
  /** Memory in MiB (default 1024). */
  memoryMiB?: number;
  /** Added to the kernel command line (after console, ip=, cgroup v2 and panic=0). */
  kernelArgs?: string[];
  /** A reset the guest makes itself starts QEMU again, as a machine reboots (default: stops). */
  restartOnReboot?: boolean;
  /** Kill QEMU once the console shows a kernel panic (default true: a halted guest spins a core). */
  killOnPanic?: boolean;
  /** Give up waiting for a boot (the boot lock included) after this long (default 300 s). */
  bootTimeoutMs?: number;
  /** Extra QEMU arguments. */
  qemuArgs?: string[];
}

/** Why QEMU last stopped. */
export type VmExit = "poweroff" | "reset" | "panic" | "killed" | "crashed";

export interface VmNode {
  name: string;
  /** The VM's temp dir: disk.qcow2, console.log, qemu.log, the QMP and ssh sockets. */
  dir: string;
  image: VmImage;
  /** The VM's own disk, a qcow2 overlay over image.disk. */
  disk: string;
  /** The guest's address (eth0). */
  address: string;
  /** The host's address on the VM's tap: what the guest dials to reach host services. */
  hostAddress: string;
  /** The host side tap device. */
  hostInterface: string;
  /** Boots to systemd ready so far (a reboot counts). */
  readonly boots: number;
  /** Seconds from QEMU's start to systemd ready, per boot. */
  readonly bootSeconds: number[];
  /** QEMU's pid (0 when not running). */
  readonly qemuPid: number;
  /** Why QEMU last stopped (undefined while it has not). */
  readonly lastExit: VmExit | undefined;
  /** The last kernel panic's console text, from "Kernel panic" to its end marker. */
  readonly panic: string | undefined;
  /** `systemctl is-system-running` after the last boot (running or degraded). */
  state: string;
  failedUnits: string[];
  /** The serial console, every boot appended. */
  consoleFile: string;
  console(): Promise<string>;
  /** Waits for `re` on the console of the current boot (or since `fromStart`); returns the line. */
  waitForConsole(re: RegExp, opts?: { timeoutMs?: number; fromStart?: boolean }): Promise<string>;
  exec(argv: string[], opts?: ExecOptions): Promise<ExecResult>;
  mustExec(argv: string[], opts?: ExecOptions): Promise<ExecResult>;
  /**
   * Starts a command inside over ssh and returns the ssh client. Killing it closes the session:
   * the command sees its output pipes close (SIGPIPE on its next write), not a signal.
   */
  spawn(argv: string[], opts?: { env?: Record<string, string>; cwd?: string }): ChildProcess;
  /** Copies a host file or directory (contents, modes) to `dest` inside. */
  copyIn(src: string, dest: string): Promise<void>;
  writeFile(dest: string, content: string | Buffer, mode?: number): Promise<void>;
  waitRunning(timeoutMs?: number): Promise<string>;
  /** Waits until the VM has booted `n` times (restartOnReboot), or throws when it stopped. */
  waitBoot(n: number, timeoutMs?: number): Promise<string>;
  /** Reboots the guest (systemctl reboot) and waits for the next boot to be ready. */
  reboot(timeoutMs?: number): Promise<void>;
  /** Pulls the plug: QEMU is killed at once (the network and dir stay until stop/dispose). */
  kill(): Promise<void>;
  /** What the VM's disk holds that the image does not (the VM must be stopped). */
  diff(): Promise<NodeDiff>;
  /** Clean poweroff (SIGKILL after timeoutMs), network gone; keeps dir and disk for diff(). */
  stop(timeoutMs?: number): Promise<void>;
  /** stop() and remove the temp dir. */
  dispose(): Promise<void>;
  /** QEMU runs, or has exited and `lastExit` is not yet known: false means lastExit says why. */
  running(): boolean;
  /** QEMU's resident memory in bytes (0 when not running). */
  rssBytes(): number;
  /** Runs a QMP command on the VM's QEMU (query-status, set_link, …). */
  qmp(command: string, args?: Record<string, unknown>): Promise<unknown>;
  /** ssh arguments that log in to the guest (for a person: `ssh ${args.join(" ")}`). */
  sshArgs(): string[];
}

interface VmState {
  owner: number;
  name: string;
  dir: string;
  tap: string;
  slot: number;
  qemuPid?: number;
  sshPid?: number;
}

const live = new Map<string, VmState>();

function sh(argv: string[]): { status: number; out: string } {
  const r = spawnSync(argv[0] as string, argv.slice(1), { encoding: "utf8" });
  return { status: r.status ?? 1, out: `${r.stdout ?? ""}${r.stderr ?? ""}`.trim() };
}

function must(argv: string[]): string {
  const r = sh(argv);
  if (r.status !== 0) throw new Error(`${argv.join(" ")} failed (${r.status}): ${r.out}`);
  return r.out;
}

/** Running and ours: its command line names the VM's dir (a reused pid is someone else's). */
function ours(pid: number | undefined, dir: string): boolean {
  if (!pid) return false;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    if (stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) === "Z") return false;
    return readFileSync(`/proc/${pid}/cmdline`, "utf8").includes(dir);
  } catch {
    return false;
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** Synchronous, best-effort teardown: usable from an exit handler and for stale VMs. */
function teardownSync(s: VmState, keepDir = false): void {
  for (const pid of [s.qemuPid, s.sshPid]) if (ours(pid, s.dir)) process.kill(pid as number, "SIGKILL");
  for (let i = 0; i < 200 && (ours(s.qemuPid, s.dir) || ours(s.sshPid, s.dir)); i++) spawnSync("sleep", ["0.05"]);
  s.qemuPid = undefined;
  s.sshPid = undefined;
  if (s.slot >= 0) {
    sh(["ip", "link", "delete", s.tap]);
    sh(["rm", "-f", slotFile(NET, s.slot)]);
    s.slot = -1;
  }
  if (keepDir) return;
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
      // A VM left running spins host cores until the next reap: tear down first, whoever else
      // listens (the nspawn nodes' handler) does its own part and ends the process.
      for (const s of [...live.values()]) teardownSync(s);
      if (process.listenerCount(sig) > 0) return;
      process.kill(process.pid, sig);
    });
  }
}

/** Tears down VMs whose owning process is gone (killed test runs). Never touches nspawn nodes. */
export async function reapStaleVms(): Promise<string[]> {
  const reaped: string[] = [];
  for (const f of await readdir(STATE_DIR).catch(() => [] as string[])) {
    if (!f.endsWith(".json")) continue;
    const s = JSON.parse(await readFile(path.join(STATE_DIR, f), "utf8").catch(() => "{}")) as VmState;
    if (!s.name || alive(s.owner)) continue;
    teardownSync(s);
    reaped.push(s.name);
  }
  await reapSlots(NET, alive);
  return reaped;
}

/** Single-quotes for the guest's shell (ssh hands the command line to it as one string). */
export const shq = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const seconds = (since: number) => Math.round((Date.now() - since) / 100) / 10;

/** True once host:port answers with an ssh banner. */
function sshBanner(host: string, timeoutMs: number): Promise<boolean> {
  return new Promise((resolve) => {
    const sock = connect({ host, port: 22 });
    const done = (ok: boolean) => {
      sock.destroy();
      clearTimeout(timer);
      resolve(ok);
    };
    const timer = setTimeout(() => done(false), timeoutMs);
    sock.once("data", (d: Buffer) => done(d.toString("latin1").startsWith("SSH-")));
    sock.once("error", () => done(false));
    sock.once("close", () => done(false));
  });
}

/** Boots a VM and waits until its systemd reports running or degraded. */
export async function bootVm(opts: VmOptions = {}): Promise<VmNode> {
  if (process.getuid?.() !== 0) throw new Error("vm-node: needs root (tap devices, loop mounts for diff)");
  installExitHandlers();
  await reapStaleVms();
  const image =
    opts.image && "disk" in opts.image ? opts.image : await vmImage((opts.image as VmImageOptions | undefined) ?? {});
  const id = randomBytes(3).toString("hex");
  const name = opts.name ?? `bv-${id}`;
  const bootTimeoutMs = opts.bootTimeoutMs ?? 300_000;
  const killOnPanic = opts.killOnPanic ?? true;
  const dir = await mkdtemp(path.join(opts.parentDir ?? os.tmpdir(), `bashible-vm-${name}-`));
  const slot = await takeSlot(NET, name);
  const s: VmState = { owner: process.pid, name, dir, tap: `bvt-${id}`, slot };
  live.set(name, s);
  await mkdir(STATE_DIR, { recursive: true });
  const writeState = () => writeFile(path.join(STATE_DIR, `${name}.json`), JSON.stringify(s));
  await writeState();

  const addr = slotAddresses(NET, slot);
  const disk = path.join(dir, "disk.qcow2");
  const consoleFile = path.join(dir, "console.log");
  const qemuLog = path.join(dir, "qemu.log");
  const qmpSocket = path.join(dir, "qmp.sock");
  const controlPath = path.join(dir, "ssh.sock");
  const machineId = randomBytes(16).toString("hex");
  const mac = `52:54:00:${id.slice(0, 2)}:${id.slice(2, 4)}:${id.slice(4, 6)}`;
  const kernelArgs = [
    "console=ttyS0",
    "net.ifnames=0",
    `ip=${addr.machine}::${addr.host}:255.255.255.252:${name}:eth0:off`,
    `systemd.hostname=${name}`,
    `systemd.machine_id=${machineId}`,
    "systemd.unified_cgroup_hierarchy=1",
    "panic=0",
    ...(opts.kernelArgs ?? []),
  ];
  const qemuArgs = [
    "-name",
    name,
    "-machine",
    "q35",
    "-accel",
    "tcg,thread=multi,tb-size=128",
    "-cpu",
    "max",
    "-smp",
    String(opts.cpus ?? 2),
    "-m",
    String(opts.memoryMiB ?? 1024),
    "-nodefaults",
    "-no-user-config",
    "-display",
    "none",
    "-no-reboot",
    "-kernel",
    image.kernel,
    "-initrd",
    image.initrd,
    "-append",
    kernelArgs.join(" "),
    "-drive",
    `file=${disk},format=qcow2,if=virtio,cache=unsafe`,
    "-netdev",
    `tap,id=net0,ifname=${s.tap},script=no,downscript=no`,
    "-device",
    `virtio-net-pci,netdev=net0,mac=${mac}`,
    "-device",
    "virtio-rng-pci",
    "-chardev",
    `file,id=console,path=${consoleFile},append=on`,
    "-serial",
    "chardev:console",
    "-qmp",
    `unix:${qmpSocket},server=on,wait=off`,
    ...(opts.qemuArgs ?? []),
  ];

  const sshArgs = (extra: string[] = []) => [
    "-F",
    "/dev/null",
    "-i",
    image.sshKey,
    "-o",
    "IdentitiesOnly=yes",
    "-o",
    "BatchMode=yes",
    "-o",
    `UserKnownHostsFile=${image.knownHosts}`,
    "-o",
    "GlobalKnownHostsFile=/dev/null",
    "-o",
    "StrictHostKeyChecking=yes",
    "-o",
    `HostKeyAlias=${HOST_KEY_ALIAS}`,
    "-o",
    `ControlPath=${controlPath}`,
    "-o",
    "ConnectTimeout=20",
    "-o",
    "ServerAliveInterval=10",
    "-o",
    "ServerAliveCountMax=6",
    "-o",
    "LogLevel=ERROR",
    ...extra,
    `root@${addr.machine}`,
  ];

  let child: ChildProcess | undefined;
  let qmp: Qmp | undefined;
  let master: ChildProcess | undefined;
  let exited: Promise<void> = Promise.resolve();
  let boots = 0;
  const bootSeconds: number[] = [];
  let lastExit: VmExit | undefined;
  let panic: string | undefined;
  let panicSeenAt = 0;
  let killedByHarness = false;
  let stopping = false;
  let rebootRequested = false;
  /** A boot after a reset, while it runs (and its failure, for waitBoot). */
  let rebooting: Promise<void> | undefined;
  let rebootError: Error | undefined;
  let watcher: NodeJS.Timeout | undefined;

  // The console, read as QEMU appends to it; bootStart is where the current boot's text begins.
  let consoleText = "";
  let consoleBytes = 0;
  let bootStart = 0;
  const decoder = new StringDecoder("utf8");
  let reading: Promise<string> = Promise.resolve("");
  const readConsole = (): Promise<string> => {
    reading = reading.then(async () => {
      const fh = await open(consoleFile, "r").catch(() => undefined);
      if (!fh) return consoleText;
      try {
        const { size } = await fh.stat();
        if (size > consoleBytes) {
          const buf = Buffer.alloc(size - consoleBytes);
          const { bytesRead } = await fh.read(buf, 0, buf.length, consoleBytes);
          consoleBytes += bytesRead;
          consoleText += decoder.write(buf.subarray(0, bytesRead));
        }
      } finally {
        await fh.close();
      }
      return consoleText;
    });
    return reading;
  };
  const consoleTail = async (lines = 40) =>
    (await readConsole()).slice(bootStart).trimEnd().split("\n").slice(-lines).join("\n");

  const running = () => child !== undefined && child.exitCode === null && child.signalCode === null;
  /** Between QEMU's exit and its classification (QMP's last events, the console's panic). */
  let accounting = false;

  /** Watches the console for a panic; kills QEMU once the panic's report is complete. */
  const watchConsole = async (final = false) => {
    if (panic !== undefined || (!running() && !final)) return;
    const text = (await readConsole()).slice(bootStart);
    const at = text.search(PANIC);
    if (at < 0) return;
    panicSeenAt ||= Date.now();
    const from = text.lastIndexOf("\n", at) + 1;
    const end = PANIC_END.exec(text.slice(at));
    // The end marker follows the report at once; if it never comes, 5 s is enough of a report.
    if (!end && !final && Date.now() - panicSeenAt < 5000) return;
    panic = end ? text.slice(from, at + end.index + end[0].length) : text.slice(from);
    if (killOnPanic) child?.kill("SIGKILL");
  };

  /** Why QEMU stopped, once it has: QMP's last SHUTDOWN event, or what the harness did. */
  const onExit = async (c: ChildProcess, q: () => Qmp | undefined) => {
    await new Promise<void>((r) => c.once("exit", () => r()));
    accounting = true;
    // QEMU's last events may still be in the socket when the process is reaped.
    const conn = q();
    if (conn) await Promise.race([conn.closed, sleep(2000)]);
    conn?.close();
    clearInterval(watcher);
    await watchConsole(true).catch(() => undefined);
    master?.kill("SIGKILL");
    master = undefined;
    s.qemuPid = undefined;
    s.sshPid = undefined;
    await writeState().catch(() => undefined);
    const reason = [...(conn?.events ?? [])].reverse().find((e) => e.event === "SHUTDOWN")?.data?.reason;
    if (panic !== undefined) lastExit = "panic";
    else if (reason === "guest-shutdown") lastExit = "poweroff";
    else if (reason === "guest-reset") lastExit = "reset";
    else if (killedByHarness) lastExit = "killed";
    else lastExit = "crashed";
    killedByHarness = false;
    accounting = false;
    if (lastExit === "reset" && (opts.restartOnReboot || rebootRequested) && !stopping) {
      rebootError = undefined;
      rebooting = launch(Date.now() + bootTimeoutMs)
        .catch((err: Error) => {
          rebootError = err;
        })
        .finally(() => {
          rebooting = undefined;
        });
    }
  };

  const fatal = async (what: string) => {
    if (panic !== undefined) throw new Error(`${name}: kernel panic during boot (${what}):\n${panic}`);
    if (!running()) {
      const log = (await readFile(qemuLog, "utf8").catch(() => "")).trim();
      throw new Error(
        `${name}: QEMU stopped (${lastExit ?? "exited"}) during boot (${what})${log ? `\nqemu: ${log}` : ""}\nconsole:\n${await consoleTail()}`,
      );
    }
  };

  /** The ssh master connection of this boot: every command after it skips the handshake. */
  const startMaster = async (deadline: number) => {
    for (;;) {
      await rm(controlPath, { force: true });
      const m = spawn("ssh", [...sshArgs(["-n", "-N", "-o", "ControlMaster=yes", "-o", "ControlPersist=no"])], {
        stdio: ["ignore", "ignore", "pipe"],
      });
      let err = "";
      m.stderr?.on("data", (d: Buffer) => (err += d));
      for (;;) {
        if (
          await stat(controlPath).then(
            () => true,
            () => false,
          )
        ) {
          master = m;
          s.sshPid = m.pid;
          await writeState();
          return;
        }
        if (m.exitCode !== null || m.signalCode !== null) break;
        await fatal("ssh login");
        if (Date.now() > deadline) {
          m.kill("SIGKILL");
          throw new Error(`${name}: no ssh login within the boot timeout: ${err.trim()}`);
        }
        await sleep(100);
      }
      await fatal("ssh login");
      if (Date.now() > deadline) throw new Error(`${name}: ssh login failed: ${err.trim()}`);
      await sleep(500);
    }
  };

  /** Starts QEMU (again, after a reset) and waits until the guest's systemd is ready. */
  async function launch(deadline: number): Promise<void> {
    await readConsole();
    bootStart = consoleText.length;
    panic = undefined;
    panicSeenAt = 0;
    const lock = await acquireLock(
      BOOT_LOCK,
      "the VM boot lock (VMs boot one at a time)",
      Math.max(1000, deadline - Date.now()),
    );
    try {
      const started = Date.now();
      await rm(qmpSocket, { force: true });
      const log = await open(qemuLog, "a");
      const c = spawn("qemu-system-x86_64", qemuArgs, { stdio: ["ignore", log.fd, log.fd] });
      const spawned = new Promise<void>((resolve, reject) => {
        c.once("spawn", () => resolve());
        c.once("error", (err) =>
          reject(new Error(`${name}: cannot start qemu-system-x86_64 (${err.message}): install qemu-system-x86`)),
        );
      });
      // Recorded before anything else is awaited: a teardown from now on kills it.
      s.qemuPid = c.pid;
      await log.close();
      await spawned;
      child = c;
      await writeState();
      let conn: Qmp | undefined;
      exited = onExit(c, () => conn);
      watcher = setInterval(() => void watchConsole().catch(() => undefined), 250);
      watcher.unref();
      while (!conn) {
        conn = await connectQmp(qmpSocket).catch(() => undefined);
        if (conn) break;
        await fatal("QEMU starting");
        if (Date.now() > deadline) throw new Error(`${name}: QEMU's QMP socket did not answer`);
        await sleep(50);
      }
      qmp = conn;
      while (!(await sshBanner(addr.machine, 3000))) {
        await fatal("waiting for sshd");
        if (Date.now() > deadline) throw new Error(`${name}: sshd did not answer within the boot timeout`);
        await sleep(250);
      }
      await startMaster(deadline);
      node.state = await node.waitRunning(Math.max(1000, deadline - Date.now()));
      node.failedUnits = [];
      if (node.state === "degraded") {
        const r = await node.exec(["systemctl", "list-units", "--failed", "--plain", "--no-legend"]);
        node.failedUnits = r.stdout
          .split("\n")
          .map((l) => l.trim().split(/\s+/)[0] ?? "")
          .filter(Boolean);
      }
      bootSeconds.push(seconds(started));
      boots++;
    } catch (err) {
      if (running()) {
        killedByHarness = true;
        child?.kill("SIGKILL");
        await exited;
      }
      (err as Error).message += `\nconsole (${consoleFile}):\n${await consoleTail()}`;
      throw err;
    } finally {
      await lock.release();
    }
  }

  const inside = (argv: string[], o: ExecOptions & { pipeStdin?: boolean } = {}) => {
    const env = Object.entries({ PATH: GUEST_PATH, HOME: "/root", LANG: "C.UTF-8", TERM: "dumb", ...o.env }).map(
      ([k, v]) => shq(`${k}=${v}`),
    );
    const remote = `cd ${shq(o.cwd ?? "/root")} && exec env -i ${env.join(" ")} ${argv.map(shq).join(" ")}`;
    const c = spawn("ssh", [...sshArgs(["-o", "ControlMaster=no"]), remote], {
      stdio: ["pipe", "pipe", "pipe"],
      timeout: o.timeoutMs,
      killSignal: "SIGKILL",
    });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    c.stdout?.on("data", (d: Buffer) => out.push(d));
    c.stderr?.on("data", (d: Buffer) => err.push(d));
    const done = new Promise<ExecResult>((resolve, reject) => {
      c.once("error", reject);
      c.once("close", (code, signal) =>
        resolve({
          exitCode: code ?? 128,
          stdout: Buffer.concat(out).toString("utf8"),
          stderr: Buffer.concat(err).toString("utf8") + (signal ? `\n(killed by ${signal})` : ""),
        }),
      );
    });
    c.stdin?.on("error", () => undefined);
    if (!o.pipeStdin) c.stdin?.end(o.input);
    return { child: c, done };
  };

  const node: VmNode = {
    name,
    dir,
    image,
    disk,
    address: addr.machine,
    hostAddress: addr.host,
    hostInterface: s.tap,
    get boots() {
      return boots;
    },
    bootSeconds,
    get qemuPid() {
      return running() ? (child?.pid ?? 0) : 0;
    },
    get lastExit() {
      return lastExit;
    },
    get panic() {
      return panic;
    },
    state: "",
    failedUnits: [],
    consoleFile,
    console: readConsole,
    async waitForConsole(re, o = {}) {
      const deadline = Date.now() + (o.timeoutMs ?? 120_000);
      const from = o.fromStart ? 0 : bootStart;
      for (;;) {
        const text = (await readConsole()).slice(from);
        const m = re.exec(text);
        if (m) {
          const start = text.lastIndexOf("\n", m.index) + 1;
          const end = text.indexOf("\n", m.index + m[0].length);
          return text.slice(start, end < 0 ? undefined : end).replace(/\r$/, "");
        }
        if (!running() && !rebooting) {
          // QEMU is gone: whatever it wrote is all there will be.
          await sleep(50);
          const last = (await readConsole()).slice(from);
          if (!re.test(last)) {
            throw new Error(
              `${name}: QEMU stopped (${lastExit}) before the console showed ${re}:\n${await consoleTail()}`,
            );
          }
          continue;
        }
        if (Date.now() > deadline) {
          throw new Error(`${name}: the console did not show ${re} within ${o.timeoutMs ?? 120_000} ms`);
        }
        await sleep(200);
      }
    },
    exec: (argv, o) => inside(argv, o).done,
    async mustExec(argv, o) {
      const r = await inside(argv, o).done;
      if (r.exitCode !== 0) {
        throw new Error(`${name}: ${argv.join(" ")} exited ${r.exitCode}:\n${(r.stderr || r.stdout).trim()}`);
      }
      return r;
    },
    spawn: (argv, o) => inside(argv, { ...o, pipeStdin: true }).child,
    copyIn: (src, dest) => copyInto(inside, name, src, dest),
    writeFile: (dest, content, mode) => writeInto(inside, name, dest, content, mode),
    async waitRunning(timeoutMs = bootTimeoutMs) {
      const until = Date.now() + timeoutMs;
      for (;;) {
        const r = await inside(["systemctl", "is-system-running", "--wait"], {
          timeoutMs: Math.max(1000, until - Date.now()),
        }).done;
        const st = r.stdout.trim();
        if (st === "running" || st === "degraded") return st;
        if (!running()) throw new Error(`${name}: QEMU stopped (${lastExit}) while waiting for systemd`);
        if (Date.now() > until) {
          throw new Error(`${name}: not booted after ${timeoutMs} ms (state '${st}' ${r.stderr.trim()})`);
        }
        await sleep(250);
      }
    },
    async waitBoot(n, timeoutMs = bootTimeoutMs) {
      const until = Date.now() + timeoutMs;
      for (;;) {
        if (boots >= n) return node.state;
        if (rebooting) {
          await rebooting;
          continue;
        }
        if (rebootError) throw rebootError;
        if (!running()) {
          // Between QEMU's exit and the handler that starts it again, nothing runs.
          await exited;
          if (rebooting) continue;
          if (boots < n) throw new Error(`${name}: stopped (${lastExit}) before boot ${n}`);
          continue;
        }
        if (Date.now() > until) throw new Error(`${name}: boot ${n} did not come within ${timeoutMs} ms`);
        await sleep(200);
      }
    },
    async reboot(timeoutMs = bootTimeoutMs) {
      if (!running()) throw new Error(`${name}: reboot() of a stopped VM`);
      const n = boots + 1;
      rebootRequested = true;
      try {
        // The session may end with the machine; its result does not matter, the next boot does.
        await inside(["systemctl", "reboot"], { timeoutMs: 30_000 }).done;
        await node.waitBoot(n, timeoutMs);
      } finally {
        rebootRequested = false;
      }
    },
    async kill() {
      if (running()) {
        killedByHarness = true;
        child?.kill("SIGKILL");
      }
      await exited;
    },
    async diff() {
      if (running() || rebooting) throw new Error(`${name}: diff() reads the disk: stop() the VM first`);
      return diffDisk(image.disk, disk, dir);
    },
    async stop(timeoutMs = 60_000) {
      stopping = true;
      await rebooting;
      if (running()) {
        const c = child as ChildProcess;
        const timer = setTimeout(() => {
          killedByHarness = true;
          c.kill("SIGKILL");
        }, timeoutMs);
        // A panicked guest answers nothing: only the plug is left.
        if (panic !== undefined) {
          killedByHarness = true;
          c.kill("SIGKILL");
        } else void inside(["systemctl", "poweroff"], { timeoutMs: Math.min(timeoutMs, 30_000) }).done;
        await exited;
        clearTimeout(timer);
      }
      await exited;
      teardownSync(s, true);
      await writeState();
    },
    async dispose() {
      await node.stop();
      teardownSync(s);
    },
    running: () => running() || accounting,
    rssBytes() {
      if (!running()) return 0;
      const status = (() => {
        try {
          return readFileSync(`/proc/${child?.pid}/status`, "utf8");
        } catch {
          return ""; // exited between the check and the read
        }
      })();
      const m = /VmRSS:\s+(\d+) kB/.exec(status);
      return m ? Number(m[1]) * 1024 : 0;
    },
    qmp(command, args) {
      if (!running() || !qmp) return Promise.reject(new Error(`${name}: qmp ${command}: QEMU is not running`));
      return qmp.execute(command, args);
    },
    sshArgs: () => sshArgs(),
  };

  try {
    must(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", image.disk, disk]);
    must(["ip", "tuntap", "add", "dev", s.tap, "mode", "tap"]);
    must(["ip", "addr", "add", `${addr.host}/30`, "dev", s.tap]);
    must(["ip", "link", "set", s.tap, "up"]);
    await launch(Date.now() + bootTimeoutMs);
    return node;
  } catch (err) {
    teardownSync(s);
    throw err;
  }
}

/**
 * What the VM's disk holds that the image does not: the overlay flattened to a raw copy
 * (qemu-img convert), both loop-mounted read-only (the copy's journal replayed first: a killed
 * or panicked guest leaves one), compared as trees (nspawn-node's diffTrees).
 */
async function diffDisk(base: string, overlay: string, dir: string): Promise<NodeDiff> {
  const work = await mkdtemp(path.join(dir, "diff-"));
  const flat = path.join(work, "disk.raw");
  const baseMnt = path.join(work, "base");
  const nodeMnt = path.join(work, "node");
  const mounted: string[] = [];
  try {
    await mkdir(baseMnt);
    await mkdir(nodeMnt);
    must(["qemu-img", "convert", "-O", "raw", overlay, flat]);
    must(["mount", "-o", "loop,ro,noload", base, baseMnt]);
    mounted.push(baseMnt);
    // Mounting writable replays the journal; the copy is thrown away after.
    must(["mount", "-o", "loop", flat, nodeMnt]);
    mounted.push(nodeMnt);
    return await diffTrees(baseMnt, nodeMnt);
  } finally {
    for (const m of mounted.reverse()) sh(["umount", m]);
    await rm(work, { recursive: true, force: true });
  }
}

/** A VM disposed when the tap test ends, whatever the outcome. */
export async function vmForTest(t: { teardown(fn: () => unknown): void }, opts: VmOptions = {}): Promise<VmNode> {
  const vm = await bootVm(opts);
  t.teardown(() => vm.dispose());
  return vm;
}

// By hand, for debugging: boots a VM and keeps it until Enter, then prints what it changed
// (Ctrl-C removes it at once).
//   node scripts/lib/vm-node.ts [kernel args...]
if (import.meta.main) {
  const image = await vmImage({ log: console.log });
  const vm = await bootVm({ image, kernelArgs: process.argv.slice(2) });
  console.log(
    [
      `vm ${vm.name}: ${vm.state} in ${vm.bootSeconds[0]} s${vm.failedUnits.length ? ` (failed: ${vm.failedUnits.join(", ")})` : ""}`,
      `  enter:    ssh ${vm.sshArgs().join(" ")}`,
      `  address:  ${vm.address} (the host is ${vm.hostAddress} on ${vm.hostInterface})`,
      `  console:  ${vm.consoleFile}`,
      `  QEMU RSS: ${Math.round(vm.rssBytes() / 1048576)} MiB`,
      "Enter stops it, prints what it changed and removes it; Ctrl-C removes it at once.",
    ].join("\n"),
  );
  await new Promise<void>((resolve) => process.stdin.once("data", () => resolve()));
  process.stdin.pause();
  await vm.stop();
  for (const e of (await vm.diff()).entries) console.log(`  ${e.kind.padEnd(7)} ${e.path}`);
  await vm.dispose();
  process.exit(0);
}
