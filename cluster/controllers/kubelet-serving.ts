// Kubelet serving certificates. The kubelet (serverTLSBootstrap) asks for its serving
// certificate with a CSR for signer kubernetes.io/kubelet-serving, which nothing in Kubernetes
// approves; until one is approved the API server cannot reach the kubelet over verified TLS, so
// `kubectl logs`, `exec`, `port-forward` and metrics fail for the node. Deckhouse's node-manager
// approves such CSRs after checking their form. This controller checks the same form, and also
// what the certificate would vouch for: kube-controller-manager signs it with the cluster CA,
// often the API server's own CA, so a node that got one for another machine's name or address
// could pose as that machine. A Node's status.addresses are written by the node itself, so they
// are only a necessary condition: names must be the node's own name (or under it) and never a
// form an in-cluster client takes for a Service, addresses must be ones it reports that no other
// managed Node reports, and no endpoint of the cluster (API server, context endpoints) is either.
import { CoalescedPass } from "./coalesced-pass.ts";
import { isIPv4, isIPv6 } from "node:net";
import type { KubeClient } from "../../lib/kube/client.ts";
import type { Logger } from "../../lib/log/log.ts";
import type { KubeObject } from "../../lib/kube/api.ts";
import { isConflict, isNotFound } from "../../lib/kube/errors.ts";
import { Informer, type InformerEvent } from "../../lib/informer.ts";
import { parseCsr, type CsrInfo } from "../../lib/pkcs10.ts";
import { NODE_KEYS } from "../../bundles/names.ts";
import { clusterEndpoints } from "./cluster-endpoints.ts";
import { CSRS, type Csr, CsrRetries, decideCsr, isDecided } from "./csr-approval.ts";

export const KUBELET_SERVING_SIGNER = "kubernetes.io/kubelet-serving";
const NODE_USER_PREFIX = "system:node:";
export type { Csr };

interface NodeAddresses extends KubeObject {
  status?: { addresses?: { type: string; address: string }[] };
}

export type Verdict =
  | { verdict: "approve"; node: string }
  | { verdict: "deny"; reason: string }
  | { verdict: "wait"; reason: string };

/** What a kubelet asks for (RSA keys add key encipherment): exactly one of these sets. */
const USAGE_SETS = [
  ["digital signature", "server auth"],
  ["digital signature", "key encipherment", "server auth"],
];

/**
 * One spelling per address: IPv4 dotted (an IPv4-mapped IPv6 address is the IPv4 address it
 * maps: certificates and Go's net.IP treat them as equal), IPv6 compressed lowercase, names
 * lowercase. Undefined for what no node address may be: an IPv6 zone, an unparsable IP.
 */
export function canonicalAddress(a: string): string | undefined {
  const s = a.trim().toLowerCase();
  if (s.includes("%")) return undefined;
  if (isIPv4(s)) return s;
  if (!isIPv6(s)) return s;
  let h: string;
  try {
    h = new URL(`http://[${s}]/`).hostname.slice(1, -1);
  } catch {
    return undefined;
  }
  const mapped = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(h);
  if (!mapped) return h;
  const hi = Number.parseInt(mapped[1] ?? "0", 16);
  const lo = Number.parseInt(mapped[2] ?? "0", 16);
  return `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`;
}

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;
const isDnsName = (d: string) => d.length <= 253 && d.split(".").every((l) => DNS_LABEL.test(l));

/** Addresses that never belong to one node: loopback, unspecified, link-local, multicast. */
function isSpecialIp(ip: string): boolean {
  if (isIPv4(ip)) {
    const [a = 0, b = 0] = ip.split(".").map(Number);
    return a === 0 || a === 127 || (a === 169 && b === 254) || a >= 224;
  }
  return ip === "::" || ip === "::1" || /^fe[89ab]/.test(ip) || ip.startsWith("ff");
}

/** What the decision needs to know about the cluster, gathered once per pass. */
export interface Known {
  /** Every canonical address a managed Node reports, with the Nodes reporting it. */
  addressOwners: ReadonlyMap<string, ReadonlySet<string>>;
  /**
   * Where the cluster side serves and nodes dial (cluster-endpoints.ts): the `kubernetes`
   * Service's IPs and endpoints, the context's endpoints; IPs canonical, names lowercase.
   * Undefined: not known (yet).
   */
  endpoints: { ips: ReadonlySet<string>; names: ReadonlySet<string> } | undefined;
  /**
   * For single-label names asked for: the Service of that name (`namespace/name`), or null when
   * no namespace has one. A name not looked up is not in the map.
   */
  services: ReadonlyMap<string, string | null>;
}

