// 007_fetch_registry_packages: registry packages installed, upgraded and removed to match the list.
import { arr, type Infer, obj, opt, str } from "../schema.ts";
import { DIGEST, PACKAGE_NAME } from "../rules.ts";
import { builtinStep } from "./descriptor.ts";

export const REGISTRY_PACKAGE = obj({
  name: str({ pattern: PACKAGE_NAME, what: "a package name" }),
  /** sha256 of the package's image manifest, as in Deckhouse; the node verifies manifest and layer. */
  digest: str({ pattern: DIGEST, what: "sha256:<64 hex>" }),
  repository: str({ max: 512, pattern: /^[A-Za-z0-9._/:@-]+$/, what: "a repository path" }),
  /**
   * sha256 of the package's layer blob, as its manifest names it. Deckhouse's proxy sends the
   * blob alone (no manifest beside it): with this the node still verifies what it installs.
   */
  layer: opt(str({ pattern: DIGEST, what: "sha256:<64 hex>" })),
});
export type RegistryPackageRef = Infer<typeof REGISTRY_PACKAGE>;

export const registryPackages = builtinStep({
  name: "007_fetch_registry_packages",
  kind: "RegistryPackages",
  spec: obj({ packages: arr(REGISTRY_PACKAGE, { max: 512, unique: (p) => p.name }) }),
  units: {},
});
