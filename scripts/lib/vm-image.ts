// What a test VM (scripts/lib/vm-node.ts) boots: Debian's cloud kernel, a busybox initramfs and a
// raw ext4 root disk made from a cached debootstrap root (scripts/lib/debian-root.ts), all cached
// under $BASHIBLE_TEST_CACHE (default /var/cache/bashible-test)/vm/ and keyed by their inputs:
//
//   vm/kernels/<kernel package>_<version>/   vmlinuz, config, modules/usr/lib/modules/<release>/
//   vm/ssh/id_ed25519[.pub]                   the key the harness logs in with (made once per cache)
//   vm/images/<key>/                          disk.raw (the base every VM's qcow2 overlay reads),
//                                             initrd.img, known_hosts, image.json
//
// The kernel is `linux-image-cloud-amd64`'s current dependency (the 6.1 cloud kernel on
// bookworm), fetched with `apt-get download` and unpacked with `dpkg-deb -x`: nothing is
// installed on the host. The disk is the debootstrap root with the kernel's modules (depmod run
// with the guest's own kmod), root's authorized key, an fstab, and systemd-networkd enabled with
// systemd-network-generator, which turns the `ip=` kernel argument into the guest's address; the
// root tree is never copied: an overlayfs over it is what `mkfs.ext4 -d` reads. The initramfs is
// busybox (busybox-static) loading the virtio disk driver and its dependencies, found from the
// guest's modules.dep, then switching to /dev/vda.
//
// A build runs under an flock on its key and lands in `<key>.tmp`, renamed into place when
// complete: a killed build leaves nothing the next run would take for an image. Needs root and
// the Debian packages qemu-utils (qemu-img, used by the nodes), e2fsprogs (mkfs.ext4 -d),
// busybox-static, openssh-client (ssh-keygen) and debootstrap.
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { chmod, copyFile, mkdir, readdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { CACHE_ROOT, debianRoot, type DebianRoot } from "./debian-root.ts";
import { withLock } from "./flock.ts";

const execFileP = promisify(execFile);

export const VM_CACHE = path.join(CACHE_ROOT, "vm");
/** Bumped when the way an image is made changes, so old images are not reused. */
const RECIPE = 2;
/** The name every image's host key is known under (all VMs of an image share it). */
export const HOST_KEY_ALIAS = "bashible-test-vm";

/**
 * A bare machine as a cloud image has it: systemd, udev (loads the NIC's and other modules),
 * kmod, an ssh server to be reached by, iproute2 and procps. No curl, sudo, nginx: what a node
 * needs beyond this, the agent installs (from a local mirror in tests, scripts/lib/debian-mirror.ts).
 */
export const VM_PACKAGES: readonly string[] = [
  "systemd",
  "systemd-sysv",
  "dbus",
  "udev",
  "kmod",
  "openssh-server",
  "iproute2",
  "procps",
];

/** The modules the initramfs loads to reach the root disk (ext4 is built into the cloud kernel). */
const INITRD_MODULES = ["virtio_pci", "virtio_blk"];

export interface VmImageOptions {
  /** Packages on top of minbase (default VM_PACKAGES; kmod, udev and openssh-server are added). */
  packages?: readonly string[];
  /** The root disk's size (a sparse file; default 8G). */
  diskSize?: string;
  log?: (line: string) => void;
}

export interface VmImage {
  key: string;
  dir: string;
  /** The raw root disk: read-only, the backing file of every VM's overlay. */
  disk: string;
  kernel: string;
  initrd: string;
  /** The kernel release (uname -r in the guest). */
  kernelRelease: string;
  /** known_hosts with the image's host key under HOST_KEY_ALIAS. */
  knownHosts: string;
  /** The private key root's authorized_keys in the image accepts. */
  sshKey: string;
  /** The debootstrap root the disk was made from. */
  root: DebianRoot;
  /** True when this call built the image (the root, kernel or key may have been cached). */
  built: boolean;
  /** What this call spent, in seconds: root (debootstrap), kernel (download + unpack), image. */
  seconds: { root: number; kernel: number; image: number; total: number };
}

async function run(cmd: string, args: string[], what: string, opts: { cwd?: string } = {}): Promise<string> {
  try {
    const r = await execFileP(cmd, args, { ...opts, maxBuffer: 64 << 20, env: { ...process.env, LANG: "C" } });
    return r.stdout;
  } catch (err) {
    const e = err as { stderr?: string; stdout?: string; message: string; code?: string };
    if (e.code === "ENOENT") throw new Error(`vm-image: ${what}: ${cmd} is not installed`);
    throw new Error(
      `vm-image: ${what} failed: ${cmd} ${args.join(" ")}: ${(e.stderr || e.stdout || e.message).trim()}`,
    );
  }
}

const exists = (p: string) =>
  stat(p).then(
    () => true,
    () => false,
  );

const isMountPoint = (p: string) =>
  execFileP("mountpoint", ["-q", p]).then(
    () => true,
    () => false,
  );

const seconds = (since: number) => Math.round((Date.now() - since) / 100) / 10;

export interface VmKernel {
  dir: string;
  package: string;
  version: string;
  release: string;
  vmlinuz: string;
  /** A tree holding usr/lib/modules/<release>/ (an overlay layer for the root). */
  modulesLayer: string;
  built: boolean;
}

/** The cloud kernel package linux-image-cloud-amd64 currently depends on, unpacked and cached. */
export async function vmKernel(log: (line: string) => void = () => undefined): Promise<VmKernel> {
  // One apt-cache call (each loads apt's whole cache: seconds on a loaded machine): the
  // metapackage's exact dependency names the kernel package and its version.
  const show = await run(
    "apt-cache",
    ["show", "--no-all-versions", "linux-image-cloud-amd64"],
    "finding the cloud kernel package",
  );
  const m = /^Depends:.*?\b(linux-image-[\w.+-]+) \(= ([^)\s]+)\)/m.exec(show);
  if (!m) {
    throw new Error(`vm-image: linux-image-cloud-amd64 names no kernel package (${show.trim()}); run apt-get update`);
  }
  const pkg = m[1] as string;
  const version = m[2] as string;
  const release = pkg.replace(/^linux-image-/, "");
  const dir = path.join(VM_CACHE, "kernels", `${pkg}_${version}`);
  const result = (built: boolean): VmKernel => ({
    dir,
    package: pkg,
    version,
    release,
    vmlinuz: path.join(dir, "vmlinuz"),
    modulesLayer: path.join(dir, "modules"),
    built,
  });
  if (await exists(path.join(dir, "vmlinuz"))) return result(false);
  await mkdir(path.dirname(dir), { recursive: true });
  return withLock(`${dir}.lock`, `the ${pkg} download lock`, async () => {
    if (await exists(path.join(dir, "vmlinuz"))) return result(false);
    log(`vm-image: fetching ${pkg} ${version}`);
    const tmp = `${dir}.tmp`;
    await rm(tmp, { recursive: true, force: true });
    await mkdir(tmp, { recursive: true, mode: 0o755 });
    // apt drops to _apt to download; let it write here.
    await chmod(tmp, 0o777);
    await run("apt-get", ["download", "-q", `${pkg}=${version}`], `downloading ${pkg}`, { cwd: tmp });
    await chmod(tmp, 0o755);
    const deb = (await readdir(tmp)).find((f) => f.endsWith(".deb"));
    if (!deb) throw new Error(`vm-image: apt-get download ${pkg} wrote no .deb`);
    const x = path.join(tmp, "x");
    await run("dpkg-deb", ["-x", path.join(tmp, deb), x], `unpacking ${deb}`);
    // The root is merged-/usr (/lib is a link to usr/lib): the modules go where it keeps them.
    await mkdir(path.join(tmp, "modules/usr/lib/modules"), { recursive: true });
    await rename(path.join(x, "lib/modules", release), path.join(tmp, "modules/usr/lib/modules", release));
    await rename(path.join(x, "boot", `vmlinuz-${release}`), path.join(tmp, "vmlinuz"));
    await rename(path.join(x, "boot", `config-${release}`), path.join(tmp, "config"));
    await rm(x, { recursive: true, force: true });
    await rm(path.join(tmp, deb));
    await rename(tmp, dir);
    return result(true);
  });
}

