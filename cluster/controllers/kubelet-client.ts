// Kubelet client certificates from bootstrap tokens. With the kubelet's TLS bootstrap, the
// kubelet asks with its bootstrap token for a client certificate `system:node:<name>` (signer
// kubernetes.io/kube-apiserver-client-kubelet); kube-controller-manager's own approver would
// approve any such request from system:bootstrappers, so a token of group frontend could take
// the name of an existing node of group worker, or a new name it then registers in worker, and
// read worker's bundle. This approver decides them instead (kube-controller-manager's approval
// for bootstrappers is not bound, cluster/deploy/kubelet-bootstrap-rbac.yaml):
//
//   - a name no Node has: approved, after recording which group the token was for
//     (node-records.ts); the admission policy then lets that node register only in that group;
//   - a name a Node has: approved only for the same machine re-bootstrapping, proven by the key:
//     the kubelet reuses the key of its current certificate when that expired, so the request's
//     public key equals the one of the newest client certificate the cluster issued for the
//     name (recorded as it is issued), and the token is for the Node's own group;
//   - a name a bootstrap of another group was just given (no Node yet): denied.
//
// Renewals (requested by system:node:<name> itself, with its current certificate) are left to
// kube-controller-manager (selfnodeclient), as are requests from anyone who is not a bootstrap
// token. Decisions are logged and written into the CSR's condition (`kubectl describe csr`).
import { CoalescedPass } from "./coalesced-pass.ts";
import { X509Certificate } from "node:crypto";
import type { KubeClient } from "../../lib/kube/client.ts";
import type { Logger } from "../../lib/log/log.ts";
import type { KubeObject } from "../../lib/kube/api.ts";
import { isConflict, isNotFound } from "../../lib/kube/errors.ts";
import { Informer } from "../../lib/informer.ts";
import { csrPublicKeyInfo, parseCsr } from "../../lib/pkcs10.ts";
import { BOOTSTRAP_TOKEN_GROUP_LABEL, CONFIGMAPS, NAMESPACE, NODE_KEYS } from "../../bundles/names.ts";
import { BOOTSTRAP_GROUP, BOOTSTRAP_USER_PREFIX, tokenScope } from "../bootstrap-scope.ts";
import { CSRS, type Csr, CsrRetries, decideCsr, isDecided } from "./csr-approval.ts";
import type { NodeCache } from "./node-cache.ts";
import { formatIssuedKey, keyFingerprint, parseIssuedKey, RecordMap, RecordsFullError } from "./node-records.ts";

export const KUBELET_CLIENT_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet";
const NODE_CN_PREFIX = "system:node:";
/** A Node name: a DNS subdomain. */
const NODE_NAME = /^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
/** What the kubelet asks for (RSA keys add key encipherment): exactly one of these sets. */
const USAGE_SETS = [
  ["client auth", "digital signature"],
  ["client auth", "digital signature", "key encipherment"],
];
/** How long a name's records outlive its Node (a deleted Node's kubelet may register it again). */
export const RECORD_GRACE_MS = 60 * 60_000;
const SWEEP_MS = 5 * 60_000;
/** kube-controller-manager's message when it approves through the `nodeclient` permission. */
const KCM_NODECLIENT_MESSAGE = "Auto approving kubelet client certificate after SubjectAccessReview.";

/** The CSR as the informer keeps it: the request to judge, or the issued certificate's key. */
interface TrimmedCsr extends Csr {
  issued?: { node: string; issuedAt: number; fingerprint: string };
}

export type ClientVerdict =
  | { verdict: "approve"; node: string; group: string; because: string }
  | { verdict: "deny"; reason: string }
  | { verdict: "wait"; reason: string };

/** What the request asks for, once its form is a kubelet client certificate's. */
export interface ClientRequest {
  node: string;
  /** keyFingerprint() of the request's public key. */
  key: string;
}

