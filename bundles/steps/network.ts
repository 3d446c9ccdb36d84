// The network settings Deckhouse makes for a CNI: no reverse-path filtering, and
// systemd-networkd leaving the CNI's routing policy rules alone.
import { obj } from "../schema.ts";
import { builtinStep } from "./descriptor.ts";

// 003_disable_rp_filter: rp_filter 0 on every interface (Cilium's routing fails its checks).
export const rpFilter = builtinStep({
  name: "003_disable_rp_filter",
  kind: "RpFilter",
  spec: obj({}),
  units: {},
});

// 005_disable_manage_iprules: systemd-networkd does not remove ip rules it did not make.
export const networkdIpRules = builtinStep({
  name: "005_disable_manage_iprules",
  kind: "NetworkdIpRules",
  spec: obj({}),
  units: {},
});
