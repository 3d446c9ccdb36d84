// A containerd of its own on this machine, to run images as a node's container runtime does:
// Debian's containerd and runc, with their own root, state and socket under a directory, in a
// mount namespace of their own (the containers' root filesystems are mounted there, so a killed
// test leaves no mount behind on the machine), the CRI plugin off (ctr talks to it directly).
// Nothing of the machine's own containerd, if it has one, is used or touched. Needs root.
import { type ChildProcess, execFile, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, open, writeFile } from "node:fs/promises";
import { connect } from "node:net";
import path from "node:path";
import { promisify } from "node:util";
import { readImageLayout } from "./oci-layout.ts";
import { until } from "./until.ts";

const execFileP = promisify(execFile);
const NAMESPACE = "bashible";

/** The capabilities containerd's default spec grants; dropped, as `capabilities: {drop: [ALL]}` does. */
const DEFAULT_CAPS = [
  "CAP_CHOWN",
  "CAP_DAC_OVERRIDE",
  "CAP_FSETID",
  "CAP_FOWNER",
  "CAP_MKNOD",
  "CAP_NET_RAW",
  "CAP_SETGID",
  "CAP_SETUID",
  "CAP_SETFCAP",
  "CAP_SETPCAP",
  "CAP_NET_BIND_SERVICE",
  "CAP_SYS_CHROOT",
  "CAP_KILL",
  "CAP_AUDIT_WRITE",
];

export interface RunOptions {
  /** Container id (also the task's). */
  id: string;
  image: string;
  /** Appended to the image's Entrypoint, as a Pod's `args` are. */
  args: string[];
  /** Read-only bind mounts, host path → container path. */
  mounts?: { src: string; dst: string }[];
  /** The host's network namespace (a static pod with hostNetwork). */
  netHost?: boolean;
  /** stdout and stderr of the container go to this file (appended). */
  logFile: string;
}

export interface HostContainerd {
  socket: string;
  /** Imports an OCI image layout directory; returns the image's name (`<name>:<tag>`). */
  importLayout(dir: string, name: string): Promise<string>;
  /**
   * Starts a container as a Pod with `readOnlyRootFilesystem`, `capabilities: {drop: [ALL]}` and
   * `allowPrivilegeEscalation: false` runs, as the image's user. The returned process is `ctr
   * run`, attached to the task: it exits when the container does.
   */
  run(o: RunOptions): Promise<ChildProcess>;
  /** SIGTERM to the container's process; SIGKILL after graceMs; then the container is removed. */
  stopContainer(id: string, graceMs?: number): Promise<void>;
  log(): string;
  stop(): Promise<void>;
}