/** The form of a kubelet client CSR (the API server checks it too; this names what is wrong). */
export function readClientRequest(csr: Csr): ClientRequest | { deny: string } {
  let info: ReturnType<typeof parseCsr>;
  let key: string;
  try {
    const der = Buffer.from(csr.spec.request, "base64");
    info = parseCsr(der);
    key = keyFingerprint(csrPublicKeyInfo(der));
  } catch (err) {
    return { deny: `the request is not a valid PKCS#10 CSR: ${(err as Error).message}` };
  }
  const cn = info.commonName ?? "";
  const node = cn.startsWith(NODE_CN_PREFIX) ? cn.slice(NODE_CN_PREFIX.length) : "";
  if (!NODE_NAME.test(node)) return { deny: `its common name ${JSON.stringify(cn)} is not system:node:<node name>` };
  if (info.organizations.length !== 1 || info.organizations[0] !== "system:nodes")
    return { deny: `its organization must be exactly system:nodes, not ${JSON.stringify(info.organizations)}` };
  if (
    info.dnsNames.length ||
    info.ipAddresses.length ||
    info.emailAddresses.length ||
    info.uris.length ||
    info.otherSanKinds
  )
    return { deny: "a client certificate names no DNS names, addresses or other names" };
  const usages = [...(csr.spec.usages ?? [])].sort();
  if (!USAGE_SETS.some((set) => set.length === usages.length && set.every((u, i) => u === usages[i])))
    return { deny: `usages ${JSON.stringify(csr.spec.usages ?? [])} are not a kubelet client certificate's` };
  return { node, key };
}

/** What the cluster says about the name, read just before the decision. */
export interface NameFacts {
  /** The group the token is for ("" for a token of no node group). */
  tokenGroup: string;
  /** The Node of that name, when one exists: its group label ("" without). */
  existing?: { group: string };
  /** What an earlier bootstrap recorded for the name, when anything. */
  recordedGroup?: string;
  /** The newest client certificate issued for the name: its key's fingerprint. */
  recordedKey?: string;
}

const groupText = (g: string) => (g ? `node group ${g}` : "no node group");

/** The decision for one bootstrap CSR whose form is right. */
export function judgeBootstrap(req: ClientRequest, f: NameFacts): ClientVerdict {
  const { node } = req;
  if (f.existing) {
    if (req.key !== f.recordedKey) {
      return {
        verdict: "deny",
        reason: `Node ${node} exists (${groupText(f.existing.group)}) and this request does not prove it is that machine (its key is not the one of the newest certificate issued to ${node}); a bootstrap token cannot take an existing node's name. If the machine was reinstalled, delete the Node first (kubectl delete node ${node})`,
      };
    }
    if (f.existing.group !== f.tokenGroup) {
      return {
        verdict: "deny",
        reason: `the key is Node ${node}'s, but the bootstrap token is for ${groupText(f.tokenGroup)} and the Node is in ${groupText(f.existing.group)}`,
      };
    }
    return {
      verdict: "approve",
      node,
      group: f.tokenGroup,
      because: `Node ${node} re-bootstrapping: the request carries the key of its newest client certificate`,
    };
  }
  if (f.recordedGroup !== undefined && f.recordedGroup !== f.tokenGroup) {
    return {
      verdict: "deny",
      reason: `the name ${node} was given to a bootstrap of ${groupText(f.recordedGroup)} and no Node has it yet; a token for ${groupText(f.tokenGroup)} cannot take it (it is free again an hour after no Node has it)`,
    };
  }
  return {
    verdict: "approve",
    node,
    group: f.tokenGroup,
    because: `a new node name, for a bootstrap token of ${groupText(f.tokenGroup)}`,
  };
}

/** The newest issued certificate's key, from a CSR that has one. */
function issuedKey(c: Csr): TrimmedCsr["issued"] {
  const pem = c.status?.certificate;
  if (!pem) return undefined;
  try {
    const cert = new X509Certificate(Buffer.from(pem, "base64"));
    const cn = /^CN=(.*)$/m.exec(cert.subject)?.[1] ?? "";
    if (!cn.startsWith(NODE_CN_PREFIX)) return undefined;
    const der = cert.publicKey.export({ type: "spki", format: "der" });
    return {
      node: cn.slice(NODE_CN_PREFIX.length),
      issuedAt: Math.floor(Date.parse(cert.validFrom) / 1000),
      fingerprint: keyFingerprint(der),
    };
  } catch {
    return undefined;
  }
}

