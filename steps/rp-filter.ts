// RpFilter (003_disable_rp_filter): reverse-path filtering off on every interface. CNIs route
// pod traffic asymmetrically (Cilium's docs: systemd 245+ re-enables rp_filter on its
// interfaces and breaks connectivity), so, as Deckhouse does, a sysctl.d file sets
// net.ipv4.conf.*.rp_filter = 0: systemd-sysctl applies it at boot and to interfaces that appear
// later (its udev rule). Now: every interface whose live value is not 0 (all, default and each
// one: the kernel uses the larger of `all` and the interface's), set with sysctl -w. Deckhouse
// restarts systemd-sysctl instead, which re-applies every sysctl.d file on the machine.
import { readdir } from "node:fs/promises";
import { HOST_PREP } from "../bundles/paths.ts";
import { planSysctls } from "./lib/sysctl.ts";
import type { Primitive, Step } from "./types.ts";

const step: Step<"RpFilter"> = {
  kind: "RpFilter",
  async plan(_spec, host) {
    const live: Record<string, string> = {};
    if (!host.sandbox) {
      for (const iface of (await readdir("/proc/sys/net/ipv4/conf")).sort()) {
        live[`net/ipv4/conf/${iface}/rp_filter`] = "0";
      }
    }
    const p = await planSysctls(host, {
      path: HOST_PREP.rpFilter,
      header: "# Managed by bashible (003_disable_rp_filter): CNIs route pod traffic asymmetrically.",
      settings: { "net.ipv4.conf.*.rp_filter": "0" },
      live,
      subject: "rp_filter",
    });
    const changes: Primitive[] = [...(p.file ? [p.file] : []), ...(p.apply ? [p.apply] : [])];
    return { changes, problems: p.problems };
  },
};

export default step;