export async function startHostContainerd(dir: string): Promise<HostContainerd> {
  if (process.getuid?.() !== 0) throw new Error("containerd-host: needs root");
  await mkdir(dir, { recursive: true });
  const socket = path.join(dir, "containerd.sock");
  const config = path.join(dir, "config.toml");
  await writeFile(
    config,
    [
      "version = 2",
      `root = "${path.join(dir, "root")}"`,
      `state = "${path.join(dir, "state")}"`,
      'disabled_plugins = ["io.containerd.grpc.v1.cri"]',
      "[grpc]",
      `  address = "${socket}"`,
      "",
    ].join("\n"),
  );
  let log = "";
  const child = spawn("unshare", ["--mount", "--propagation", "private", "containerd", "--config", config], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  for (const s of [child.stdout, child.stderr])
    s.on("data", (c: Buffer) => (log = (log + c.toString()).slice(-64_000)));
  const exited = new Promise<void>((r) => child.once("exit", () => r()));
  await until(
    `containerd on ${socket}`,
    async () => {
      if (child.exitCode !== null) throw new Error(`containerd exited (${child.exitCode}): ${log.slice(-3000)}`);
      return (
        existsSync(socket) &&
        (await new Promise<boolean>((r) => {
          const c = connect(socket, () => {
            c.destroy();
            r(true);
          });
          c.on("error", () => r(false));
        }))
      );
    },
    30_000,
    100,
  ).catch((err: Error) => {
    child.kill("SIGKILL");
    throw err;
  });
  const ctr = async (args: string[], input?: string) => {
    try {
      return (await execFileP("ctr", ["--address", socket, "--namespace", NAMESPACE, ...args], { maxBuffer: 16 << 20 }))
        .stdout;
    } catch (err) {
      const e = err as { stderr?: string; message: string };
      throw new Error(`ctr ${args.join(" ")}${input ? ` (${input})` : ""}: ${e.stderr?.trim() || e.message}`);
    }
  };
  const entrypoints = new Map<string, string[]>();

  return {
    socket,
    async importLayout(dir, name) {
      const image = await readImageLayout(dir);
      if (!image.tag) throw new Error(`${dir}: the layout's index names no tag`);
      // ctr imports archives: the layout directory as one tar stream.
      await new Promise<void>((resolve, reject) => {
        const tar = spawn("tar", ["-C", dir, "-cf", "-", "."], { stdio: ["ignore", "pipe", "inherit"] });
        const imp = spawn(
          "ctr",
          ["--address", socket, "--namespace", NAMESPACE, "images", "import", "--base-name", name, "-"],
          { stdio: ["pipe", "ignore", "pipe"] },
        );
        let err = "";
        imp.stderr.on("data", (d: Buffer) => (err += d));
        // ctr may exit once it has read the last entry, before tar's end-of-archive padding is
        // written: that write fails with EPIPE, and ctr's exit code, not the pipe, decides.
        imp.stdin.on("error", () => undefined);
        tar.stdout.pipe(imp.stdin);
        imp.once("close", (code) => (code === 0 ? resolve() : reject(new Error(`ctr images import ${dir}: ${err}`))));
      });
      const config = JSON.parse((await image.blob(image.blobs[0]?.digest ?? "")).toString()) as {
        config?: { Entrypoint?: string[] };
      };
      const ref = `${name}:${image.tag}`;
      entrypoints.set(ref, config.config?.Entrypoint ?? []);
      return ref;
    },
    async run(o) {
      const entrypoint = entrypoints.get(o.image);
      if (!entrypoint) throw new Error(`containerd-host: ${o.image} was not imported here`);
      const fd = await open(o.logFile, "a");
      // `ctr run IMAGE ID ARGS` replaces the whole command line; a kubelet keeps the image's
      // Entrypoint and replaces only Cmd with the Pod's args. Do what the kubelet does.
      const proc = spawn(
        "ctr",
        [
          "--address",
          socket,
          "--namespace",
          NAMESPACE,
          "run",
          // runc's own state is machine-wide (/run/containerd/runc/<namespace>) unless told:
          // two of these containerds running a container of the same id (two e2e worlds side
          // by side) would meet there ("container with given ID already exists").
          "--runc-root",
          path.join(dir, "runc"),
          "--read-only",
          ...DEFAULT_CAPS.flatMap((c) => ["--cap-drop", c]),
          ...(o.netHost ? ["--net-host"] : []),
          ...(o.mounts ?? []).flatMap((m) => ["--mount", `type=bind,src=${m.src},dst=${m.dst},options=rbind:ro`]),
          o.image,
          o.id,
          ...entrypoint,
          ...o.args,
        ],
        { stdio: ["ignore", fd.fd, fd.fd] },
      );
      await fd.close();
      return proc;
    },
    async stopContainer(id, graceMs = 10_000) {
      const running = async () => (await ctr(["tasks", "ls", "-q"])).split("\n").includes(id);
      if (await running().catch(() => false)) {
        await ctr(["tasks", "kill", "--signal", "SIGTERM", id]).catch(() => undefined);
        const gone = await until(`container ${id} to stop`, async () => !(await running()), graceMs, 100).catch(
          () => false,
        );
        if (!gone) await ctr(["tasks", "kill", "--signal", "SIGKILL", id]).catch(() => undefined);
        await until(`container ${id} killed`, async () => !(await running()), 10_000, 100).catch(() => undefined);
      }
      await ctr(["tasks", "delete", id]).catch(() => undefined);
      await ctr(["containers", "delete", id]).catch(() => undefined);
    },
    log: () => log,
    async stop() {
      if (child.exitCode === null) child.kill("SIGTERM");
      await exited;
    },
  };
}