/**
 * Labels of in-cluster DNS names (`<svc>.<ns>.svc.<domain>`, `<ip>.<ns>.pod.<domain>`): a node's
 * own name never has them.
 */
const CLUSTER_DNS_LABELS = new Set(["svc", "pod"]);

/** Single-label DNS names a CSR asks for: a Service can have each of them as its name. */
export function singleLabelNames(csr: Csr): string[] {
  try {
    return parseCsr(Buffer.from(csr.spec.request, "base64"))
      .dnsNames.map((d) => d.toLowerCase())
      .filter((d) => isDnsName(d) && !d.includes("."));
  } catch {
    return [];
  }
}

/**
 * The decision for one kubelet-serving CSR. `node` is the requesting Node (undefined when it is
 * not a managed Node or not registered yet).
 */
export function judge(csr: Csr, node: NodeAddresses | undefined, known: Known): Verdict {
  const user = csr.spec.username ?? "";
  if (!user.startsWith(NODE_USER_PREFIX) || !(csr.spec.groups ?? []).includes("system:nodes")) {
    return {
      verdict: "deny",
      reason: `requested by ${user || "nobody"}, not by a node (system:node:<name> in system:nodes)`,
    };
  }
  let info: CsrInfo;
  try {
    info = parseCsr(Buffer.from(csr.spec.request, "base64"));
  } catch (err) {
    return { verdict: "deny", reason: `the request is not a valid PKCS#10 CSR: ${(err as Error).message}` };
  }
  if (info.commonName !== user) {
    return {
      verdict: "deny",
      reason: `its common name ${JSON.stringify(info.commonName)} is not the requester ${user}`,
    };
  }
  if (info.organizations.length !== 1 || info.organizations[0] !== "system:nodes") {
    return {
      verdict: "deny",
      reason: `its organization must be exactly system:nodes, not ${JSON.stringify(info.organizations)}`,
    };
  }
  const usages = [...(csr.spec.usages ?? [])].sort();
  if (!USAGE_SETS.some((set) => set.length === usages.length && set.every((u, i) => u === usages[i]))) {
    return {
      verdict: "deny",
      reason: `usages ${JSON.stringify(csr.spec.usages ?? [])} are not a kubelet serving certificate's`,
    };
  }
  if (info.emailAddresses.length || info.uris.length || info.otherSanKinds) {
    return { verdict: "deny", reason: "it asks for e-mail, URI or other names besides DNS names and IP addresses" };
  }
  if (!info.dnsNames.length && !info.ipAddresses.length) {
    return { verdict: "deny", reason: "it names no DNS name or IP address" };
  }
  const nodeName = user.slice(NODE_USER_PREFIX.length);
  // Names: the node's own, and never one a client inside the cluster would take for a Service:
  // kube-controller-manager signs with the cluster CA, which every pod trusts (its service
  // account's ca.crt), so a node named `kubernetes` or `vault` must not get `kubernetes.default`
  // or `vault.vault`. A node reports its own Hostname address, so its addresses prove nothing.
  const pendingLookups: string[] = [];
  for (const d of info.dnsNames) {
    const name = d.toLowerCase();
    if (!isDnsName(name)) return { verdict: "deny", reason: `${JSON.stringify(d)} is not a DNS name (no wildcards)` };
    // The node's name, its FQDN (name.domain), or the short host name of a node named by FQDN.
    const own = name === nodeName || name.startsWith(`${nodeName}.`) || nodeName.startsWith(`${name}.`);
    if (!own) return { verdict: "deny", reason: `${d} is not the node's name ${nodeName} or its domain name` };
    const labels = name.split(".");
    if (labels.some((l) => CLUSTER_DNS_LABELS.has(l)))
      return { verdict: "deny", reason: `${d} is an in-cluster Service or Pod name (a label svc or pod)` };
    // `<service>.<namespace>` resolves to a Service through every pod's search path, in any
    // namespace, including ones made later: refused by its form, not by a lookup.
    if (labels.length === 2) {
      return {
        verdict: "deny",
        reason: `${d} has the form <service>.<namespace> of an in-cluster Service name; name nodes by a host name or an FQDN of three labels or more`,
      };
    }
    if (known.endpoints?.names.has(name)) {
      return { verdict: "deny", reason: `${d} is an endpoint of the cluster (the bundle context names it)` };
    }
    if (labels.length === 1) {
      const service = known.services.get(name);
      if (service) return { verdict: "deny", reason: `${d} is the name of Service ${service}; rename the node` };
      if (service === undefined) pendingLookups.push(name);
    }
  }
  const ips: string[] = [];
  for (const ip of info.ipAddresses) {
    const c = canonicalAddress(ip);
    if (c === undefined || isSpecialIp(c)) {
      return { verdict: "deny", reason: `${ip} is not an address of one node (loopback, link-local, zone, …)` };
    }
    if (known.endpoints?.ips.has(c)) {
      return { verdict: "deny", reason: `${ip} is an address of the API server or another endpoint of the cluster` };
    }
    ips.push(c);
  }
  // Decided as waits from here: another node's claim, or an address not reported yet, can change.
  for (const ip of ips) {
    const others = [...(known.addressOwners.get(ip) ?? [])].filter((n) => n !== nodeName);
    if (others.length) {
      return { verdict: "wait", reason: `${ip} is also an address of Node ${others.sort().join(", ")}` };
    }
  }
  if (!known.endpoints) return { verdict: "wait", reason: "the API server's addresses are not known yet" };
  if (pendingLookups.length) {
    return { verdict: "wait", reason: `cannot tell yet whether ${pendingLookups.join(", ")} is a Service's name` };
  }
  if (!node) return { verdict: "wait", reason: `Node ${nodeName} is not a registered node of a node group (yet)` };
  const own = new Set((node.status?.addresses ?? []).map((a) => canonicalAddress(a.address)));
  const foreign = ips.filter((ip) => !own.has(ip));
  if (foreign.length) {
    return {
      verdict: "wait",
      reason: `${foreign.join(", ")} not among the addresses Node ${nodeName} reports (${[...own].join(", ") || "none yet"})`,
    };
  }
  return { verdict: "approve", node: nodeName };
}

