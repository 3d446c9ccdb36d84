// Kubelet serving certificates. The kubelet (serverTLSBootstrap) asks for its serving
// certificate with a CSR for signer kubernetes.io/kubelet-serving, which nothing in Kubernetes
// approves; until one is approved the API server cannot reach the kubelet over verified TLS, so
// `kubectl logs`, `exec`, `port-forward` and metrics fail for the node. Deckhouse's node-manager
// approves such CSRs after checking their form. This controller checks the same form, and also
// what the certificate would vouch for: every name and address in it must be one its Node
// reports, none may be reported by another managed Node, and no in-cluster Service name. The
// kube-controller-manager signs with the cluster CA, often the API server's own CA: a node that
// got a serving certificate for another machine's address could pose as that machine.
import { isIPv6 } from "node:net";
import type { KubeClient } from "../../lib/kube/client.ts";
import type { Logger } from "../../lib/log/log.ts";
import type { KubeObject } from "../../lib/kube/api.ts";
import { isConflict, isNotFound } from "../../lib/kube/errors.ts";
import { Informer } from "../../lib/informer.ts";
import { parseCsr, type CsrInfo } from "../../lib/pkcs10.ts";
import { NODE_KEYS } from "../../bundles/names.ts";

export const KUBELET_SERVING_SIGNER = "kubernetes.io/kubelet-serving";
const CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
const NODE_USER_PREFIX = "system:node:";

export interface Csr extends KubeObject {
  spec: {
    request: string;
    signerName: string;
    username?: string;
    groups?: string[];
    usages?: string[];
    expirationSeconds?: number;
  };
  status?: { conditions?: { type: string; status?: string }[]; certificate?: string };
}

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

/** Addresses compared as the kernel would route them: IPv6 in one canonical spelling, names case-insensitively. */
export function canonicalAddress(a: string): string {
  if (isIPv6(a)) return new URL(`http://[${a}]/`).hostname.slice(1, -1);
  return a.toLowerCase();
}

/** Names of in-cluster Services: `kubernetes`, `kubernetes.default`, anything under `.svc`. */
const SERVICE_NAME = /^kubernetes(\.default)?$|(^|\.)svc(\.|$)/;

export function isDecided(csr: Csr): boolean {
  if (csr.status?.certificate) return true;
  return (csr.status?.conditions ?? []).some((c) => c.type === "Approved" || c.type === "Denied");
}

/**
 * The decision for one kubelet-serving CSR. `node` is the requesting Node (undefined when it is
 * not a managed Node or not registered yet); `addressOwners` maps every canonical address a managed
 * Node reports to the Nodes reporting it.
 */
export function judge(
  csr: Csr,
  node: NodeAddresses | undefined,
  addressOwners: ReadonlyMap<string, ReadonlySet<string>>,
): Verdict {
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
  const sans = [...info.dnsNames, ...info.ipAddresses];
  if (!sans.length) return { verdict: "deny", reason: "it names no DNS name or IP address" };
  const service = info.dnsNames.find((d) => SERVICE_NAME.test(d.toLowerCase()));
  if (service) return { verdict: "deny", reason: `${service} is an in-cluster Service name` };

  const nodeName = user.slice(NODE_USER_PREFIX.length);
  for (const san of sans) {
    const others = [...(addressOwners.get(canonicalAddress(san)) ?? [])].filter((n) => n !== nodeName);
    if (others.length) return { verdict: "deny", reason: `${san} is an address of Node ${others.sort().join(", ")}` };
  }
  if (!node) return { verdict: "wait", reason: `Node ${nodeName} is not a registered node of a node group (yet)` };
  const own = new Set((node.status?.addresses ?? []).map((a) => canonicalAddress(a.address)));
  const foreign = sans.filter((s) => !own.has(canonicalAddress(s)));
  if (foreign.length) {
    return {
      verdict: "wait",
      reason: `${foreign.join(", ")} not among the addresses Node ${nodeName} reports (${[...own].join(", ") || "none yet"})`,
    };
  }
  return { verdict: "approve", node: nodeName };
}

export class KubeletServingApprover {
  private readonly client: KubeClient;
  private readonly log: Logger;
  private readonly csrs: Informer<Csr>;
  private readonly nodes: Informer<NodeAddresses>;
  /** Pending CSRs that wait for their Node, with the last reason logged (logged once per reason). */
  private readonly waiting = new Map<string, string>();
  private readonly busy = new Set<string>();
  private readonly retries = new Set<NodeJS.Timeout>();
  private stopped = false;

