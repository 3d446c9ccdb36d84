// 004_check_hostname: the node's name is one Kubernetes accepts for a Node, or the run stops here.
import { obj } from "../schema.ts";
import { builtinStep } from "./descriptor.ts";

export const hostnameCheck = builtinStep({
  name: "004_check_hostname",
  kind: "HostnameCheck",
  spec: obj({}),
  units: {},
  /**
   * Deckhouse's rule: at most 63 characters, lowercase letters, digits, '-' and '.', starting and
   * ending with a letter or digit.
   */
  pattern: /^[a-z0-9](([a-z0-9.-]{0,61}[a-z0-9])|[a-z0-9]{0,62})$/,
});

// 064_check_hostname_uniqueness: no Node of this name exists yet when a machine joins. Deckhouse
// runs it at 069, after its 064/068 wrote the kubelet's files and before its 069 starts the
// kubelet; here 064_configure_kubelet starts the kubelet, so the check comes just before it.
export const hostnameUniqueness = builtinStep({
  name: "064_check_hostname_uniqueness",
  kind: "HostnameUniqueness",
  spec: obj({}),
  units: {},
});