/** The harness's ssh key, made once per cache. */
export async function vmSshKey(): Promise<{ key: string; publicKey: string }> {
  const dir = path.join(VM_CACHE, "ssh");
  const key = path.join(dir, "id_ed25519");
  if (!(await exists(`${key}.pub`))) {
    await mkdir(dir, { recursive: true, mode: 0o700 });
    await withLock(path.join(dir, ".lock"), "the VM ssh key lock", async () => {
      if (await exists(`${key}.pub`)) return;
      await rm(key, { force: true });
      await run(
        "ssh-keygen",
        ["-q", "-t", "ed25519", "-N", "", "-C", "bashible-test-vm", "-f", key],
        "making the ssh key",
      );
    });
  }
  return { key, publicKey: (await readFile(`${key}.pub`, "utf8")).trim() };
}

/** Modules named in `wanted` and what they need, dependencies first (from modules.dep). */
export function moduleLoadOrder(modulesDep: string, wanted: string[]): string[] {
  const deps = new Map<string, string[]>();
  const byName = new Map<string, string>();
  const nameOf = (p: string) =>
    path
      .basename(p)
      .replace(/\.ko(\.\w+)?$/, "")
      .replace(/-/g, "_");
  for (const line of modulesDep.split("\n")) {
    const [mod, rest = ""] = line.split(":");
    if (!mod) continue;
    deps.set(mod, rest.trim().split(/\s+/).filter(Boolean));
    byName.set(nameOf(mod), mod);
  }
  const order: string[] = [];
  const visit = (mod: string) => {
    if (order.includes(mod)) return;
    for (const d of deps.get(mod) ?? []) visit(d);
    order.push(mod);
  };
  for (const w of wanted) {
    const mod = byName.get(w.replace(/-/g, "_"));
    if (!mod) throw new Error(`vm-image: module ${w} is not in modules.dep (built into the kernel?)`);
    visit(mod);
  }
  return order;
}

