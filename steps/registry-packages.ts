// RegistryPackages: install, upgrade and remove registry packages (OCI layers holding
// `install`, `uninstall` and payload) so that /var/cache/registrypackages/<pkg>/digest matches
// the bundle. Packages are fetched through the cluster's registry-packages proxy over TLS
// verified against the cluster CA, and the sha256 of the bytes received is checked before an
// archive is ever renamed into place; a killed or truncated download leaves nothing usable.
//
// Package contract (docs/steps.md): the layer is a gzipped tar with executable-or-not bash
// scripts `install` and `uninstall` at its root. `install` runs with cwd = the unpacked layer and
// env D8_ROOT (the root prefix: "" on a real node, the sandbox directory otherwise; scripts
// write to "$D8_ROOT/opt/deckhouse/bin/…"), PACKAGE_NAME, PACKAGE_DIGEST, PACKAGE_DIR (the
// unpacked layer, real path). `uninstall` runs with cwd = /var/cache/registrypackages/<pkg> and
// the same env. Both must be idempotent; a non-zero exit fails the step.
import { createHash } from "node:crypto";
import got, { HTTPError, RequestError } from "got";
import type { RegistryPackageRef } from "../bundles/types.ts";
import type { Host } from "../agent/host/host.ts";
import type { Change, PackageChange, Step, StepContext } from "./types.ts";

export const STORE = "/var/cache/registrypackages";
export const DOWNLOADS = "/opt/deckhouse/tmp/registrypackages";

/** Fetch policy; tests and benchmarks shorten the delays. */
export const fetchPolicy = {
  /** Rounds over all endpoints. */
  attempts: 10,
  baseDelayMs: 1000,
  maxDelayMs: 30_000,
  /** Downloads at once. */
  concurrency: 4,
  connectTimeoutMs: 10_000,
  /** No byte for this long = a network error (retried). */
  idleTimeoutMs: 60_000,
  installTimeoutMs: 10 * 60_000,
};

const NAME_RE = /^[a-z0-9][a-z0-9._-]*$/;
const DIGEST_RE = /^sha256:[0-9a-f]{64}$/;
const RETRY_STATUS = new Set([408, 429, 500, 502, 503, 504]);

/** Bytes received do not hash to the digest asked for. */
export class PackageDigestError extends Error {
  override name = "PackageDigestError";
}

/** Every endpoint failed on every attempt (or refused for good: 401/403/404). */
export class PackageFetchError extends Error {
  override name = "PackageFetchError";
}

/** The layer is not a registry package (no install/uninstall), or its install failed. */
export class PackageInstallError extends Error {
  override name = "PackageInstallError";
}

const short = (d: string | undefined) => (d ? d.slice(0, 19) : "(none)");
const hexOf = (digest: string) => digest.slice("sha256:".length);

function validate(pkgs: RegistryPackageRef[]): void {
  const seen = new Set<string>();
  for (const p of pkgs) {
    if (!NAME_RE.test(p.name)) throw new Error(`RegistryPackages: invalid package name '${p.name}'`);
    if (!DIGEST_RE.test(p.digest)) {
      throw new Error(`RegistryPackages: package ${p.name}: digest must be sha256:<64 hex>, got '${p.digest}'`);
    }
    if (seen.has(p.name)) throw new Error(`RegistryPackages: package ${p.name} is listed twice`);
    seen.add(p.name);
  }
}

async function installedDigest(host: Host, name: string): Promise<string | undefined> {
  return (await host.readText(`${STORE}/${name}/digest`))?.trim() || undefined;
}

