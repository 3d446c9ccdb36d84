// Which build of a program is installed, as one line a unit file can carry: a new package digest
// (or, for a binary no registry package recorded, a new size or time) changes the unit's text,
// and so restarts the service through the ordinary restart-if-changed path. The running process
// keeps the old binary until then: packages replace binaries by rename.
import { PATHS } from "../../bundles/paths.ts";
import type { Host } from "../../host/host.ts";
import { RefusedError } from "../../lib/errors.ts";

export async function binaryStamp(host: Host, binary: string, pkg: string): Promise<string> {
  const st = await host.stat(binary);
  if (!st?.isFile) {
    throw new RefusedError(
      `${binary} is not installed: the registry package '${pkg}' provides it (step 007_registry_packages installs the packages the bundle lists)`,
    );
  }
  const digest = (await host.readText(`${PATHS.packageStore}/${pkg}/digest`))?.trim();
  if (digest) return `package ${pkg} ${digest}`;
  return `${binary}: ${st.size} bytes, modified ${new Date(st.mtimeMs).toISOString()}`;
}
