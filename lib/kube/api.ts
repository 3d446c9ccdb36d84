// Typed helpers for the calls the agent and its controllers make. Objects stay plain JSON
// (Record-shaped): the agent touches a handful of fields and needs no generated types.
import type { KubeClient, RequestOptions, WatchEvent, WatchOptions } from "./client.ts";

export type KubeObject = {
  apiVersion?: string;
  kind?: string;
  metadata: {
    name: string;
    namespace?: string;
    resourceVersion?: string;
    uid?: string;
    labels?: Record<string, string>;
    annotations?: Record<string, string>;
    [k: string]: unknown;
  };
  [k: string]: unknown;
};

export interface KubeList<T = KubeObject> {
  metadata: { resourceVersion: string; continue?: string };
  items: T[];
}

const enc = encodeURIComponent;
const ns = (namespace: string) => `/api/v1/namespaces/${enc(namespace)}`;
const leases = (namespace: string) => `/apis/coordination.k8s.io/v1/namespaces/${enc(namespace)}/leases`;

type Opts = Pick<RequestOptions, "timeoutMs" | "signal">;

export const getNode = (c: KubeClient, name: string, o?: Opts) =>
  c.request<KubeObject>("GET", `/api/v1/nodes/${enc(name)}`, o);

/** JSON merge patch of a Node (labels, annotations, spec). `null` values delete keys. */
export const patchNode = (c: KubeClient, name: string, patch: unknown, o?: Opts) =>
  c.request<KubeObject>("PATCH", `/api/v1/nodes/${enc(name)}`, { ...o, body: patch });

export const patchNodeStatus = (c: KubeClient, name: string, patch: unknown, o?: Opts) =>
  c.request<KubeObject>("PATCH", `/api/v1/nodes/${enc(name)}/status`, { ...o, body: patch });

export interface EventInput {
  namespace?: string;
  involved: { kind: string; name: string; namespace?: string; uid?: string; apiVersion?: string };
  reason: string;
  message: string;
  type?: "Normal" | "Warning";
  component?: string;
  host?: string;
}

/** Creates a core/v1 Event (what `kubectl describe` shows). */
export function createEvent(c: KubeClient, e: EventInput, o?: Opts): Promise<KubeObject> {
  const namespace = e.namespace ?? "default";
  const now = new Date().toISOString();
  const body = {
    apiVersion: "v1",
    kind: "Event",
    metadata: { generateName: `${e.involved.name}.`, namespace },
    involvedObject: e.involved,
    reason: e.reason,
    message: e.message,
    type: e.type ?? "Normal",
    source: { component: e.component ?? "bashible", host: e.host },
    firstTimestamp: now,
    lastTimestamp: now,
    count: 1,
  };
  return c.request<KubeObject>("POST", `${ns(namespace)}/events`, { ...o, body });
}

export interface ListOptions extends Opts {
  labelSelector?: string;
  fieldSelector?: string;
  limit?: number;
  continue?: string;
  resourceVersion?: string;
}

export function list<T = KubeObject>(c: KubeClient, path: string, o: ListOptions = {}): Promise<KubeList<T>> {
  const { timeoutMs, signal, ...query } = o;
  return c.request<KubeList<T>>("GET", path, { query: { ...query }, timeoutMs, signal });
}

export function watch<T = KubeObject>(
  c: KubeClient,
  path: string,
  o: WatchOptions = {},
): AsyncGenerator<WatchEvent<T>> {
  return c.watch<T>(path, o);
}

/** Evicts a pod through the Eviction API, so PodDisruptionBudgets are honoured (429 when one blocks). */
export const evictPod = (c: KubeClient, namespace: string, name: string, gracePeriodSeconds?: number, o?: Opts) =>
  c.request("POST", `${ns(namespace)}/pods/${enc(name)}/eviction`, {
    ...o,
    body: {
      apiVersion: "policy/v1",
      kind: "Eviction",
      metadata: { name, namespace },
      ...(gracePeriodSeconds === undefined ? {} : { deleteOptions: { gracePeriodSeconds } }),
    },
  });

export const deletePod = (c: KubeClient, namespace: string, name: string, gracePeriodSeconds?: number, o?: Opts) =>
  c.request("DELETE", `${ns(namespace)}/pods/${enc(name)}`, {
    ...o,
    body: {
      apiVersion: "v1",
      kind: "DeleteOptions",
      ...(gracePeriodSeconds === undefined ? {} : { gracePeriodSeconds }),
    },
  });

/** A Lease's MicroTime (RFC 3339 with microseconds), as the API server writes it. */
export const microTime = (ms: number) => new Date(ms).toISOString().replace("Z", "000Z");

export const getLease = (c: KubeClient, namespace: string, name: string, o?: Opts) =>
  c.request<KubeObject>("GET", `${leases(namespace)}/${enc(name)}`, o);

export const createLease = (c: KubeClient, lease: KubeObject, o?: Opts) =>
  c.request<KubeObject>("POST", leases(lease.metadata.namespace ?? "default"), { ...o, body: lease });

/** Replaces a Lease; the object's resourceVersion makes it a compare-and-swap (409 on a lost race). */
export const updateLease = (c: KubeClient, lease: KubeObject, o?: Opts) =>
  c.request<KubeObject>("PUT", `${leases(lease.metadata.namespace ?? "default")}/${enc(lease.metadata.name)}`, {
    ...o,
    body: lease,
  });

export const getSecret = (c: KubeClient, namespace: string, name: string, o?: Opts) =>
  c.request<KubeObject>("GET", `${ns(namespace)}/secrets/${enc(name)}`, o);

export const createSecret = (c: KubeClient, secret: KubeObject, o?: Opts) =>
  c.request<KubeObject>("POST", `${ns(secret.metadata.namespace ?? "default")}/secrets`, { ...o, body: secret });

/** Replaces a Secret; with metadata.resourceVersion set it fails with 409 when someone else wrote first. */
export const updateSecret = (c: KubeClient, secret: KubeObject, o?: Opts) =>
  c.request<KubeObject>("PUT", `${ns(secret.metadata.namespace ?? "default")}/secrets/${enc(secret.metadata.name)}`, {
    ...o,
    body: secret,
  });
