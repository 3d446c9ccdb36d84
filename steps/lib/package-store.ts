// Registry packages, installed: unpack a verified archive, run its `install`, and keep its
// scripts and digest in /var/cache/registrypackages/<pkg>/; remove one by running its
// `uninstall`. Only packages this agent installed (marked `installed-by` in their store
// directory) are ever uninstalled; packages another tool put there (Deckhouse's own bashible,
// say) are left alone. A package's scripts run only from directories the agent created,
// root-owned, reached without links.
//
// Package contract (docs/steps.md): `install` runs with cwd = the unpacked layer and env
// D8_ROOT (the root prefix: "" on a real node), PACKAGE_NAME, PACKAGE_DIGEST, PACKAGE_DIR;
// `uninstall` runs with cwd = the store directory and the same env. Both must be idempotent.
import type { RegistryPackageRef } from "../../bundles/types.ts";
import { PATHS } from "../../bundles/paths.ts";
import { RefusedError } from "../../lib/errors.ts";
import type { Host } from "../../host/host.ts";
import { DOWNLOADS, fetchPolicy } from "./package-fetch.ts";

export const STORE = PATHS.packageStore;
/** Written in a package's store directory when this agent installed it. */
export const OWNER_FILE = "installed-by";
const OWNER = "bashible\n";

/** The layer is not a registry package (no install/uninstall), or its install failed. */
export class PackageInstallError extends Error {
  override name = "PackageInstallError";
}

const hexOf = (digest: string) => digest.slice("sha256:".length);

export async function installedDigest(host: Host, name: string): Promise<string | undefined> {
  return (await host.readText(`${STORE}/${name}/digest`))?.trim() || undefined;
}

/** Whether this agent installed the package (its store directory carries the mark). */
export async function ownedByUs(host: Host, name: string): Promise<boolean> {
  return (await host.readText(`${STORE}/${name}/${OWNER_FILE}`).catch(() => undefined)) === OWNER;
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
