// 000_discover_node_ip: the node type, and for Static nodes the internal networks the NodeGroup
// names as Deckhouse's template context has them (.nodeGroup.static.internalNetworkCIDRs, from
// its StaticClusterConfiguration).
import { nodeIp } from "../../../bundles/steps/node-ip.ts";
import { checked, nodeGroupName, nodeGroupSpec, type SpecBuilder } from "./spec-builder.ts";

export const nodeIpSpec: SpecBuilder<"NodeIp"> = (i) => {
  const spec = nodeGroupSpec(i);
  const cidrs = (spec.static as { internalNetworkCIDRs?: unknown } | undefined)?.internalNetworkCIDRs ?? [];
  return checked(
    nodeIp,
    { nodeType: spec.nodeType, internalNetworkCIDRs: cidrs },
    `${nodeGroupName(i)} (spec.static.internalNetworkCIDRs)`,
  );
};
