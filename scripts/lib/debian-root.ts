// Cached Debian root filesystems made with `debootstrap --variant=minbase`, for the nspawn
// nodes (scripts/lib/nspawn-node.ts) and for sandbox roots that need a real distribution.
//
// A root is keyed by what goes into it (suite, architecture, mirror, package list): the same
// request reuses the same tree, a different package list gets its own. Roots live outside the
// repository, under $BASHIBLE_TEST_CACHE (default /var/cache/bashible-test)/debian-roots/. A
// build runs under an flock on the key and goes into a temporary directory that is renamed into
// place only when debootstrap succeeded, so a killed build never leaves a half root behind; its
// leftovers are removed by the next build of the same key.
//
// Roots are read-only by convention: nodes mount them as the lower layer of an overlayfs and
// write only to their own upper directory. Needs root and the Debian package `debootstrap`.
import { execFile, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdir, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";

const execFileP = promisify(execFile);

export const CACHE_ROOT = process.env.BASHIBLE_TEST_CACHE ?? "/var/cache/bashible-test";
export const ROOTS_DIR = path.join(CACHE_ROOT, "debian-roots");
export const SUITE = "bookworm";
/** Bumped when the way a root is made changes, so old trees are not reused. */
const RECIPE = 1;

/**
 * A node: systemd as PID 1 and what the agent, its steps and the bootstrap scripts use on a real
 * Debian node (the shadow tools, tar, chattr come with minbase; visudo from sudo,
 * update-ca-certificates from ca-certificates, curl for bootstrap.sh). libseccomp2 is runc's one
 * shared library; iptables and kmod are what a kubelet node's networking reaches for.
 */
export const NODE_PACKAGES: readonly string[] = [
  "systemd",
  "systemd-sysv",
  "dbus",
  "iproute2",
  "procps",
  "sudo",
  "ca-certificates",
  "curl",
  "kmod",
  "iptables",
  "libseccomp2",
];

/** Nothing beyond minbase: a fresh machine for prerequisite checks. */
export const MINIMAL_PACKAGES: readonly string[] = [];

export interface DebianRootOptions {
  /** Packages on top of minbase (default NODE_PACKAGES). */
  packages?: readonly string[];
  suite?: string;
  /** Default: the machine's own Debian mirror (see debianMirror). */
  mirror?: string;
  /** Progress lines (debootstrap's output is kept in the build log, not printed). */
  log?: (line: string) => void;
}

export interface DebianRoot {
  /** The root filesystem; treat as read-only. */
  dir: string;
  packages: readonly string[];
  /** True when this call built it. */
  built: boolean;
  /** Seconds the build took (0 when reused). */
  buildSeconds: number;
}

/**
 * The Debian mirror this machine installs from: $BASHIBLE_TEST_DEBIAN_MIRROR, else the first
 * `deb` URI for the main archive in /etc/apt/sources.list or /etc/apt/sources.list.d/*.sources
 * (deb822), else deb.debian.org.
 */
export async function debianMirror(): Promise<string> {
  if (process.env.BASHIBLE_TEST_DEBIAN_MIRROR) return process.env.BASHIBLE_TEST_DEBIAN_MIRROR;
  const candidates: string[] = [];
  const list = await readFile("/etc/apt/sources.list", "utf8").catch(() => "");
  for (const line of list.split("\n")) {
    const m = /^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)/.exec(line);
    if (m?.[1] && !/security/.test(m[1]) && !/-(updates|security|backports)$/.test(m[2] ?? "")) candidates.push(m[1]);
  }
  const dir = "/etc/apt/sources.list.d";
  for (const f of (await readdir(dir).catch(() => [] as string[])).filter((f) => f.endsWith(".sources")).sort()) {
    const text = await readFile(path.join(dir, f), "utf8").catch(() => "");
    for (const stanza of text.split(/\n\s*\n/)) {
      const field = (name: string) => new RegExp(`^${name}:\\s*(.+)$`, "mi").exec(stanza)?.[1]?.trim();
      const uris = field("URIs");
      if (!uris || !/\bdeb\b/.test(field("Types") ?? "")) continue;
      if (/security/.test(uris)) continue;
      candidates.push(...uris.split(/\s+/));
    }
  }
  return (candidates.find((u) => /^https?:\/\//.test(u)) ?? "http://deb.debian.org/debian").replace(/\/+$/, "");
}

async function arch(): Promise<string> {
  return (await execFileP("dpkg", ["--print-architecture"])).stdout.trim();
}

/** The directory a root with these parameters lives in (whether built or not). */
export function rootKey(p: { suite: string; arch: string; mirror: string; packages: readonly string[] }): string {
  const packages = [...new Set(p.packages)].sort();
  const hash = createHash("sha256")
    .update(JSON.stringify({ recipe: RECIPE, suite: p.suite, arch: p.arch, mirror: p.mirror, packages }))
    .digest("hex")
    .slice(0, 12);
  return `${p.suite}-${p.arch}-${packages.length ? "n" + packages.length : "minbase"}-${hash}`;
}

const isDir = (p: string) =>
  stat(p).then(
    (s) => s.isDirectory(),
    () => false,
  );

/** Returns the cached root for these options, building it first if needed. */
export async function debianRoot(opts: DebianRootOptions = {}): Promise<DebianRoot> {
  const packages = [...new Set(opts.packages ?? NODE_PACKAGES)].sort();
  const suite = opts.suite ?? SUITE;
  const mirror = opts.mirror ?? (await debianMirror());
  const key = rootKey({ suite, arch: await arch(), mirror, packages });
  const dir = path.join(ROOTS_DIR, key);
  if (await isDir(dir)) return { dir, packages, built: false, buildSeconds: 0 };
  if (process.getuid?.() !== 0) throw new Error("debian-root: building a root needs root");
  await mkdir(ROOTS_DIR, { recursive: true });
  const log = opts.log ?? (() => undefined);
  const started = Date.now();
  // The build itself runs in a shell holding an flock on the key: parallel callers wait for
  // one build instead of racing, and the lock dies with the process that held it.
  const tmp = `${dir}.tmp`;
  const buildLog = `${dir}.log`;
  const include = packages.length ? [`--include=${packages.join(",")}`] : [];
  const script = [
    "set -eu",
    'if [ -d "$FINAL" ]; then exit 0; fi',
    'rm -rf "$TMP"',
    // debootstrap's own cleanup on failure is partial; the rename below is what counts.
    `debootstrap --variant=minbase ${include.map((a) => `'${a}'`).join(" ")} "$SUITE" "$TMP" "$MIRROR" >"$LOG" 2>&1`,
    // Apt's downloaded .debs are 1/4 of the tree and no node needs them.
    'rm -rf "$TMP"/var/cache/apt/archives/*.deb',
    // Each node is its own machine: no machine id baked in (systemd makes a transient one).
    ': >"$TMP/etc/machine-id"',
    'mv -T "$TMP" "$FINAL"',
    "echo built",
  ].join("\n");
  log(`debian-root: building ${key} (${packages.join(", ") || "minbase only"}) from ${mirror}; log ${buildLog}`);
  const out = await new Promise<string>((resolve, reject) => {
    const child = spawn("flock", [`${dir}.lock`, "sh", "-c", script], {
      env: { ...process.env, FINAL: dir, TMP: tmp, LOG: buildLog, SUITE: suite, MIRROR: mirror },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d: Buffer) => (stdout += d));
    child.stderr.on("data", (d: Buffer) => (stderr += d));
    child.once("error", reject);
    child.once("close", async (code) => {
      if (code === 0) return resolve(stdout);
      const tail = await readFile(buildLog, "utf8").catch(() => "");
      reject(
        new Error(
          `debian-root: debootstrap of ${key} failed (exit ${code}): ${stderr.trim()}\n${tail.trim().split("\n").slice(-15).join("\n")}`,
        ),
      );
    });
  });
  const built = out.includes("built");
  const buildSeconds = built ? Math.round((Date.now() - started) / 100) / 10 : 0;
  if (built) {
    await writeFile(
      path.join(ROOTS_DIR, `${key}.json`),
      `${JSON.stringify({ suite, mirror, packages, recipe: RECIPE, buildSeconds, builtAt: new Date().toISOString() }, null, 2)}\n`,
    );
    log(`debian-root: ${key} built in ${buildSeconds} s`);
  }
  return { dir, packages, built, buildSeconds };
}

/** Removes every cached root (and leftovers of killed builds). */
export async function clearDebianRoots(): Promise<void> {
  await rm(ROOTS_DIR, { recursive: true, force: true });
}
