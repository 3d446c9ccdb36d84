// Who may read metrics: the check kube-rbac-proxy makes in front of Deckhouse's daemons, and the
// kubelet on its own /metrics. A bearer token the API server accepts (TokenReview) whose user
// may do what the listener asks (SubjectAccessReview): `get` `nodes/metrics` of its node for the
// node agent (both reviews made with the kubelet's credentials: the Node authorizer lets a node
// create both), `get` on the non-resource `/metrics` for the bundle server (with its
// ServiceAccount, bound to system:auth-delegator). Decisions are cached for a minute,
// in a bounded cache keyed by the token's hash (the token itself is not kept, nor ever logged).
import { createHash } from "node:crypto";
import type { KubeClient } from "./kube/client.ts";

/** 200 serve, 401 no or invalid token, 403 not allowed, 503 the API server could not decide. */
export type Verdict = 200 | 401 | 403 | 503;

/** The token of an `Authorization: Bearer <token>` header; undefined for anything else. */
export function bearerToken(header: string | undefined): string | undefined {
  const m = /^Bearer +([!-~]+) *$/i.exec(header ?? "");
  return m?.[1];
}

export interface ReviewedUser {
  username?: string;
  uid?: string;
  groups?: string[];
  extra?: Record<string, string[]>;
}

/** TokenReview status → the user to ask about, or undefined (401). */
export function authenticatedUser(status: { authenticated?: boolean; user?: ReviewedUser } | undefined) {
  return status?.authenticated === true && status.user?.username ? status.user : undefined;
}

/** The access the kubelet asks for its /metrics: get nodes/metrics of this node. */
export const nodeMetricsAccess = (node: string): Access => ({
  resourceAttributes: { verb: "get", group: "", resource: "nodes", subresource: "metrics", name: node },
});

/** The SubjectAccessReview asking whether `user` has `access`. */
export function accessReview(user: ReviewedUser, access: Access) {
  return {
    apiVersion: "authorization.k8s.io/v1",
    kind: "SubjectAccessReview",
    spec: {
      user: user.username,
      uid: user.uid,
      groups: user.groups,
      extra: user.extra,
      ...access,
    },
  };
}

/** What a reviewed user must be allowed: the attributes of its SubjectAccessReview. */
export interface Access {
  resourceAttributes?: Record<string, string>;
  nonResourceAttributes?: { verb: string; path: string };
}

/** `get` on a non-resource path (what kube-rbac-proxy asks by default). */
export const nonResourceAccess = (p: string): Access => ({ nonResourceAttributes: { verb: "get", path: p } });

/** SubjectAccessReview status → 200 or 403 (a denial, an error or no answer all deny). */
export const accessVerdict = (status: { allowed?: boolean } | undefined): Verdict =>
  status?.allowed === true ? 200 : 403;

/** At most `max` entries, each for `ttlMs`; the oldest goes first when full. */
export class DecisionCache<V> {
  private readonly entries = new Map<string, { value: V; until: number }>();
  readonly max: number;
  readonly ttlMs: number;
  private readonly now: () => number;
  constructor(max = 1024, ttlMs = 60_000, now: () => number = Date.now) {
    this.max = max;
    this.ttlMs = ttlMs;
    this.now = now;
  }
  get(key: string): V | undefined {
    const e = this.entries.get(key);
    if (!e) return undefined;
    if (e.until > this.now()) return e.value;
    this.entries.delete(key);
    return undefined;
  }
  set(key: string, value: V): void {
    this.entries.delete(key);
    while (this.entries.size >= this.max) {
      const oldest = this.entries.keys().next().value as string;
      this.entries.delete(oldest);
    }
    this.entries.set(key, { value, until: this.now() + this.ttlMs });
  }
  delete(key: string): void {
    this.entries.delete(key);
  }
  get size(): number {
    return this.entries.size;
  }
}

const REVIEW_TIMEOUT_MS = 5000;

/**
 * Decides a request by its Authorization header. Concurrent requests with one token share one
 * pair of reviews; a review the API server could not answer is not cached (503, asked again).
 */
export class MetricsAuthorizer {
  private readonly cache: DecisionCache<Promise<Verdict>>;
  private readonly o: { kube: () => KubeClient | undefined; access: Access };
  constructor(o: { kube: () => KubeClient | undefined; access: Access; cache?: DecisionCache<Promise<Verdict>> }) {
    this.o = o;
    this.cache = o.cache ?? new DecisionCache();
  }

  check(authorization: string | undefined): Promise<Verdict> {
    const token = bearerToken(authorization);
    if (!token) return Promise.resolve(401);
    const key = createHash("sha256").update(token).digest("hex");
    const known = this.cache.get(key);
    if (known) return known;
    const decided = this.review(token).then(
      (v) => {
        if (v === 503) this.cache.delete(key);
        return v;
      },
      () => {
        this.cache.delete(key);
        return 503 as const;
      },
    );
    this.cache.set(key, decided);
    return decided;
  }

  /** Why the last review failed, for the listener's log (no token in it). */
  lastError: string | undefined;

  private async review(token: string): Promise<Verdict> {
    const kube = this.o.kube();
    if (!kube) {
      this.lastError = "no connection to the API server yet";
      return 503;
    }
    try {
      const tr = await kube.request<{ status?: { authenticated?: boolean; user?: ReviewedUser } }>(
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        {
          body: { apiVersion: "authentication.k8s.io/v1", kind: "TokenReview", spec: { token } },
          timeoutMs: REVIEW_TIMEOUT_MS,
        },
      );
      const user = authenticatedUser(tr.status);
      if (!user) return 401;
      const sar = await kube.request<{ status?: { allowed?: boolean } }>(
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        { body: accessReview(user, this.o.access), timeoutMs: REVIEW_TIMEOUT_MS },
      );
      this.lastError = undefined;
      return accessVerdict(sar.status);
    } catch (err) {
      this.lastError = (err as Error).message;
      return 503;
    }
  }
}
