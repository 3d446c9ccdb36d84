// A local Debian package repository standing in for the distribution's mirror: nodes (nspawn
// nodes, VMs) install packages with their own apt-get from it, and nothing leaves the machine.
//
// `localDebianRepo({ packages })` resolves the list with all its dependencies against the host's
// apt metadata (bookworm, as the nodes are) as apt would install them on an empty machine,
// fetches each .deb once with `apt-get download` (apt checks its hash), and builds a flat
// repository of them: `Packages`, `Packages.gz` (dpkg-scanpackages, from dpkg-dev) and an
// unsigned `Release` with their hashes. `serveRepo(dir, address)` serves it over HTTP on a host
// address a node reaches (an nspawn node's or a VM's `hostAddress`); the node's sources line is
// `deb [trusted=yes] http://ADDR:PORT/ ./` (`sourcesLine`).
//
// Cached under $BASHIBLE_TEST_CACHE (default /var/cache/bashible-test)/apt/:
//   debs/<name>_<version>_<arch>.deb   every package fetched, shared by all lists
//   resolved/<hash>.json               a list resolved (keyed by the list and the host's lists)
//   repos/<hash>/                      a repository (keyed by the exact name=version set)
// `apt-get update` on the host changes the key of its lists, so the next call resolves again
// and fetches what moved. Needs root for nothing but writing the cache; needs apt and dpkg-dev.
//
// `buildDeb` and `writeRepoIndex` are the same pieces for a repository of packages a test makes
// itself (test/lib/chroot-root.ts).
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { chown, link, mkdir, readdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import path from "node:path";
import { promisify } from "node:util";
import { gzipSync } from "node:zlib";
import { CACHE_ROOT } from "./debian-root.ts";
import { withLock } from "./flock.ts";

const execFileP = promisify(execFile);
const run = (cmd: string, args: string[], opts: { cwd?: string } = {}) =>
  execFileP(cmd, args, { ...opts, maxBuffer: 64 << 20, env: { ...process.env, LANG: "C" } });

export const APT_CACHE = path.join(CACHE_ROOT, "apt");
/** Bumped when the way a repository is made changes. */
const RECIPE = 1;

/**
 * What Deckhouse's mandatory-packages step installs on Debian: curl, jq, socat, conntrack, the
 * iptables and nftables tools, e2fsprogs, growpart (cloud-guest-utils), lsblk (util-linux),
 * virt-what, netcat, ca-certificates, kmod, sudo, procps, iproute2, and nginx with its stream
 * module for the kubernetes-api-proxy.
 */
export const MANDATORY_PACKAGES: readonly string[] = [
  "curl",
  "jq",
  "socat",
  "conntrack",
  "iptables",
  "nftables",
  "e2fsprogs",
  "cloud-guest-utils",
  "util-linux",
  "virt-what",
  "netcat-openbsd",
  "ca-certificates",
  "kmod",
  "sudo",
  "nginx-light",
  "libnginx-mod-stream",
  "procps",
  "iproute2",
];

export interface ResolvedPackage {
  name: string;
  version: string;
  arch: string;
}

export interface LocalRepo {
  /** The repository: Packages, Packages.gz, Release and the .debs. Read-only by convention. */
  dir: string;
  /** What was asked for. */
  requested: readonly string[];
  /** Everything in it: the requested packages and their dependencies. */
  packages: ResolvedPackage[];
  /** Packages this call fetched (0 when all were cached). */
  downloaded: number;
  seconds: number;
}

export interface LocalRepoOptions {
  /** Default MANDATORY_PACKAGES. */
  packages?: readonly string[];
  log?: (line: string) => void;
}

/** apt-get download's file name: the epoch's colon is escaped. */
const debFile = (p: ResolvedPackage) => `${p.name}_${p.version.replace(/:/g, "%3a")}_${p.arch}.deb`;

const hash = (v: unknown) => createHash("sha256").update(JSON.stringify(v)).digest("hex").slice(0, 16);

const exists = (p: string) =>
  stat(p).then(
    () => true,
    () => false,
  );

/** The host's package lists as a key: names, sizes and times of every Packages index. */
async function listsKey(): Promise<string> {
  const dir = "/var/lib/apt/lists";
  const files = (await readdir(dir).catch(() => [] as string[])).filter((f) => f.includes("_Packages")).sort();
  if (!files.length) throw new Error("debian-mirror: the host has no apt package lists; run apt-get update");
  const stats = await Promise.all(
    files.map(async (f) => {
      const s = await stat(path.join(dir, f));
      return [f, s.size, s.mtimeMs];
    }),
  );
  return hash(stats);
}

/**
 * The packages apt would install for `packages` on a machine with nothing installed (an empty
 * dpkg status), Recommends left out: the request with its whole dependency closure.
 */
export async function resolvePackages(packages: readonly string[]): Promise<ResolvedPackage[]> {
  const args = [
    "-s",
    "-q",
    "-o",
    "Dir::State::Status=/dev/null",
    "-o",
    "Debug::NoLocking=1",
    "install",
    "--no-install-recommends",
    ...packages,
  ];
  let stdout: string;
  try {
    ({ stdout } = await run("apt-get", args));
  } catch (err) {
    const e = err as { stderr?: string; stdout?: string; message: string };
    throw new Error(
      `debian-mirror: apt-get cannot resolve ${packages.join(" ")} against the host's package lists: ${(e.stderr || e.stdout || e.message).trim()}\n(check the names; run apt-get update if the lists are old)`,
    );
  }
  const out: ResolvedPackage[] = [];
  for (const line of stdout.split("\n")) {
    // Inst libc6 (2.36-9+deb12u14 Debian:12.15/oldstable [amd64])
    const m = /^Inst (\S+) \((\S+) .*\[(\S+)\]\)/.exec(line);
    if (m) out.push({ name: (m[1] as string).replace(/:.*$/, ""), version: m[2] as string, arch: m[3] as string });
  }
  if (!out.length) throw new Error(`debian-mirror: apt-get resolved nothing for ${packages.join(" ")}:\n${stdout}`);
  return out.sort((a, b) => a.name.localeCompare(b.name));
}

/** Returns the cached repository for these packages, fetching and indexing what is missing. */
export async function localDebianRepo(opts: LocalRepoOptions = {}): Promise<LocalRepo> {
  const started = Date.now();
  const requested = [...new Set(opts.packages ?? MANDATORY_PACKAGES)].sort();
  const log = opts.log ?? (() => undefined);
  const debs = path.join(APT_CACHE, "debs");
  const resolvedDir = path.join(APT_CACHE, "resolved");
  const repos = path.join(APT_CACHE, "repos");
  for (const d of [debs, resolvedDir, repos]) await mkdir(d, { recursive: true });

  // Resolving runs apt's solver over an empty status (seconds on a loaded machine): once per
  // list and state of the host's lists.
  const resolvedFile = path.join(resolvedDir, `${hash({ RECIPE, requested, lists: await listsKey() })}.json`);
  let packages = JSON.parse(await readFile(resolvedFile, "utf8").catch(() => "null")) as ResolvedPackage[] | null;
  if (!packages) {
    packages = await resolvePackages(requested);
    await writeFile(`${resolvedFile}.tmp`, JSON.stringify(packages));
    await rename(`${resolvedFile}.tmp`, resolvedFile);
  }
  const pkgs = packages;
  const dir = path.join(repos, hash({ RECIPE, packages: pkgs }));
  let downloaded = 0;
  if (!(await exists(path.join(dir, "Release")))) {
    await withLock(path.join(APT_CACHE, ".lock"), "the local Debian repository lock", async () => {
      if (await exists(path.join(dir, "Release"))) return;
      const missing: ResolvedPackage[] = [];
      for (const p of pkgs) if (!(await exists(path.join(debs, debFile(p))))) missing.push(p);
      if (missing.length) {
        log(`debian-mirror: fetching ${missing.length} of ${pkgs.length} packages with apt-get download`);
        downloaded = await download(missing, debs);
      }
      const tmp = `${dir}.tmp`;
      await rm(tmp, { recursive: true, force: true });
      await mkdir(tmp);
      for (const p of pkgs) await link(path.join(debs, debFile(p)), path.join(tmp, debFile(p)));
      await writeRepoIndex(tmp);
      await rename(tmp, dir);
    });
  }
  const seconds = Math.round((Date.now() - started) / 100) / 10;
  return { dir, requested, packages: pkgs, downloaded, seconds };
}

/** `apt-get download` of exact versions into a scratch dir, then each file renamed into `debs`. */
async function download(packages: ResolvedPackage[], debs: string): Promise<number> {
  const tmp = path.join(debs, `.download-${process.pid}`);
  await rm(tmp, { recursive: true, force: true });
  await mkdir(tmp);
  // apt drops to _apt to download; it needs a directory that user may write.
  const aptUser = (await readFile("/etc/passwd", "utf8")).split("\n").find((l) => l.startsWith("_apt:"));
  if (aptUser) await chown(tmp, Number(aptUser.split(":")[2]), 0);
  try {
    await run("apt-get", ["download", "-q", ...packages.map((p) => `${p.name}=${p.version}`)], { cwd: tmp });
  } catch (err) {
    const e = err as { stderr?: string; message: string };
    await rm(tmp, { recursive: true, force: true });
    throw new Error(
      `debian-mirror: apt-get download failed: ${(e.stderr || e.message).trim()}\n(the host's Debian mirror must be reachable; see /etc/apt/sources.list)`,
    );
  }
  for (const p of packages) {
    const f = debFile(p);
    await rename(path.join(tmp, f), path.join(debs, f)).catch((err: Error) => {
      throw new Error(`debian-mirror: apt-get download did not write ${f}: ${err.message}`);
    });
  }
  await rm(tmp, { recursive: true, force: true });
  return packages.length;
}

/**
 * Indexes the .debs in `dir` as a flat repository: Packages and Packages.gz (dpkg-scanpackages)
 * and an unsigned Release with their sizes and hashes, so `deb [trusted=yes] URL ./` reads it
 * without warnings.
 */
export async function writeRepoIndex(dir: string): Promise<void> {
  let index: string;
  try {
    ({ stdout: index } = await run("dpkg-scanpackages", ["--multiversion", "."], { cwd: dir }));
  } catch (err) {
    throw new Error(
      `debian-mirror: dpkg-scanpackages failed in ${dir}: ${(err as Error).message} (it comes with dpkg-dev)`,
    );
  }
  const files: [string, Buffer][] = [
    ["Packages", Buffer.from(index)],
    ["Packages.gz", gzipSync(index)],
  ];
  const sums = (algo: string) =>
    files.map(([name, body]) => ` ${createHash(algo).update(body).digest("hex")} ${body.length} ${name}`).join("\n");
  const release = [
    "Origin: bashible-test",
    "Label: bashible-test local mirror",
    `Date: ${new Date().toUTCString()}`,
    "MD5Sum:",
    sums("md5"),
    "SHA256:",
    sums("sha256"),
    "",
  ].join("\n");
  for (const [name, body] of files) await writeFile(path.join(dir, name), body);
  await writeFile(path.join(dir, "Release"), release);
}

export interface DebSpec {
  name: string;
  version: string;
  /** Files by absolute path inside the package. */
  files: Record<string, string>;
  architecture?: string;
  description?: string;
}

/** Builds a small .deb (dpkg-deb) into `outDir`; returns its path. */
export async function buildDeb(spec: DebSpec, outDir: string): Promise<string> {
  const arch = spec.architecture ?? "all";
  const work = path.join(outDir, `.build-${spec.name}-${process.pid}`);
  await rm(work, { recursive: true, force: true });
  try {
    await mkdir(path.join(work, "DEBIAN"), { recursive: true });
    await writeFile(
      path.join(work, "DEBIAN/control"),
      `Package: ${spec.name}\nVersion: ${spec.version}\nArchitecture: ${arch}\nMaintainer: test <test@example.com>\nDescription: ${spec.description ?? "test package"}\n`,
    );
    for (const [p, content] of Object.entries(spec.files)) {
      const dest = path.join(work, p);
      await mkdir(path.dirname(dest), { recursive: true });
      await writeFile(dest, content);
    }
    const deb = path.join(outDir, `${spec.name}_${spec.version}_${arch}.deb`);
    await run("dpkg-deb", ["--root-owner-group", "--build", work, deb]);
    return deb;
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}

export interface RepoServer {
  /** http://ADDRESS:PORT/ */
  url: string;
  address: string;
  port: number;
  /** The apt sources line for this repository. */
  sourcesLine: string;
  /** Paths served with 200 so far, in order (`/jq_1.6-2.1+deb12u3_amd64.deb`). */
  served: string[];
  close(): Promise<void>;
}

/**
 * Serves `dir` read-only over HTTP on `address` (a host address the node reaches; port 0 picks
 * one). Only files directly in the repository are served; anything else is a 404.
 */
export async function serveRepo(dir: string, address: string, port = 0): Promise<RepoServer> {
  const served: string[] = [];
  const server: Server = createServer((req, res) => {
    void (async () => {
      const name = decodeURIComponent(new URL(req.url ?? "/", "http://x").pathname).replace(/^\/+/, "");
      // A flat repository: one level, no dot files, no way out of dir.
      if (!name || name.includes("/") || name.startsWith(".") || (req.method !== "GET" && req.method !== "HEAD")) {
        res.writeHead(404).end();
        return;
      }
      const file = path.join(dir, name);
      const st = await stat(file).catch(() => undefined);
      if (!st?.isFile()) {
        res.writeHead(404).end();
        return;
      }
      res.writeHead(200, {
        "content-type": "application/octet-stream",
        "content-length": st.size,
        "last-modified": st.mtime.toUTCString(),
      });
      served.push(`/${name}`);
      if (req.method === "HEAD") res.end();
      else createReadStream(file).pipe(res);
    })().catch((err: Error) => {
      if (!res.headersSent) res.writeHead(500);
      res.end(String(err.message));
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", (err) =>
      reject(new Error(`debian-mirror: cannot listen on ${address}:${port}: ${err.message}`)),
    );
    server.listen(port, address, () => resolve());
  });
  const a = server.address();
  if (!a || typeof a === "string") throw new Error("debian-mirror: the server has no address");
  const host = address.includes(":") ? `[${address}]` : address;
  const url = `http://${host}:${a.port}/`;
  return {
    url,
    address,
    port: a.port,
    sourcesLine: `deb [trusted=yes] ${url} ./`,
    served,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

// By hand: node scripts/lib/debian-mirror.ts [--serve ADDRESS] [PACKAGE...]
if (import.meta.main) {
  const args = process.argv.slice(2);
  const serveAt = args.indexOf("--serve");
  const address = serveAt >= 0 ? args.splice(serveAt, 2)[1] : undefined;
  const repo = await localDebianRepo({ packages: args.length ? args : undefined, log: console.log });
  console.log(`${repo.dir}: ${repo.packages.length} packages (${repo.downloaded} fetched) in ${repo.seconds} s`);
  if (address) {
    const server = await serveRepo(repo.dir, address);
    console.log(`serving: ${server.sourcesLine}\nCtrl-C stops.`);
    await new Promise<void>((resolve) => process.once("SIGINT", () => resolve()));
    await server.close();
  }
}
