// RegistryPackages (007_fetch_registry_packages): install, upgrade and remove registry packages
// (OCI images whose last layer holds `install`, `uninstall` and payload) so that
// /var/cache/registrypackages/<pkg>/digest matches the bundle.
//
// The digest names the package's image manifest, as in Deckhouse. The registry-packages proxy
// streams the last layer and sends the manifest beside it (header X-Package-Manifest); the node
// verifies the chain: the manifest's bytes hash to the digest asked for, and the layer's bytes
// hash to the digest the manifest names. Nothing unverified is ever renamed into place.
//
// Only packages this agent installed (marked `installed-by` in their store directory) are ever
// uninstalled; packages another tool put there (Deckhouse's own bashible, say) are left alone.
// A package's scripts run only from directories the agent created, root-owned, reached without
// links.
//
// Package contract (docs/steps.md): `install` runs with cwd = the unpacked layer and env
// D8_ROOT (the root prefix: "" on a real node), PACKAGE_NAME, PACKAGE_DIGEST, PACKAGE_DIR;
// `uninstall` runs with cwd = the store directory and the same env. Both must be idempotent.
import { createHash } from "node:crypto";
import type { HTTPError, RequestError } from "got";
import type { RegistryPackageRef } from "../bundles/types.ts";
import { PATHS } from "../bundles/paths.ts";
import { DIGEST } from "../bundles/rules.ts";
import { RefusedError } from "../lib/errors.ts";
import type { Host } from "../host/host.ts";
import { planDir } from "../host/file-plan.ts";
import type { PackageChange, Primitive, Step, StepContext } from "./types.ts";

export const STORE = PATHS.packageStore;
export const DOWNLOADS = PATHS.packageDownloads;
/** Written in a package's store directory when this agent installed it. */
export const OWNER_FILE = "installed-by";
const OWNER = "bashible\n";
export const MANIFEST_HEADER = "x-package-manifest";

/** Fetch policy; tests and benchmarks shorten the timeouts. One pass over the endpoints per attempt. */
export const fetchPolicy = {
  /** Downloads at once. */
  concurrency: 4,
  connectTimeoutMs: 10_000,
  /** No byte for this long = a network error. */
  idleTimeoutMs: 60_000,
  installTimeoutMs: 10 * 60_000,
};

/** Bytes received do not hash to the digest expected (manifest or layer). */
export class PackageDigestError extends Error {
  override name = "PackageDigestError";
}

/** Every endpoint failed. */
export class PackageFetchError extends Error {
  override name = "PackageFetchError";
}

/** The layer is not a registry package (no install/uninstall), or its install failed. */
export class PackageInstallError extends Error {
  override name = "PackageInstallError";
}

const short = (d: string | undefined) => (d ? d.slice(0, 19) : "(none)");
const hexOf = (digest: string) => digest.slice("sha256:".length);
const sha256 = (b: Buffer) => `sha256:${createHash("sha256").update(b).digest("hex")}`;

export async function installedDigest(host: Host, name: string): Promise<string | undefined> {
  return (await host.readText(`${STORE}/${name}/digest`))?.trim() || undefined;
}

async function ownedByUs(host: Host, name: string): Promise<boolean> {
  return (await host.readText(`${STORE}/${name}/${OWNER_FILE}`).catch(() => undefined)) === OWNER;
}

export async function planPackages(
  packages: RegistryPackageRef[],
  host: Host,
  o: { removeUnlisted: boolean },
): Promise<(Primitive | PackageChange)[]> {
  const changes: (Primitive | PackageChange)[] = [];
  const store = await planDir(host, STORE, { mode: 0o755 });
  if (store) changes.push(store);
  const listed = new Set(packages.map((p) => p.name));
  if (o.removeUnlisted) {
    for (const name of await host.listDir(STORE)) {
      if (listed.has(name) || !(await host.stat(`${STORE}/${name}`))?.isDirectory) continue;
      if (!(await ownedByUs(host, name))) continue; // another tool's package: not ours to remove
      const current = await installedDigest(host, name);
      changes.push({
        kind: "package",
        action: "remove",
        name,
        ...(current ? { digest: current } : {}),
        isolate: `package ${name}`,
        summary: `remove package ${name} ${short(current)} (runs its uninstall)`,
      });
    }
  }
  for (const p of packages) {
    const current = await installedDigest(host, p.name);
    if (current === p.digest) continue;
    changes.push({
      kind: "package",
      action: current ? "upgrade" : "install",
      name: p.name,
      digest: p.digest,
      repository: p.repository,
      summary: current
        ? `upgrade package ${p.name} ${short(current)} → ${short(p.digest)} from ${p.repository}`
        : `install package ${p.name} ${short(p.digest)} from ${p.repository}`,
    });
  }
  return changes;
}

