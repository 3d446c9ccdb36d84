// NodeIp (000_discover_node_ip): which of the machine's addresses is its address in the cluster,
// written to /var/lib/bashible/discovered-node-ip (the address and a newline), where the kubelet
// step takes --node-ip from and `bb-d8-node-ip` reads it. On a machine with several networks
// the kubelet alone would register whatever its default route says; this picks as Deckhouse
// does, so multi-NIC machines register the right InternalIP:
//
// - Static nodes: the first address (interfaces in the kernel's order) inside the first of the
//   cluster's internalNetworkCIDRs that has one; no address inside them stops the run, naming the
//   addresses there are. Without CIDRs: the address of the one physical interface (a device, not
//   a veth, bridge or dummy), as Deckhouse; where that is not one interface, the address of the
//   default route's interface (what the kubelet picks; Deckhouse stops the run there).
// - Cloud nodes: the Node's InternalIP (else ExternalIP) once the Node exists; before that the
//   cloud decides and the file is left as it is.
//
// Addresses are the running kernel's (under a sandbox root too). A change of the address
// rewrites the file; the kubelet step restarts the kubelet for it.
import { PATHS } from "../bundles/paths.ts";
import { planFile } from "../host/file-plan.ts";
import { RefusedError } from "../lib/errors.ts";
import { isNotFound } from "../lib/kube/errors.ts";
import { defaultRouteInterface, type InterfaceAddress, ipv4Addresses, physicalInterfaces } from "./lib/kernel.ts";
import type { Primitive, Step, StepContext } from "./types.ts";

const toInt = (ip: string) => ip.split(".").reduce((n, o) => n * 256 + Number(o), 0);

export function inCidr(ip: string, cidr: string): boolean {
  const [net, bits] = cidr.split("/") as [string, string];
  const prefix = Number(bits);
  if (prefix === 0) return true;
  const mask = (0xffffffff << (32 - prefix)) >>> 0;
  return (toInt(ip) & mask) >>> 0 === (toInt(net) & mask) >>> 0;
}

export interface NetworkFacts {
  addresses: InterfaceAddress[];
  physical: string[];
  defaultRoute?: string;
}

export class NodeIpNotFoundError extends RefusedError {
  override name = "NodeIpNotFoundError";
}

/** The Static node's address, or the reason there is none. Pure over the facts. */
export function staticNodeIp(cidrs: readonly string[], f: NetworkFacts): { ip: string; why: string } {
  const list = () => f.addresses.map((a) => `${a.address}/${a.prefix} (${a.interface})`).join(", ") || "none";
  if (cidrs.length) {
    for (const cidr of cidrs) {
      const hit = f.addresses.find((a) => inCidr(a.address, cidr));
      if (hit) return { ip: hit.address, why: `${hit.interface} is in ${cidr}` };
    }
    throw new NodeIpNotFoundError(
      `no address of this machine is in the cluster's internalNetworkCIDRs (${cidrs.join(", ")}); its addresses: ${list()}. Fix internalNetworkCIDRs (StaticClusterConfiguration, the bundle server's context) or the machine's network`,
    );
  }
  const physical = f.addresses.filter((a) => f.physical.includes(a.interface));
  const physicalIfs = [...new Set(physical.map((a) => a.interface))];
  if (physicalIfs.length === 1 && physical[0]) {
    return { ip: physical[0].address, why: `${physical[0].interface} is the one network interface` };
  }
  const viaDefault = f.addresses.find((a) => a.interface === f.defaultRoute);
  if (viaDefault) return { ip: viaDefault.address, why: `${viaDefault.interface} has the default route` };
  throw new NodeIpNotFoundError(
    `cannot tell which address is this node's: ${physicalIfs.length ? `${physicalIfs.length} network interfaces (${physicalIfs.join(", ")})` : "no network interface with a device"} and no default route; addresses: ${list()}. Set internalNetworkCIDRs (StaticClusterConfiguration, the bundle server's context)`,
  );
}

async function cloudNodeIp(ctx: StepContext): Promise<string | undefined> {
  if (!ctx.kube) return undefined;
  try {
    const node = await ctx.kube.request<{ status?: { addresses?: { type: string; address: string }[] } }>(
      "GET",
      `/api/v1/nodes/${encodeURIComponent(ctx.nodeName)}`,
    );
    const a = node.status?.addresses ?? [];
    return (a.find((x) => x.type === "InternalIP") ?? a.find((x) => x.type === "ExternalIP"))?.address;
  } catch (err) {
    if (isNotFound(err)) return undefined;
    throw err;
  }
}

const step: Step<"NodeIp"> = {
  kind: "NodeIp",
  async plan(spec, host, ctx) {
    let ip: string | undefined;
    let why = "";
    if (spec.nodeType === "Static") {
      ({ ip, why } = staticNodeIp(spec.internalNetworkCIDRs, {
        addresses: ipv4Addresses(),
        physical: await physicalInterfaces(),
        defaultRoute: await defaultRouteInterface(),
      }));
    } else {
      ip = await cloudNodeIp(ctx);
      why = "the Node's address";
    }
    if (!ip) return { changes: [], problems: [] };
    const changes: Primitive[] = [];
    const file = await planFile(host, { path: PATHS.discoveredNodeIp, content: `${ip}\n`, mode: 0o644 });
    if (file) changes.push({ ...file, summary: `${file.summary}: ${ip} (${why})` });
    return { changes, problems: [] };
  },
};

export default step;