async function plan(spec: { packages: RegistryPackageRef[] }, host: Host): Promise<Change[]> {
  validate(spec.packages);
  const changes: PackageChange[] = [];
  const listed = new Set(spec.packages.map((p) => p.name));
  for (const name of await host.listDir(STORE)) {
    if (listed.has(name) || !(await host.stat(`${STORE}/${name}`))?.isDirectory) continue;
    const current = await installedDigest(host, name);
    changes.push({
      kind: "package",
      action: "remove",
      name,
      ...(current ? { digest: current } : {}),
      summary: `remove package ${name} ${short(current)} (runs its uninstall)`,
    });
  }
  for (const p of spec.packages) {
    const current = await installedDigest(host, p.name);
    if (current === p.digest) continue;
    changes.push({
      kind: "package",
      action: current ? "upgrade" : "install",
      name: p.name,
      digest: p.digest,
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
    throw new PackageDigestError(`${where}: the ${bytes} bytes received hash to ${got}, not ${digest}; refused`);
  }
}

async function drain(it: AsyncIterable<unknown>): Promise<void> {
  for await (const _ of it) {
    // only the checksum at the end matters
  }
}

function retryable(err: unknown): boolean {
  if (err instanceof PackageDigestError) return true;
  if (err instanceof HTTPError) return RETRY_STATUS.has(err.response.statusCode);
  return err instanceof RequestError; // network errors, resets, premature close, timeouts
}

function describe(err: unknown): string {
  if (err instanceof HTTPError) {
    const s = err.response.statusCode;
    const body = String(err.response.body ?? "")
      .trim()
      .slice(0, 300);
    const hint = s === 401 ? " (the packages-proxy token in the bundle was refused)" : "";
    return `HTTP ${s}${hint}${body ? `: ${body}` : ""}`;
  }
  if (err instanceof RequestError) return `${err.code ?? "network error"}: ${err.message}`;
  return (err as Error).message;
}

/** Downloads and verifies one package; returns the node path of the verified archive. */
async function fetchPackage(host: Host, ctx: StepContext, ref: RegistryPackageRef): Promise<string> {
  const archive = `${DOWNLOADS}/${ref.name}/${hexOf(ref.digest)}.tar.gz`;
  // Temp files of a download that was killed (they never carry the archive's name): litter only.
  for (const entry of await host.listDir(`${DOWNLOADS}/${ref.name}`)) {
    if (entry.startsWith(".")) await host.remove(`${DOWNLOADS}/${ref.name}/${entry}`);
  }
  if (await host.exists(archive)) {
    // Left by an earlier run that failed to install; only ever renamed into place verified,
    // but check again: it sits on a disk anyone with root can write.
    try {
      await drain(verify(host.readStream(archive), ref.digest, archive));
      ctx.log.debug({ package: ref.name }, "reusing verified download");
      return archive;
    } catch {
      await host.remove(archive);
    }
  }
  const { endpoints, token } = ctx.bundle.context.packagesProxy;
  if (endpoints.length === 0) {
    throw new PackageFetchError(`package ${ref.name}: the bundle names no registry-packages proxy endpoints`);
  }
  if (!ctx.bundle.context.clusterCA.includes("BEGIN CERTIFICATE")) {
    throw new PackageFetchError(
      `package ${ref.name}: the bundle carries no cluster CA to verify the registry-packages proxy with (context.clusterCA); refusing to fetch unverified`,
    );
  }
  const query = `digest=${encodeURIComponent(ref.digest)}&repository=${encodeURIComponent(ref.repository)}`;
  const errors: string[] = [];
  for (let attempt = 1; attempt <= fetchPolicy.attempts; attempt++) {
    let anyRetryable = false;
    for (let i = 0; i < endpoints.length; i++) {
      // Start each round at a different endpoint, so one sick proxy is not always asked first.
      const endpoint = endpoints[(i + attempt - 1) % endpoints.length] as string;
      const url = `https://${endpoint}/package?${query}`;
      try {
        const stream = got.stream(url, {
          headers: { authorization: `Bearer ${token}` },
          https: { certificateAuthority: ctx.bundle.context.clusterCA },
          retry: { limit: 0 },
          timeout: {
            connect: fetchPolicy.connectTimeoutMs,
            secureConnect: fetchPolicy.connectTimeoutMs,
            socket: fetchPolicy.idleTimeoutMs,
          },
          ...(ctx.signal ? { signal: ctx.signal } : {}),
        });
        // Errors before the first read (refused, TLS) surface through the iteration below;
        // this listener only keeps them from being "unhandled" in between.
        stream.on("error", () => undefined);
        await host.writeFileStream(archive, verify(stream, ref.digest, `package ${ref.name} from ${endpoint}`), {
          mode: 0o600,
        });
        ctx.log.info({ package: ref.name, digest: ref.digest, endpoint, attempt }, "package downloaded and verified");
        return archive;
      } catch (err) {
        if (ctx.signal?.aborted) throw err;
        const msg = `${endpoint}: ${describe(err)}`;
        errors.push(`attempt ${attempt}, ${msg}`);
        ctx.log.warn({ package: ref.name, endpoint, attempt, err: describe(err) }, "package download failed");
        if (retryable(err)) anyRetryable = true;
      }
    }
    if (!anyRetryable || attempt === fetchPolicy.attempts) break;
    const delay = Math.min(fetchPolicy.baseDelayMs * 2 ** (attempt - 1), fetchPolicy.maxDelayMs);
    await new Promise((r) => setTimeout(r, delay * (0.8 + Math.random() * 0.4)));
  }
  throw new PackageFetchError(
    `package ${ref.name} (${ref.repository}@${ref.digest}) could not be fetched from the registry-packages proxy:\n  ${errors.slice(-6).join("\n  ")}`,
  );
}

function packageEnv(host: Host, name: string, digest: string, dir: string): Record<string, string> {
  return {
    D8_ROOT: host.sandbox ? host.root : "",
    PACKAGE_NAME: name,
    PACKAGE_DIGEST: digest,
    PACKAGE_DIR: host.path(dir),
  };
}

async function install(host: Host, ctx: StepContext, ref: RegistryPackageRef, archive: string): Promise<void> {
  const work = `${DOWNLOADS}/${ref.name}/${hexOf(ref.digest)}.d`;
  await host.remove(work, { recursive: true });
  await host.mkdir(work, { mode: 0o700 });
  try {
    await host.mustRun(["tar", "-xzf", host.path(archive), "-C", host.path(work), "--no-same-owner"], {
      logFile: ctx.logFile,
    });
    for (const script of ["install", "uninstall"]) {
      if (!(await host.stat(`${work}/${script}`))?.isFile) {
        throw new PackageInstallError(
          `package ${ref.name} (${ref.digest}) is not a registry package: its layer has no '${script}' script`,
        );
      }
    }
    const r = await host.run(["bash", "./install"], {
      cwd: work,
      env: packageEnv(host, ref.name, ref.digest, work),
      timeoutMs: fetchPolicy.installTimeoutMs,
      logFile: ctx.logFile,
      ...(ctx.signal ? { signal: ctx.signal } : {}),
    });
    if (r.exitCode !== 0) {
      const tail = (r.stderr || r.stdout).trim().split("\n").slice(-5).join("\n");
      throw new PackageInstallError(
        `package ${ref.name} (${ref.digest}): install exited ${r.exitCode}${tail ? `:\n${tail}` : ""}`,
      );
    }
    const store = `${STORE}/${ref.name}`;
    await host.mkdir(store, { mode: 0o755 });
    for (const script of ["install", "uninstall"]) {
      await host.writeFile(`${store}/${script}`, (await host.readFile(`${work}/${script}`)) ?? "", { mode: 0o755 });
    }
    // The digest is written last: it is what says "installed".
    await host.writeFile(`${store}/digest`, `${ref.digest}\n`, { mode: 0o644 });
  } finally {
    await host.remove(work, { recursive: true });
  }
  await host.remove(archive);
}

async function remove(host: Host, ctx: StepContext, name: string): Promise<void> {
  const store = `${STORE}/${name}`;
  if (await host.exists(`${store}/uninstall`)) {
    const digest = (await installedDigest(host, name)) ?? "";
    const r = await host.run(["bash", "./uninstall"], {
      cwd: store,
      env: packageEnv(host, name, digest, store),
      timeoutMs: fetchPolicy.installTimeoutMs,
      logFile: ctx.logFile,
    });
    if (r.exitCode !== 0) {
      const tail = (r.stderr || r.stdout).trim().split("\n").slice(-5).join("\n");
      throw new PackageInstallError(`package ${name}: uninstall exited ${r.exitCode}${tail ? `:\n${tail}` : ""}`);
    }
  }
  await host.remove(store, { recursive: true });
  await host.remove(`${DOWNLOADS}/${name}`, { recursive: true });
}

/** Runs `fn` over items with at most `n` at once; results keep the input order. */
function pool<T, R>(items: T[], n: number, fn: (t: T) => Promise<R>): Promise<R>[] {
  let running = 0;
  const queue: (() => void)[] = [];
  return items.map(async (item) => {
    if (running >= n) await new Promise<void>((r) => queue.push(r));
    running++;
    try {
      return await fn(item);
    } finally {
      running--;
      queue.shift()?.();
    }
  });
}

const step: Step<"RegistryPackages"> = {
  kind: "RegistryPackages",
  plan: (spec, host) => plan(spec, host),
  async apply(changes, spec, host, ctx) {
    const pkgChanges = changes.filter((c): c is PackageChange => c.kind === "package");
    const removed: string[] = [];
    for (const c of pkgChanges.filter((c) => c.action === "remove")) {
      await remove(host, ctx, c.name);
      ctx.log.info({ package: c.name }, "package removed");
      removed.push(c.name);
    }
    const byName = new Map(spec.packages.map((p) => [p.name, p]));
    const wanted = pkgChanges
      .filter((c) => c.action !== "remove")
      .map((c) => {
        const ref = byName.get(c.name);
        if (!ref || ref.digest !== c.digest)
          throw new Error(`RegistryPackages: change for ${c.name} is not in the spec`);
        return ref;
      });
    const downloads = pool(wanted, fetchPolicy.concurrency, (ref) => fetchPackage(host, ctx, ref));
    for (const d of downloads) d.catch(() => undefined); // awaited below, in list order
    const installed: string[] = [];
    try {
      for (const [i, ref] of wanted.entries()) {
        const archive = await (downloads[i] as Promise<string>);
        await install(host, ctx, ref, archive);
        ctx.log.info({ package: ref.name, digest: ref.digest }, "package installed");
        installed.push(ref.name);
      }
    } catch (err) {
      await Promise.allSettled(downloads);
      throw err;
    }
    const changed = new Set(installed);
    const skipped = spec.packages.map((p) => p.name).filter((n) => !changed.has(n));
    return { outputs: { installed, skipped, removed } };
  },
};

export default step;
