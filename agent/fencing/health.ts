// "Does this node reach the Kubernetes API?": one cheap authenticated request with a deadline,
// the failure sorted into the kinds lib/kube/errors.ts knows. The request is a GET of this
// node's own kubelet Lease: a few hundred bytes, authorized for the node by the Node authorizer,
// and it tells how long ago the kubelet last renewed, which is what the cluster side fences on.
// It goes out on the check's own connection (lease-probe.ts).
import { KubeError, KubeStatusError } from "../../lib/kube/errors.ts";
import type { Clock } from "./clock.ts";
import { jsonOf, type LeaseProbe } from "./lease-probe.ts";

/** The request path of a node's kubelet Lease. */
export const leasePath = (nodeName: string) =>
  `/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/${encodeURIComponent(nodeName)}`;

export type ApiResult =
  /** A 2xx answer. */
  | "ok"
  /** 401/403: the API server answered, the credentials did not pass (e.g. right after a rotation). */
  | "auth"
  /** 404: the server answered; the kubelet has not created its Lease (yet). */
  | "no-lease"
  | "server-error"
  | "other-status"
  | "timeout"
  | "refused"
  | "tls"
  | "network"
  /** No client at all (no credentials yet). */
  | "no-client"
  /** Told to peers: a check has waited for more than half its deadline (the API is hanging here). */
  | "pending";

export interface ApiCheck {
  result: ApiResult;
  /** The node reached the API server's HTTP layer (any answer with a status counts). */
  reached: boolean;
  at: number;
  durationMs: number;
  /** Short message for logs and status; never a credential. */
  detail?: string;
  /** Seconds since the kubelet last renewed this node's Lease (when read). */
  kubeletLeaseAgeSeconds?: number;
  /** When the kubelet last renewed it (epoch ms, the kubelet's clock: this machine's). */
  kubeletLeaseRenewedAt?: number;
}

/** Whether an answer shows the node is connected to a working API server. */
export const reachedApi = (r: ApiResult) => r === "ok" || r === "auth" || r === "no-lease";

export function classify(err: unknown): { result: ApiResult; detail: string } {
  if (err instanceof KubeStatusError) {
    const result: ApiResult =
      err.status === 401 || err.status === 403
        ? "auth"
        : err.status === 404
          ? "no-lease"
          : err.status >= 500
            ? "server-error"
            : "other-status";
    return { result, detail: `${err.status} ${err.reason}`.trim() };
  }
  if (err instanceof KubeError) {
    const result = err.kind === "status" ? "other-status" : err.kind;
    return { result, detail: err.message };
  }
  return { result: "network", detail: (err as Error)?.message ?? String(err) };
}

/** `probe`: the node's Lease on the current credentials (undefined: there are none). */
export async function checkApi(probe: LeaseProbe | undefined, timeoutMs: number, now: Clock): Promise<ApiCheck> {
  const at = now();
  if (!probe) return { result: "no-client", reached: false, at, durationMs: 0, detail: "no cluster credentials" };
  try {
    const lease = jsonOf<{ spec?: { renewTime?: string } }>(await probe.get(timeoutMs), probe.url);
    const renewTime = lease.spec?.renewTime;
    const renew = renewTime ? Date.parse(renewTime) : Number.NaN;
    const done = now();
    return {
      result: "ok",
      reached: true,
      at,
      durationMs: done - at,
      // The age when the answer came, on the same clock as everything else fencing compares.
      ...(Number.isFinite(renew)
        ? { kubeletLeaseAgeSeconds: Math.max(0, Math.round((done - renew) / 1000)), kubeletLeaseRenewedAt: renew }
        : {}),
    };
  } catch (err) {
    const { result, detail } = classify(err);
    return { result, reached: reachedApi(result), at, durationMs: now() - at, detail };
  }
}