/** /init of the initramfs: load the disk driver, mount the root disk, hand over to systemd. */
const INIT = `#!/bin/busybox sh
# bashible test VM initramfs (scripts/lib/vm-image.ts).
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# Power off; should that fail, ending init panics the kernel, which the harness watches for.
fail() { echo "initramfs: $*"; poweroff -f; exit 1; }
for m in $(cat /modules/order); do insmod "/modules/$m" || fail "insmod $m failed"; done
i=0
while [ ! -b /dev/vda ]; do
  i=$((i + 1))
  [ "$i" -le 300 ] || fail "no /dev/vda after 30 s"
  sleep 0.1
done
mount -t ext4 -o rw /dev/vda /newroot || fail "cannot mount /dev/vda"
umount /proc /sys
mount --move /dev /newroot/dev
exec switch_root /newroot /sbin/init
`;

async function buildInitrd(modulesDir: string, out: string, work: string): Promise<void> {
  const dir = path.join(work, "initrd");
  for (const d of ["bin", "dev", "proc", "sys", "newroot", "modules"])
    await mkdir(path.join(dir, d), { recursive: true });
  await copyFile("/bin/busybox", path.join(dir, "bin/busybox")).catch((err: Error) => {
    throw new Error(`vm-image: /bin/busybox missing (${err.message}): install busybox-static`);
  });
  // ldd says so on stderr and exits 1 for a static binary.
  const ldd = await execFileP("ldd", ["/bin/busybox"]).then(
    (r) => r.stdout + r.stderr,
    (e: { stdout?: string; stderr?: string }) => `${e.stdout ?? ""}${e.stderr ?? ""}`,
  );
  if (!/not a dynamic executable|statically linked/.test(ldd)) {
    throw new Error("vm-image: /bin/busybox is linked dynamically; install busybox-static (not busybox)");
  }
  await chmod(path.join(dir, "bin/busybox"), 0o755);
  const order = moduleLoadOrder(await readFile(path.join(modulesDir, "modules.dep"), "utf8"), INITRD_MODULES);
  for (const m of order) await copyFile(path.join(modulesDir, m), path.join(dir, "modules", path.basename(m)));
  await writeFile(path.join(dir, "modules/order"), `${order.map((m) => path.basename(m)).join("\n")}\n`);
  await writeFile(path.join(dir, "init"), INIT, { mode: 0o755 });
  await run("mknod", ["-m", "600", path.join(dir, "dev/console"), "c", "5", "1"], "making /dev/console");
  await run(
    "sh",
    ["-c", 'cd "$1" && find . | /bin/busybox cpio -o -H newc 2>/dev/null | gzip -1 >"$2"', "sh", dir, out],
    "packing the initramfs",
  );
}

