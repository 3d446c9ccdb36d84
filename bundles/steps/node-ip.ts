// 000_discover_node_ip: the machine's address in the cluster's network, for the kubelet's
// --node-ip and `bb-d8-node-ip` (/var/lib/bashible/discovered-node-ip).
import { arr, obj, oneOf, str } from "../schema.ts";
import { builtinStep } from "./descriptor.ts";

const OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
const CIDR = new RegExp(`^(${OCTET}\\.){3}${OCTET}/([0-9]|[12][0-9]|3[0-2])$`);

export const nodeIp = builtinStep({
  name: "000_discover_node_ip",
  kind: "NodeIp",
  spec: obj({
    nodeType: oneOf(["CloudEphemeral", "CloudPermanent", "CloudStatic", "Static"] as const),
    /** Static nodes: the first of the machine's addresses inside one of these (Deckhouse's static.internalNetworkCIDRs). */
    internalNetworkCIDRs: arr(str({ pattern: CIDR, what: "an IPv4 CIDR" }), { max: 32 }),
  }),
  units: {},
});
