// `bashible package install|remove`: registry packages on demand, for NodeGroupConfiguration
// scripts (bb-package-install / bb-package-remove call it). The same fetch, chain
// verification, install and ownership rules as the 007_fetch_registry_packages step, with the
// registry-packages proxy and CA of the bundle being applied.
import { appendFile, readFile } from "node:fs/promises";
import { EXIT, UsageError, type Command } from "../../lib/cli.ts";
import { acceptBundle } from "../../bundles/verify.ts";
import { defaultPackageRepository, PATHS } from "../../bundles/paths.ts";
import { DIGEST, PACKAGE_NAME } from "../../bundles/rules.ts";
import type { RegistryPackageRef } from "../../bundles/types.ts";
import { Host } from "../../host/host.ts";
import { osProfile } from "../converge/converge.ts";
import { fetchPackage } from "../../steps/lib/package-fetch.ts";
import { installedDigest, installPackage, removePackage } from "../../steps/lib/package-store.ts";

const command: Command = {
  summary: "install or remove registry packages (for scripts: bb-package-install/-remove)",
  usage: "install|remove|installed [--result FILE] NAME[:sha256:HEX[@REPOSITORY]]… [--root DIR]",
  help: `install NAME:sha256:HEX[@REPOSITORY]…  fetch through the registry-packages proxy of the bundle
                                       being applied, verify manifest and layer, run install;
                                       skipped when already at that digest
remove NAME…                           run the uninstall of packages this agent installed
installed NAME[:sha256:HEX]            exit 0 when the package is installed (at that digest), else 1

The digest names the package's image manifest. REPOSITORY defaults to the bundle registry's
<path>/packages. The bundle is ${PATHS.runBundle} (the one the current run applies).

Options:
      --result FILE       append "installed NAME", "skipped NAME" or "removed NAME" per package
      --bundle-file FILE  take the proxy and CA from this bundle instead`,
  options: { result: { type: "string" }, "bundle-file": { type: "string" } },
  takesRoot: true,
  logTo: "stderr",
  async run({ values, positionals, root, log }) {
    const [action, ...args] = positionals;
    if (action !== "install" && action !== "remove" && action !== "installed") {
      throw new UsageError("say install, remove or installed");
    }
    if (args.length === 0) throw new UsageError(`package ${action}: name at least one package`);
    const host = new Host(root, await osProfile(root));
    const result = values.result as string | undefined;
    const report = async (what: string, name: string) => {
      if (result) await appendFile(result, `${what} ${name}\n`);
    };
    const ctx = { log, logFile: undefined, signal: undefined };
    if (action === "installed") {
      const m = /^([a-z0-9][a-z0-9._-]*)(?::(sha256:[0-9a-f]{64}))?$/.exec(args[0] ?? "");
      if (!m || args.length !== 1) throw new UsageError("package installed: one NAME[:sha256:<64 hex>]");
      const digest = await installedDigest(host, m[1] as string);
      return digest && (!m[2] || m[2] === digest) ? EXIT.ok : EXIT.error;
    }
    if (action === "remove") {
      for (const name of args) {
        if (!PACKAGE_NAME.test(name)) throw new UsageError(`'${name}' is not a package name`);
        if (!(await installedDigest(host, name))) continue;
        await removePackage(host, ctx, name);
        log.info({ package: name }, "package removed");
        await report("removed", name);
      }
      return EXIT.ok;
    }
    const given = values["bundle-file"] as string | undefined;
    const file = given ?? host.path(PATHS.runBundle);
    const raw = given ? await readFile(given) : await host.readFile(PATHS.runBundle);
    if (!raw) throw new UsageError(`no bundle at ${file}: run this from a converge (or pass --bundle-file)`);
    const bundle = acceptBundle(raw, file);
    const refs: RegistryPackageRef[] = args.map((a) => {
      const m = /^([a-z0-9][a-z0-9._-]*):(sha256:[0-9a-f]{64})(?:@(.+))?$/.exec(a);
      if (!m || !PACKAGE_NAME.test(m[1] as string) || !DIGEST.test(m[2] as string)) {
        throw new UsageError(`'${a}' is not NAME:sha256:<64 hex>[@REPOSITORY]`);
      }
      const repository = m[3] ?? defaultPackageRepository(bundle.context.registry);
      if (!repository) throw new UsageError(`${a}: no repository given and the bundle names no registry`);
      return { name: m[1] as string, digest: m[2] as string, repository };
    });
    const proxy = {
      endpoints: bundle.context.packagesProxy.endpoints,
      token: bundle.context.packagesProxy.token,
      ca: bundle.context.clusterCA,
    };
    for (const ref of refs) {
      if ((await installedDigest(host, ref.name)) === ref.digest) {
        await report("skipped", ref.name);
        continue;
      }
      const archive = await fetchPackage(host, { log, proxy }, ref);
      await installPackage(host, { secrets: [proxy.token] }, ref, archive);
      log.info({ package: ref.name, digest: ref.digest }, "package installed");
      await report("installed", ref.name);
    }
    return EXIT.ok;
  },
};
export default command;