/** Returns the cached image for these options, building what is missing. */
export async function vmImage(opts: VmImageOptions = {}): Promise<VmImage> {
  const started = Date.now();
  const log = opts.log ?? (() => undefined);
  const packages = [...new Set([...(opts.packages ?? VM_PACKAGES), "kmod", "udev", "openssh-server"])].sort();
  const diskSize = opts.diskSize ?? "8G";
  const rootStarted = Date.now();
  const root = await debianRoot({ packages, log });
  const rootSeconds = root.built ? seconds(rootStarted) : 0;
  const kernelStarted = Date.now();
  const kernel = await vmKernel(log);
  const kernelSeconds = kernel.built ? seconds(kernelStarted) : 0;
  const ssh = await vmSshKey();
  const busybox =
    // biome-ignore lint/suspicious/noTemplateCurlyInString: a dpkg-query format
    (await run("dpkg-query", ["-W", "-f=${Version}", "busybox-static"], "checking busybox-static")).trim();
  const hash = createHash("sha256")
    .update(
      JSON.stringify({
        recipe: RECIPE,
        root: path.basename(root.dir),
        kernel: path.basename(kernel.dir),
        busybox,
        ssh: ssh.publicKey,
        diskSize,
      }),
    )
    .digest("hex")
    .slice(0, 12);
  const key = `${path.basename(root.dir).replace(/-[0-9a-f]+$/, "")}-${kernel.release}-${hash}`;
  const dir = path.join(VM_CACHE, "images", key);
  const image = (built: boolean, imageSeconds: number): VmImage => ({
    key,
    dir,
    disk: path.join(dir, "disk.raw"),
    kernel: kernel.vmlinuz,
    initrd: path.join(dir, "initrd.img"),
    kernelRelease: kernel.release,
    knownHosts: path.join(dir, "known_hosts"),
    sshKey: ssh.key,
    root,
    built,
    seconds: { root: rootSeconds, kernel: kernelSeconds, image: imageSeconds, total: seconds(started) },
  });
  if (await exists(path.join(dir, "image.json"))) return image(false, 0);
  await mkdir(path.dirname(dir), { recursive: true });
  return withLock(`${dir}.lock`, `the VM image ${key} build lock`, async () => {
    if (await exists(path.join(dir, "image.json"))) return image(false, 0);
    const imageStarted = Date.now();
    log(`vm-image: building ${key} (root ${path.basename(root.dir)}, kernel ${kernel.release})`);
    const tmp = `${dir}.tmp`;
    const merged = path.join(tmp, "merged");
    // A killed build may have left its overlay mounted: never remove files through it.
    if (await isMountPoint(merged)) await run("umount", ["-l", merged], "unmounting a killed build's overlay");
    await rm(tmp, { recursive: true, force: true });
    const upper = path.join(tmp, "upper");
    const work = path.join(tmp, "work");
    for (const d of [upper, work, merged]) await mkdir(d, { recursive: true });
    // The root and the kernel's modules, read-only; what the image adds lands in upper.
    await run(
      "mount",
      [
        "-t",
        "overlay",
        "overlay",
        "-o",
        `lowerdir=${kernel.modulesLayer}:${root.dir},upperdir=${upper},workdir=${work}`,
        merged,
      ],
      "mounting the image's overlay",
    );
    try {
      await run("chroot", [merged, "depmod", "-a", kernel.release], "depmod in the guest root");
      await mkdir(path.join(merged, "root/.ssh"), { recursive: true, mode: 0o700 });
      await writeFile(path.join(merged, "root/.ssh/authorized_keys"), `${ssh.publicKey}\n`, { mode: 0o600 });
      await writeFile(
        path.join(merged, "etc/fstab"),
        "# bashible test VM (scripts/lib/vm-image.ts): the root disk\n/dev/vda / ext4 rw,errors=remount-ro 0 0\n",
      );
      // The address comes from the kernel's ip= argument (each VM its own); networkd applies it.
      await run(
        "chroot",
        [merged, "systemctl", "enable", "systemd-networkd.service", "systemd-network-generator.service"],
        "enabling systemd-networkd in the guest root",
      );
      const hostKey = (await readFile(path.join(merged, "etc/ssh/ssh_host_ed25519_key.pub"), "utf8")).trim();
      await writeFile(path.join(tmp, "known_hosts"), `${HOST_KEY_ALIAS} ${hostKey.split(" ").slice(0, 2).join(" ")}\n`);
      await buildInitrd(path.join(merged, "usr/lib/modules", kernel.release), path.join(tmp, "initrd.img"), tmp);
      await run(
        "mkfs.ext4",
        ["-q", "-F", "-L", "bashible-vm", "-d", merged, path.join(tmp, "disk.raw"), diskSize],
        "making the root disk",
      );
    } finally {
      await run("umount", [merged], "unmounting the image's overlay");
    }
    await chmod(path.join(tmp, "disk.raw"), 0o444);
    for (const d of ["upper", "work", "merged", "initrd"])
      await rm(path.join(tmp, d), { recursive: true, force: true });
    const imageSeconds = seconds(imageStarted);
    await writeFile(
      path.join(tmp, "image.json"),
      `${JSON.stringify(
        {
          root: root.dir,
          packages,
          kernel: { package: kernel.package, version: kernel.version, release: kernel.release },
          busybox,
          diskSize,
          recipe: RECIPE,
          imageSeconds,
          builtAt: new Date().toISOString(),
        },
        null,
        2,
      )}\n`,
    );
    await rename(tmp, dir);
    log(`vm-image: ${key} built in ${imageSeconds} s`);
    return image(true, imageSeconds);
  });
}