interface NodeName extends KubeObject {
  metadata: KubeObject["metadata"] & { labels?: Record<string, string> };
}

export class KubeletClientApprover {
  private readonly client: KubeClient;
  private readonly log: Logger;
  private readonly namespace: string;
  private readonly csrs: Informer<TrimmedCsr>;
  /** Every Node: the NodeCache the operator controllers run (one watch of all Nodes for both). */
  private readonly nodes: NodeCache;
  private unsubscribe: (() => void) | undefined;
  private readonly groups: RecordMap;
  private readonly keys: RecordMap;
  private readonly now: () => number;
  /** Names with records but no Node, since when (this leader's view). */
  private readonly absentSince = new Map<string, number>();
  /** Pending CSRs that wait, with the last reason logged (logged once per reason). */
  private readonly waiting = new Map<string, string>();
  /** CSRs kube-controller-manager approved itself, already reported. */
  private readonly bypassReported = new Set<string>();
  private sweepTimer: NodeJS.Timeout | undefined;
  private stopped = false;
  /** One pass over the pending CSRs for a burst of events; never two at once. */
  private readonly passes = new CoalescedPass(
    () => this.pass(),
    (err) => this.log.warn({ err: err.message }, "kubelet client CSRs: pass failed"),
    () => this.stopped,
  );
  /** Failed writes (and waiting CSRs) tried again with a growing delay, per CSR. */
  private readonly retries = new CsrRetries(
    () => this.passes.queue(),
    () => this.stopped,
  );

  constructor(o: { client: KubeClient; log: Logger; nodes: NodeCache; namespace?: string; now?: () => number }) {
    this.client = o.client;
    this.nodes = o.nodes;
    this.log = o.log;
    this.namespace = o.namespace ?? NAMESPACE;
    this.now = o.now ?? Date.now;
    this.groups = new RecordMap(o.client, this.namespace, CONFIGMAPS.nodeGroups);
    this.keys = new RecordMap(o.client, this.namespace, CONFIGMAPS.nodeClientKeys);
    this.csrs = new Informer<TrimmedCsr>({
      client: o.client,
      path: CSRS,
      fieldSelector: `spec.signerName=${KUBELET_CLIENT_SIGNER}`,
      log: o.log,
      // The request to judge, or (once issued) only the certificate's key: not the certificate.
      trim: (c) => ({
        metadata: c.metadata,
        spec: c.spec,
        status: { conditions: c.status?.conditions ?? [] },
        ...(c.status?.certificate ? { issued: issuedKey(c) } : {}),
      }),
      onEvent: (ev) => {
        if (ev.type === "DELETED") this.forget(ev.object.metadata.name);
        this.passes.queue();
      },
    });
  }

  /** Before the NodeCache starts, so its first list (SYNC) sweeps. */
  start(): void {
    this.unsubscribe = this.nodes.subscribe((ev) => {
      if (ev.type === "SYNC") void this.sweep();
    });
    this.csrs.run();
    void this.checkNoOtherApprover();
    this.sweepTimer = setInterval(() => void this.sweep(), SWEEP_MS);
    this.sweepTimer.unref();
  }

  stop(): void {
    this.stopped = true;
    clearInterval(this.sweepTimer);
    this.retries.clear();
    this.csrs.stop();
    this.unsubscribe?.();
  }

  /**
   * Whether kube-controller-manager would approve bootstrap CSRs itself (a binding of
   * certificatesigningrequests/nodeclient for bootstrappers, as kubeadm makes one): then any
   * token could take any name before this approver looks, and the operator must know.
   */
  private async checkNoOtherApprover(): Promise<void> {
    try {
      const r = await this.client.request<{ status?: { allowed?: boolean } }>(
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {
          body: {
            apiVersion: "authorization.k8s.io/v1",
            kind: "SubjectAccessReview",
            spec: {
              user: `${BOOTSTRAP_USER_PREFIX}probe0`,
              groups: ["system:bootstrappers", BOOTSTRAP_GROUP, `${BOOTSTRAP_GROUP}:probe`, "system:authenticated"],
              resourceAttributes: {
                group: "certificates.k8s.io",
                resource: "certificatesigningrequests",
                subresource: "nodeclient",
                verb: "create",
              },
            },
          },
        },
      );
      if (r.status?.allowed) this.reportBypass("the RBAC check");
    } catch (err) {
      this.log.warn(
        { err: (err as Error).message },
        "cannot check whether kube-controller-manager approves bootstrap CSRs itself (SubjectAccessReview)",
      );
    }
  }