/** How long the API server's addresses are trusted before they are read again. */
const API_ADDRESSES_TTL_MS = 60_000;

export class KubeletServingApprover {
  private readonly client: KubeClient;
  private readonly log: Logger;
  private readonly csrs: Informer<Csr>;
  private readonly nodes: Informer<NodeAddresses>;
  /** The Nodes' watch belongs to someone else (the update controller), who forwards its events. */
  private readonly sharedNodes: boolean;
  /** Pending CSRs that wait, with the last reason logged (logged once per reason). */
  private readonly waiting = new Map<string, string>();
  private endpoints: { value: NonNullable<Known["endpoints"]>; at: number } | undefined;
  private stopped = false;
  /** One pass over the pending CSRs for a burst of events; never two at once. */
  private readonly passes = new CoalescedPass(
    () => this.pass(),
    (err) => this.log.warn({ err: err.message }, "kubelet serving CSRs: pass failed"),
    () => this.stopped,
  );
  /** Failed writes tried again with a growing delay, per CSR. */
  private readonly retries = new CsrRetries(
    () => this.passes.queue(),
    () => this.stopped,
  );

  /**
   * `nodes`: an informer of the managed Nodes that keeps `status.addresses`, run by its owner, who
   * calls onNodeEvent() for each of its events; without it the approver runs its own.
   */
  constructor(o: { client: KubeClient; log: Logger; nodes?: Informer<NodeAddresses> }) {
    this.client = o.client;
    this.log = o.log;
    this.csrs = new Informer<Csr>({
      client: o.client,
      path: CSRS,
      fieldSelector: `spec.signerName=${KUBELET_SERVING_SIGNER}`,
      log: o.log,
      // The request PEM is what is judged; the issued certificate is not needed.
      trim: (c) => ({ metadata: c.metadata, spec: c.spec, status: { conditions: c.status?.conditions ?? [] } }),
      onEvent: (ev) => {
        if (ev.type === "DELETED") this.forget(ev.object.metadata.name);
        this.passes.queue();
      },
    });
    this.sharedNodes = o.nodes !== undefined;
    this.nodes =
      o.nodes ??
      new Informer<NodeAddresses>({
        client: o.client,
        path: "/api/v1/nodes",
        labelSelector: NODE_KEYS.group,
        log: o.log,
        // Only the addresses: a Node's status (images, conditions) would otherwise sit in memory.
        trim: (n) => ({
          metadata: { name: n.metadata.name, resourceVersion: n.metadata.resourceVersion },
          status: { addresses: n.status?.addresses ?? [] },
        }),
        onEvent: (ev) => this.onNodeEvent(ev),
      });
  }

  /**
   * A managed Node changed. The first list may come after the CSRs'; later, a node reporting its
   * addresses may be what a waiting CSR needs.
   */
  onNodeEvent(ev: InformerEvent<KubeObject>): void {
    if (ev.type === "SYNC" || this.waiting.size) this.passes.queue();
  }

