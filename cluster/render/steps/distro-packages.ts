// 000_add_mandatory_packages: every role, nginx only where the API proxy runs (with the kubelet).
import { PACKAGE_ROLES } from "../../../bundles/os-families.ts";
import { runsKubelet } from "./kubelet.ts";
import type { SpecBuilder } from "./spec-builder.ts";

export const distroPackagesSpec: SpecBuilder<"DistributionPackages"> = (i) => ({
  roles: PACKAGE_ROLES.filter((r) => r !== "nginx" || runsKubelet(i)),
});
