// 007_fetch_registry_packages: the context's packages, less the agent's (080 updates it after a
// check) and the containerd package the group's cri.type does not use.
import { CONTAINERD_PACKAGES, containerdPackageOf } from "./containerd.ts";
import type { SpecBuilder } from "./spec-builder.ts";

export const registryPackagesSpec: SpecBuilder<"RegistryPackages"> = (i) => {
  const used = containerdPackageOf(i);
  const unused = new Set<string>(Object.values(CONTAINERD_PACKAGES).filter((p) => p !== used));
  unused.add(i.context.agent.package);
  return { packages: i.packages.filter((p) => !unused.has(p.name)) };
};