  private reportBypass(where: string): void {
    this.log.error(
      { found: where },
      "kube-controller-manager approves kubelet client CSRs of bootstrap tokens itself (a ClusterRoleBinding grants certificatesigningrequests/nodeclient to system:bootstrappers, e.g. kubeadm:node-autoapprove-bootstrap): any bootstrap token can take any node name past the node-group scope; delete that binding (docs/cluster.md, Trust model)",
    );
  }

  private forget(name: string): void {
    this.waiting.delete(name);
    this.retries.forget(name);
  }

  private async pass(): Promise<void> {
    if (!this.csrs.synced || this.stopped) return;
    await this.recordIssuedKeys();
    for (const c of this.csrs.objects.values()) {
      if (this.stopped) return;
      const bootstrap = (c.spec.username ?? "").startsWith(BOOTSTRAP_USER_PREFIX);
      if (!bootstrap) continue;
      if (isDecided(c)) {
        this.forget(c.metadata.name);
        const approvedByKcm = (c.status?.conditions ?? []).some(
          (x) => x.type === "Approved" && x.message === KCM_NODECLIENT_MESSAGE,
        );
        if (approvedByKcm && !this.bypassReported.has(c.metadata.name)) {
          this.bypassReported.add(c.metadata.name);
          this.reportBypass(`CSR ${c.metadata.name}`);
        }
        continue;
      }
      await this.decide(c);
    }
  }

