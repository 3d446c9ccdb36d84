// RegistryPackages (007_fetch_registry_packages): install, upgrade and remove registry packages
// (OCI images whose last layer holds `install`, `uninstall` and payload) so that
// /var/cache/registrypackages/<pkg>/digest matches the bundle. Downloads start together and
// installs run in list order as each arrives; the download, verification and the package store
// are the package library's (steps/lib/package-fetch.ts, steps/lib/package-store.ts).
import type { RegistryPackageRef } from "../bundles/types.ts";
import type { Host } from "../host/host.ts";
import { planDir } from "../host/file-plan.ts";
import { Prefetch, proxyOf } from "./lib/package-fetch.ts";
import { installedDigest, installPackage, ownedByUs, removePackage, STORE } from "./lib/package-store.ts";
import type { PackageChange, Primitive, Step } from "./types.ts";

const short = (d: string | undefined) => (d ? d.slice(0, 19) : "(none)");

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
