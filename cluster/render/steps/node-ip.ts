// 000_discover_node_ip: the node type, and for Static nodes the cluster's internal networks
// (StaticClusterConfiguration's internalNetworkCIDRs, in the context; Deckhouse's template
// context has them as .nodeGroup.static.internalNetworkCIDRs).
import { nodeIp } from "../../../bundles/steps/node-ip.ts";
import { checked, nodeGroupSpec, type SpecBuilder } from "./spec-builder.ts";

export const nodeIpSpec: SpecBuilder<"NodeIp"> = (i) =>
  checked(
    nodeIp,
    { nodeType: nodeGroupSpec(i).nodeType, internalNetworkCIDRs: [...(i.context.internalNetworkCIDRs ?? [])] },
    "context (internalNetworkCIDRs)",
  );