async function* verify(source: AsyncIterable<Buffer>, digest: string, where: string): AsyncGenerator<Buffer> {
  const hash = createHash("sha256");
  let bytes = 0;
  for await (const chunk of source) {
    hash.update(chunk);
    bytes += chunk.length;
    yield chunk;
  }
  const got = `sha256:${hash.digest("hex")}`;
  if (got !== digest) {
    throw new PackageDigestError(
      `${where}: the ${bytes} layer bytes received hash to ${got}, not ${digest} (the manifest's layer); refused`,
    );
  }
}

/** The layer digest a verified manifest names (its last layer). */
export function layerOf(manifestBytes: Buffer, digest: string, where: string): string {
  const actual = sha256(manifestBytes);
  if (actual !== digest) {
    throw new PackageDigestError(`${where}: the manifest received hashes to ${actual}, not ${digest}; refused`);
  }
  let layers: { digest?: unknown }[] | undefined;
  try {
    layers = (JSON.parse(manifestBytes.toString("utf8")) as { layers?: { digest?: unknown }[] }).layers;
  } catch {
    throw new PackageDigestError(`${where}: the manifest is not JSON`);
  }
  const last = layers?.[layers.length - 1]?.digest;
  if (typeof last !== "string" || !DIGEST.test(last)) {
    throw new PackageDigestError(`${where}: the manifest names no layer (an image index? packages are single images)`);
  }
  return last;
}

type Got = typeof import("got");
/** got loads only when a package is fetched: planning a converged node never pays for it. */
const loadGot = (): Promise<Got> => import("got");

function describe(err: unknown, g: Got): string {
  if (err instanceof g.HTTPError) {
    const e = err as HTTPError;
    const s = e.response.statusCode;
    const body = String(e.response.body ?? "")
      .trim()
      .slice(0, 300);
    const hint = s === 401 ? " (the packages-proxy token in the bundle was refused)" : "";
    return `HTTP ${s}${hint}${body ? `: ${body}` : ""}`;
  }
  if (err instanceof g.RequestError) {
    const e = err as RequestError;
    return `${e.code ?? "network error"}: ${e.message}`;
  }
  return (err as Error).message;
}

export interface FetchContext {
  log: StepContext["log"];
  signal?: AbortSignal;
  proxy: { endpoints: string[]; token: string; ca: string };
}

/** Downloads and verifies one package (manifest, then layer); returns the archive's node path. */
export async function fetchPackage(host: Host, ctx: FetchContext, ref: RegistryPackageRef): Promise<string> {
  const dir = `${DOWNLOADS}/${ref.name}`;
  const archive = `${dir}/${hexOf(ref.digest)}.tar.gz`;
  // Leftovers of killed or failed runs: only ever renamed into place verified, but the layer
  // digest is not kept beside them, so they are fetched again rather than trusted.
  for (const entry of await host.listDir(dir)) await host.remove(`${dir}/${entry}`, { recursive: true });
  const { endpoints, token, ca } = ctx.proxy;
  if (endpoints.length === 0) {
    throw new RefusedError(`package ${ref.name}: the bundle names no registry-packages proxy endpoints`);
  }
  if (!ca.includes("BEGIN CERTIFICATE")) {
    throw new RefusedError(
      `package ${ref.name}: the bundle carries no cluster CA to verify the registry-packages proxy with (context.clusterCA); refusing to fetch unverified`,
    );
  }
  const g = await loadGot();
  const got = g.default;
  const query = `digest=${encodeURIComponent(ref.digest)}&repository=${encodeURIComponent(ref.repository)}`;
  const errors: string[] = [];
  for (const endpoint of endpoints) {
    const url = `https://${endpoint}/package?${query}`;
    const where = `package ${ref.name} from ${endpoint}`;
    try {
      const stream = got.stream(url, {
        headers: { authorization: `Bearer ${token}` },
        https: { certificateAuthority: ca },
        retry: { limit: 0 },
        timeout: {
          connect: fetchPolicy.connectTimeoutMs,
          secureConnect: fetchPolicy.connectTimeoutMs,
          socket: fetchPolicy.idleTimeoutMs,
        },
        ...(ctx.signal ? { signal: ctx.signal } : {}),
      });
      const response = await new Promise<{ headers: Record<string, string | string[] | undefined> }>(
        (resolve, reject) => {
          stream.once("response", resolve);
          stream.once("error", reject);
        },
      );
      stream.on("error", () => undefined); // surfaced by the iteration below
      const header = response.headers[MANIFEST_HEADER];
      if (typeof header !== "string") {
        stream.destroy();
        throw new PackageDigestError(
          `${where}: the proxy sent no ${MANIFEST_HEADER} header, so the layer cannot be verified against the manifest digest; refused`,
        );
      }
      const layer = layerOf(Buffer.from(header, "base64"), ref.digest, where);
      await host.mkdir(dir, { mode: 0o700 });
      await host.writeFileStream(archive, verify(stream, layer, where), { mode: 0o600 });
      ctx.log.info({ package: ref.name, digest: ref.digest, layer, endpoint }, "package downloaded and verified");
      return archive;
    } catch (err) {
      if (ctx.signal?.aborted) throw err;
      errors.push(`${endpoint}: ${describe(err, g)}`);
      ctx.log.warn({ package: ref.name, endpoint, err: describe(err, g) }, "package download failed");
    }
  }
  throw new PackageFetchError(
    `package ${ref.name} (${ref.repository}@${ref.digest}) could not be fetched from the registry-packages proxy:\n  ${errors.join("\n  ")}`,
  );
}