  constructor(o: { client: KubeClient; log: Logger }) {
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
        if (ev.type === "SYNC") this.judgeAll();
        else if (ev.type === "DELETED") this.waiting.delete(ev.object.metadata.name);
        else void this.decide(ev.object);
      },
    });
    this.nodes = new Informer<NodeAddresses>({
      client: o.client,
      path: "/api/v1/nodes",
      labelSelector: NODE_KEYS.group,
      log: o.log,
      // Only the addresses: a Node's status (images, conditions) would otherwise sit in memory.
      trim: (n) => ({
        metadata: { name: n.metadata.name, resourceVersion: n.metadata.resourceVersion },
        status: { addresses: n.status?.addresses ?? [] },
      }),
      // A node reporting its addresses may be what a waiting CSR needs.
      onEvent: () => {
        if (this.waiting.size) this.judgeAll();
      },
    });
  }

  start(): void {
    this.nodes.run();
    this.csrs.run();
  }

  stop(): void {
    this.stopped = true;
    for (const t of this.retries) clearTimeout(t);
    this.csrs.stop();
    this.nodes.stop();
  }

  private judgeAll(): void {
    if (!this.nodes.synced || !this.csrs.synced) return;
    for (const c of this.csrs.objects.values()) void this.decide(c);
  }

  private addressOwners(): Map<string, Set<string>> {
    const owners = new Map<string, Set<string>>();
    for (const n of this.nodes.objects.values()) {
      for (const a of n.status?.addresses ?? []) {
        const key = canonicalAddress(a.address);
        const set = owners.get(key) ?? new Set<string>();
        set.add(n.metadata.name);
        owners.set(key, set);
      }
    }
    return owners;
  }

  /** Another try in 5 s with the CSR as it is then (no watch event may come for a failed write). */
  private retryLater(name: string): void {
    if (this.stopped) return;
    const t = setTimeout(() => {
      this.retries.delete(t);
      const csr = this.csrs.objects.get(name);
      if (csr && !this.stopped) void this.decide(csr);
    }, 5000);
    t.unref();
    this.retries.add(t);
  }

  private async decide(csr: Csr): Promise<void> {
    const name = csr.metadata.name;
    // Judged against every managed Node's addresses: wait until both collections are listed.
    if (isDecided(csr) || !this.nodes.synced || this.busy.has(name)) return;
    const nodeName = (csr.spec.username ?? "").slice(NODE_USER_PREFIX.length);
    const v = judge(csr, this.nodes.objects.get(nodeName), this.addressOwners());
    if (v.verdict === "wait") {
      if (this.waiting.get(name) !== v.reason)
        this.log.info({ csr: name, reason: v.reason }, "kubelet serving CSR waits");
      this.waiting.set(name, v.reason);
      return;
    }
    this.waiting.delete(name);
    this.busy.add(name);
    const condition =
      v.verdict === "approve"
        ? {
            type: "Approved",
            status: "True",
            reason: "AutoApproved",
            message: `bashible: every name and address is one Node ${v.node} reports`,
          }
        : { type: "Denied", status: "True", reason: "NotAKubeletServingRequest", message: `bashible: ${v.reason}` };
    try {
      // The approval subresource takes the whole object; resourceVersion makes it a compare-and-swap.
      await this.client.request("PUT", `${CSRS}/${encodeURIComponent(name)}/approval`, {
        body: {
          apiVersion: "certificates.k8s.io/v1",
          kind: "CertificateSigningRequest",
          metadata: { name, resourceVersion: csr.metadata.resourceVersion },
          spec: csr.spec,
          status: {
            conditions: [...(csr.status?.conditions ?? []), { ...condition, lastUpdateTime: new Date().toISOString() }],
          },
        },
      });
      if (v.verdict === "approve") this.log.info({ csr: name, node: v.node }, "kubelet serving CSR approved");
      else this.log.warn({ csr: name, reason: v.reason }, "kubelet serving CSR denied");
    } catch (err) {
      // A conflict: the CSR changed meanwhile and its watch event brings it back here.
      if (!isConflict(err) && !isNotFound(err)) {
        this.log.warn({ csr: name, err: (err as Error).message }, "cannot decide a kubelet serving CSR; retrying");
        this.retryLater(name);
      }
    } finally {
      this.busy.delete(name);
    }
  }
}
