// 000_add_mandatory_packages: what the node needs from its distribution, by role
// (bundles/os-families.ts maps roles to each family's packages). Deckhouse's
// 003_install_mandatory_packages, renamed so it runs first: the other 000_* steps need what it
// installs (visudo for 000_add_node_users, nginx for 000_configure_kubernetes_api_proxy), and
// as a 000_* step it runs before the update approval, so they always find their programs.
import { arr, obj, oneOf } from "../schema.ts";
import { PACKAGE_ROLES } from "../os-families.ts";
import { builtinStep } from "./descriptor.ts";

export const distroPackages = builtinStep({
  name: "000_add_mandatory_packages",
  kind: "DistributionPackages",
  spec: obj({
    roles: arr(oneOf(PACKAGE_ROLES), { max: PACKAGE_ROLES.length, unique: (r) => r }),
  }),
  units: {},
});