function packageEnv(host: Host, name: string, digest: string, realDir: string): Record<string, string> {
  return { D8_ROOT: host.sandbox ? host.root : "", PACKAGE_NAME: name, PACKAGE_DIGEST: digest, PACKAGE_DIR: realDir };
}

export interface UnpackContext {
  logFile?: string;
  signal?: AbortSignal;
  secrets?: string[];
}

/**
 * Unpacks a verified archive into a private work directory and runs the package's `install`
 * with D8_ROOT = `d8Root` (the root prefix: "" on a real node). `after` sees the work directory
 * before it is removed (to keep the scripts, say). The layer must hold `install` (and
 * `uninstall` when `needUninstall`).
 */
export async function unpackAndInstall(
  host: Host,
  ctx: UnpackContext,
  ref: RegistryPackageRef,
  archive: string,
  o: { d8Root: string; needUninstall: boolean; after?: (work: string) => Promise<void> },
): Promise<void> {
  const work = `${DOWNLOADS}/${ref.name}/${hexOf(ref.digest)}.d`;
  await host.remove(work, { recursive: true });
  await host.mkdir(work, { mode: 0o700 });
  try {
    const workReal = await host.fs.realPath(work);
    await host.mustRun(["tar", "-xzf", await host.fs.realPath(archive), "-C", workReal, "--no-same-owner"], {
      logFile: ctx.logFile,
      secrets: ctx.secrets ?? [],
    });
    for (const script of o.needUninstall ? ["install", "uninstall"] : ["install"]) {
      if (!(await host.stat(`${work}/${script}`))?.isFile) {
        throw new PackageInstallError(
          `package ${ref.name} (${ref.digest}) is not a registry package: its layer has no '${script}' script`,
        );
      }
    }
    const r = await host.run(["bash", "./install"], {
      cwd: work,
      env: { D8_ROOT: o.d8Root, PACKAGE_NAME: ref.name, PACKAGE_DIGEST: ref.digest, PACKAGE_DIR: workReal },
      timeoutMs: fetchPolicy.installTimeoutMs,
      logFile: ctx.logFile,
      secrets: ctx.secrets ?? [],
      ...(ctx.signal ? { signal: ctx.signal } : {}),
    });
    if (r.exitCode !== 0 || r.killed) {
      const tail = (r.stderr || r.stdout).trim().split("\n").slice(-5).join("\n");
      throw new PackageInstallError(
        `package ${ref.name} (${ref.digest}): install exited ${r.exitCode}${tail ? `:\n${tail}` : ""}`,
      );
    }
    await o.after?.(work);
  } finally {
    await host.remove(work, { recursive: true });
  }
}

export async function installPackage(
  host: Host,
  ctx: UnpackContext,
  ref: RegistryPackageRef,
  archive: string,
): Promise<void> {
  await unpackAndInstall(host, ctx, ref, archive, {
    d8Root: host.sandbox ? host.root : "",
    needUninstall: true,
    after: async (work) => {
      const store = `${STORE}/${ref.name}`;
      await host.mkdir(store, { mode: 0o755 });
      for (const script of ["install", "uninstall"]) {
        await host.writeFile(`${store}/${script}`, (await host.readFile(`${work}/${script}`)) ?? "", { mode: 0o755 });
      }
      await host.writeFile(`${store}/${OWNER_FILE}`, OWNER, { mode: 0o644 });
      // The digest is written last: it is what says "installed".
      await host.writeFile(`${store}/digest`, `${ref.digest}\n`, { mode: 0o644 });
    },
  });
  await host.remove(archive);
}