  start(): void {
    if (!this.sharedNodes) this.nodes.run();
    this.csrs.run();
  }

  stop(): void {
    this.stopped = true;
    this.retries.clear();
    this.csrs.stop();
    if (!this.sharedNodes) this.nodes.stop();
  }

  private forget(name: string): void {
    this.waiting.delete(name);
    this.retries.forget(name);
  }

  private async pass(): Promise<void> {
    if (!this.nodes.synced || !this.csrs.synced || this.stopped) return;
    const pending = [...this.csrs.objects.values()].filter((c) => {
      if (!isDecided(c)) return true;
      this.forget(c.metadata.name);
      return false;
    });
    if (!pending.length) return;
    const known: Known = {
      addressOwners: this.addressOwners(),
      endpoints: await this.clusterEndpoints(),
      services: await this.serviceNames(pending),
    };
    for (const c of pending) await this.decide(c, known);
  }

  private addressOwners(): Map<string, Set<string>> {
    const owners = new Map<string, Set<string>>();
    for (const n of this.nodes.objects.values()) {
      for (const a of n.status?.addresses ?? []) {
        const key = canonicalAddress(a.address);
        if (key === undefined) continue;
        const set = owners.get(key) ?? new Set<string>();
        set.add(n.metadata.name);
        owners.set(key, set);
      }
    }
    return owners;
  }

  /** Where the cluster side serves and nodes dial (cluster-endpoints.ts), read again each minute. */
  private async clusterEndpoints(): Promise<Known["endpoints"]> {
    if (this.endpoints && Date.now() - this.endpoints.at < API_ADDRESSES_TTL_MS) return this.endpoints.value;
    try {
      const e = await clusterEndpoints(this.client);
      const value = {
        ips: new Set(e.ips.map(canonicalAddress).filter((a): a is string => !!a)),
        names: new Set(e.names),
      };
      this.endpoints = { value, at: Date.now() };
      return value;
    } catch (err) {
      this.log.warn(
        { err: (err as Error).message },
        "cannot read the API server's addresses; kubelet serving CSRs wait",
      );
      return undefined;
    }
  }

  /**
   * For each single-label name the pending CSRs ask for, the Service that has it (in any
   * namespace), looked up now: a lookup per name, by field selector, across namespaces.
   */
  private async serviceNames(pending: Csr[]): Promise<Map<string, string | null>> {
    const out = new Map<string, string | null>();
    for (const name of new Set(pending.flatMap(singleLabelNames))) {
      try {
        const r = await this.client.request<{ items?: { metadata: { name: string; namespace?: string } }[] }>(
          "GET",
          "/api/v1/services",
          { query: { fieldSelector: `metadata.name=${name}`, limit: "1" } },
        );
        const svc = r.items?.[0];
        out.set(name, svc ? `${svc.metadata.namespace}/${svc.metadata.name}` : null);
      } catch (err) {
        this.log.warn({ name, err: (err as Error).message }, "cannot look up Services by name; the CSR waits");
      }
    }
    return out;
  }

  private async decide(csr: Csr, known: Known): Promise<void> {
    const name = csr.metadata.name;
    try {
      const nodeName = (csr.spec.username ?? "").slice(NODE_USER_PREFIX.length);
      const v = judge(csr, this.nodes.objects.get(nodeName), known);
      if (v.verdict === "wait") {
        if (this.waiting.get(name) !== v.reason)
          this.log.info({ csr: name, reason: v.reason }, "kubelet serving CSR waits");
        this.waiting.set(name, v.reason);
        return;
      }
      this.waiting.delete(name);
      await decideCsr(
        this.client,
        csr,
        v.verdict === "approve"
          ? {
              approve: true,
              reason: "AutoApproved",
              message: `bashible: its names are the node's own and its addresses ones only Node ${v.node} reports`,
            }
          : { approve: false, reason: "NotAKubeletServingRequest", message: `bashible: ${v.reason}` },
      );
      this.forget(name);
      if (v.verdict === "approve") this.log.info({ csr: name, node: v.node }, "kubelet serving CSR approved");
      else this.log.warn({ csr: name, reason: v.reason }, "kubelet serving CSR denied");
    } catch (err) {
      if (isNotFound(err)) return this.forget(name);
      // A conflict: the CSR changed meanwhile; its event may have come during this pass.
      if (!isConflict(err))
        this.log.warn({ csr: name, err: (err as Error).message }, "cannot decide a kubelet serving CSR; retrying");
      this.retries.later(name);
    }
  }
}