  /** Every issued kubelet client certificate's key, newest per name, into the keys record. */
  private async recordIssuedKeys(): Promise<void> {
    const newest = new Map<string, { issuedAt: number; fingerprint: string }>();
    for (const c of this.csrs.objects.values()) {
      const i = c.issued;
      if (!i) continue;
      const cur = newest.get(i.node);
      if (!cur || i.issuedAt > cur.issuedAt) newest.set(i.node, i);
    }
    if (!newest.size) return;
    try {
      await this.keys.update((data) => {
        let changed = false;
        for (const [node, k] of newest) {
          const recorded = parseIssuedKey(data[node]);
          if (recorded && recorded.issuedAt >= k.issuedAt) continue;
          data[node] = formatIssuedKey(k);
          changed = true;
        }
        return changed;
      });
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, "cannot record issued kubelet client certificates; retrying");
      this.retries.later("(issued keys)");
    }
  }

  /** The group a bootstrap token is for: "" for none; undefined with a reason to wait or deny. */
  private async tokenGroup(csr: Csr): Promise<{ group: string } | { deny: string } | { wait: string }> {
    const scope = tokenScope(csr.spec.username ?? "", csr.spec.groups ?? []);
    if (scope.groups.size > 1) {
      return {
        deny: `its bootstrap token is scoped to several node groups (${[...scope.groups].sort().join(", ")}): a node belongs to one`,
      };
    }
    if (scope.groups.size === 1) return { group: [...scope.groups][0]! };
    if (!scope.lookupTokenId) return { group: "" };
    try {
      const s = await this.client.request<{ metadata: { labels?: Record<string, string> } }>(
        "GET",
        `/api/v1/namespaces/kube-system/secrets/bootstrap-token-${encodeURIComponent(scope.lookupTokenId)}`,
      );
      const g = s.metadata.labels?.[BOOTSTRAP_TOKEN_GROUP_LABEL];
      return g
        ? { group: g }
        : { deny: `its bootstrap token's Secret has no label ${BOOTSTRAP_TOKEN_GROUP_LABEL}: it names no node group` };
    } catch (err) {
      if (isNotFound(err))
        return { deny: "its bootstrap token's Secret is gone: which node group it was for is unknown" };
      return { wait: `cannot read its bootstrap token's Secret: ${(err as Error).message}` };
    }
  }

  private async decide(csr: Csr): Promise<void> {
    const name = csr.metadata.name;
    const wait = (reason: string) => {
      if (this.waiting.get(name) !== reason) this.log.info({ csr: name, reason }, "kubelet client CSR waits");
      this.waiting.set(name, reason);
      this.retries.later(name);
    };
    try {
      const req = readClientRequest(csr);
      let v: ClientVerdict;
      if ("deny" in req) v = { verdict: "deny", reason: req.deny };
      else {
        const token = await this.tokenGroup(csr);
        if ("wait" in token) return wait(token.wait);
        if ("deny" in token) v = { verdict: "deny", reason: token.deny };
        else {
          // Read now, from the API server: whether the name is taken must not come from a cache.
          const existing = await this.client
            .request<NodeName>("GET", `/api/v1/nodes/${encodeURIComponent(req.node)}`)
            .catch((err) => (isNotFound(err) ? undefined : Promise.reject(err)));
          const [groups, keys] = await Promise.all([this.groups.read(), this.keys.read()]);
          const recordedKey = parseIssuedKey(keys[req.node])?.fingerprint;
          v = judgeBootstrap(req, {
            tokenGroup: token.group,
            ...(existing ? { existing: { group: existing.metadata.labels?.[NODE_KEYS.group] ?? "" } } : {}),
            ...(groups[req.node] !== undefined ? { recordedGroup: groups[req.node] } : {}),
            ...(recordedKey ? { recordedKey } : {}),
          });
        }
      }
      if (v.verdict === "wait") return wait(v.reason);
      if (v.verdict === "approve") {
        const { node, group } = v;
        // The record first: the node registers moments after its certificate is issued.
        await this.groups.update((data) => {
          if (data[node] === group) return false;
          data[node] = group;
          return true;
        });
        this.absentSince.delete(node);
      }
      await decideCsr(
        this.client,
        csr,
        v.verdict === "approve"
          ? { approve: true, reason: "AutoApproved", message: `bashible: ${v.because}` }
          : { approve: false, reason: "NodeNameNotGranted", message: `bashible: ${v.reason}` },
      );
      this.forget(name);
      if (v.verdict === "approve") {
        this.log.info({ csr: name, node: v.node, group: v.group, because: v.because }, "kubelet client CSR approved");
      } else this.log.warn({ csr: name, user: csr.spec.username, reason: v.reason }, "kubelet client CSR denied");
    } catch (err) {
      if (isNotFound(err)) return this.forget(name);
      if (err instanceof RecordsFullError) return wait(err.message);
      if (!isConflict(err))
        this.log.warn({ csr: name, err: (err as Error).message }, "cannot decide a kubelet client CSR; retrying");
      this.retries.later(name);
    }
  }

  /** Drops the records of names no Node has had for RECORD_GRACE_MS. */
  private async sweep(): Promise<void> {
    if (!this.nodes.synced || this.stopped) return;
    try {
      const [groups, keys] = await Promise.all([this.groups.read(), this.keys.read()]);
      const now = this.now();
      const expired = new Set<string>();
      for (const name of new Set([...Object.keys(groups), ...Object.keys(keys)])) {
        if (this.nodes.has(name)) {
          this.absentSince.delete(name);
          continue;
        }
        const since = this.absentSince.get(name) ?? now;
        this.absentSince.set(name, since);
        if (now - since >= RECORD_GRACE_MS) expired.add(name);
      }
      if (!expired.size) return;
      const drop = (data: Record<string, string>) => {
        let changed = false;
        for (const name of expired) {
          // Still absent as of now (a Node may have registered since the list).
          if (name in data && !this.nodes.has(name)) {
            delete data[name];
            changed = true;
          }
        }
        return changed;
      };
      await this.groups.update(drop);
      await this.keys.update(drop);
      for (const name of expired) this.absentSince.delete(name);
      this.log.info({ names: [...expired].sort() }, "records of node names no Node has had for an hour dropped");
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, "cannot sweep the node name records; next sweep in 5 minutes");
    }
  }
}