/** Runs a package's uninstall, only from a store directory this agent made, then removes it. */
export async function removePackage(
  host: Host,
  ctx: { logFile?: string; signal?: AbortSignal },
  name: string,
): Promise<void> {
  const store = `${STORE}/${name}`;
  const dir = await host.stat(store);
  if (!dir) return;
  if (!dir.isDirectory || dir.uid !== 0 || (dir.mode & 0o022) !== 0) {
    throw new RefusedError(`${store} is not a root-owned directory only root can write; its uninstall is not run`);
  }
  if (!(await ownedByUs(host, name)))
    throw new RefusedError(`package ${name} was not installed by this agent; not removed`);
  const script = await host.stat(`${store}/uninstall`);
  if (script) {
    if (!script.isFile || script.uid !== 0 || (script.mode & 0o022) !== 0) {
      throw new RefusedError(`${store}/uninstall is not a root-owned regular file; not run`);
    }
    const digest = (await installedDigest(host, name)) ?? "";
    const r = await host.run(["bash", "./uninstall"], {
      cwd: store,
      env: packageEnv(host, name, digest, await host.fs.realPath(store)),
      timeoutMs: fetchPolicy.installTimeoutMs,
      logFile: ctx.logFile,
      ...(ctx.signal ? { signal: ctx.signal } : {}),
    });
    if (r.exitCode !== 0 || r.killed) {
      const tail = (r.stderr || r.stdout).trim().split("\n").slice(-5).join("\n");
      throw new PackageInstallError(`package ${name}: uninstall exited ${r.exitCode}${tail ? `:\n${tail}` : ""}`);
    }
  }
  await host.remove(store, { recursive: true });
  await host.remove(`${DOWNLOADS}/${name}`, { recursive: true });
}

export const proxyOf = (ctx: StepContext): FetchContext["proxy"] => ({
  endpoints: ctx.bundle.context.packagesProxy.endpoints,
  token: ctx.bundle.context.packagesProxy.token,
  ca: ctx.bundle.context.clusterCA,
});

/** Downloads start together (at most `concurrency`); installs run in list order as each arrives. */
class Prefetch {
  private readonly started = new Map<string, Promise<string>>();
  private running = 0;
  private readonly queue: (() => void)[] = [];

  get(host: Host, ctx: FetchContext, ref: RegistryPackageRef): Promise<string> {
    const key = `${ref.name}@${ref.digest}`;
    let p = this.started.get(key);
    if (!p) {
      p = this.limit(() => fetchPackage(host, ctx, ref));
      p.catch(() => undefined);
      this.started.set(key, p);
    }
    return p;
  }

  private async limit<T>(fn: () => Promise<T>): Promise<T> {
    if (this.running >= fetchPolicy.concurrency) await new Promise<void>((r) => this.queue.push(r));
    this.running++;
    try {
      return await fn();
    } finally {
      this.running--;
      this.queue.shift()?.();
    }
  }

  forget(ref: RegistryPackageRef): void {
    this.started.delete(`${ref.name}@${ref.digest}`);
  }
}

const prefetch = new Prefetch();

const step: Step<"RegistryPackages", Primitive | PackageChange> = {
  kind: "RegistryPackages",
  async plan(spec, host) {
    return { changes: await planPackages(spec.packages, host, { removeUnlisted: true }), problems: [] };
  },
  async applyOwn(c, spec, host, ctx) {
    if (c.action === "remove") {
      await removePackage(host, ctx, c.name);
      ctx.log.info({ package: c.name }, "package removed");
      return;
    }
    const ref = spec.packages.find((p) => p.name === c.name);
    if (!ref || ref.digest !== c.digest) throw new Error(`RegistryPackages: change for ${c.name} is not in the spec`);
    const fetchCtx = { log: ctx.log, signal: ctx.signal, proxy: proxyOf(ctx) };
    // Start every download this step still needs; installs then wait only for their own package.
    for (const p of spec.packages) {
      if ((await installedDigest(host, p.name)) !== p.digest) prefetch.get(host, fetchCtx, p);
    }
    try {
      const archive = await prefetch.get(host, fetchCtx, ref);
      await installPackage(host, ctx, ref, archive);
    } finally {
      prefetch.forget(ref);
    }
    ctx.log.info({ package: ref.name, digest: ref.digest }, "package installed");
  },
  secrets: () => [],
};

export default step;
