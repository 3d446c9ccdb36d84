// What early OOM needs from a Pod object, computed as the kubelet computes it: the memory
// request (regular containers, sidecars, init containers, overhead), the priority and the QoS
// class, and whether the kubelet would ever evict it (static and critical pods: never). Pod
// objects come from a watch of this node's pods (lib/informer.ts) or, for
// `bashible early-oom status --pods FILE`, from a saved `kubectl get pods -o json`.
//
// Static pods: the kubelet runs them from manifests on the node (etcd, kube-apiserver on a
// control-plane node) under the UID it derives from the manifest (an md5 hash, 32 hex digits),
// and the Pod object the API shows, the mirror pod, has a UID of its own; the kubelet writes
// the manifest's UID into the mirror pod's kubernetes.io/config.mirror annotation. Their
// cgroups carry the manifest's UID, so they are matched by that annotation.
import type { KubeObject } from "../../lib/kube/api.ts";
import type { KubeClient } from "../../lib/kube/client.ts";
import type { Logger } from "../../lib/log/log.ts";
import { Informer } from "../../lib/informer.ts";
import { parseQuantity } from "../../lib/kube/quantity.ts";
import { SYSTEM_CLUSTER_CRITICAL, SYSTEM_NODE_CRITICAL } from "./config.ts";

export type QosClass = "Guaranteed" | "Burstable" | "BestEffort";

interface Resources {
  requests?: Record<string, string | number>;
  limits?: Record<string, string | number>;
}
interface Container {
  name?: string;
  resources?: Resources;
  restartPolicy?: string;
  [k: string]: unknown;
}
/** The kubelet's annotations on a mirror pod (pkg/kubelet/types): the static pod's UID, and where it came from. */
export const MIRROR_ANNOTATION = "kubernetes.io/config.mirror";
export const SOURCE_ANNOTATION = "kubernetes.io/config.source";

export interface Pod extends KubeObject {
  spec?: {
    nodeName?: string;
    priority?: number;
    priorityClassName?: string;
    containers?: Container[];
    initContainers?: Container[];
    overhead?: Record<string, string | number>;
    [k: string]: unknown;
  };
  status?: { qosClass?: string; phase?: string };
}

/** What a ranking needs of a pod. */
export interface PodFacts {
  uid: string;
  namespace: string;
  name: string;
  labels: Record<string, string>;
  priority: number;
  /** Memory request in bytes, as the kubelet's eviction ranking counts it. */
  request: number;
  qos: QosClass;
  /**
   * Why the kubelet never evicts this pod (kubelettypes.IsCriticalPod): a static pod (mirror
   * annotation, or a config source other than the API), or a priority at or above
   * system-cluster-critical; undefined for every other pod.
   */
  neverEvicted: string | undefined;
  /** A mirror pod: the UID its static pod (and so its cgroup) carries. */
  staticUid: string | undefined;
}

const memOf = (r: Record<string, string | number> | undefined) => {
  const v = parseQuantity(r?.memory);
  return Number.isFinite(v) ? v : 0;
};

/** The pod's effective memory request (k8s.io/component-helpers resource.PodRequests). */
export function podMemoryRequest(pod: Pod): number {
  let sum = 0;
  for (const c of pod.spec?.containers ?? []) sum += memOf(c.resources?.requests);
  let sidecars = 0;
  let init = 0;
  for (const c of pod.spec?.initContainers ?? []) {
    const r = memOf(c.resources?.requests);
    if (c.restartPolicy === "Always") {
      // A sidecar runs beside everything started after it.
      sum += r;
      sidecars += r;
      init = Math.max(init, sidecars);
    } else init = Math.max(init, r + sidecars);
  }
  return Math.max(sum, init) + memOf(pod.spec?.overhead);
}

const KNOWN_PRIORITY: Record<string, number> = {
  "system-node-critical": SYSTEM_NODE_CRITICAL,
  "system-cluster-critical": SYSTEM_CLUSTER_CRITICAL,
};

export function podPriority(pod: Pod): number {
  if (typeof pod.spec?.priority === "number") return pod.spec.priority;
  return KNOWN_PRIORITY[pod.spec?.priorityClassName ?? ""] ?? 0;
}

/** status.qosClass, else computed from the spec as the API server does. */
export function podQos(pod: Pod): QosClass {
  const q = pod.status?.qosClass;
  if (q === "Guaranteed" || q === "Burstable" || q === "BestEffort") return q;
  const all = [...(pod.spec?.containers ?? []), ...(pod.spec?.initContainers ?? [])];
  let any = false;
  let guaranteed = all.length > 0;
  for (const c of all) {
    const req = c.resources?.requests ?? {};
    const lim = c.resources?.limits ?? {};
    for (const r of ["cpu", "memory"]) {
      if (req[r] !== undefined || lim[r] !== undefined) any = true;
      const l = parseQuantity(lim[r]);
      const q2 = req[r] === undefined ? l : parseQuantity(req[r]);
      if (!Number.isFinite(l) || q2 !== l) guaranteed = false;
    }
  }
  if (!any) return "BestEffort";
  return guaranteed ? "Guaranteed" : "Burstable";
}

/** Why the kubelet never evicts the pod, or undefined (pkg/kubelet/types IsCriticalPod). */
export function neverEvicted(pod: Pod, priority = podPriority(pod)): string | undefined {
  const a = pod.metadata.annotations ?? {};
  if (a[MIRROR_ANNOTATION] !== undefined)
    return "static pod (mirror pod of a manifest on the node): the kubelet never evicts it";
  const source = a[SOURCE_ANNOTATION];
  if (source !== undefined && source !== "api")
    return `static pod (config source ${source}): the kubelet never evicts it`;
  if (priority >= SYSTEM_CLUSTER_CRITICAL)
    return `critical pod (priority ${priority} ≥ ${SYSTEM_CLUSTER_CRITICAL}, system-cluster-critical): the kubelet never evicts it`;
  return undefined;
}

/**
 * The UID the kubelet gives a pod it runs from a manifest: an md5 hash in hex, never the
 * API server's dashed UUID. A cgroup named so is a static pod even when its mirror pod is not
 * (yet, or any more) in the API.
 */
export const isManifestUid = (uid: string) => /^[0-9a-f]{32}$/.test(uid);

export function podFacts(pod: Pod): PodFacts {
  const priority = podPriority(pod);
  const mirror = pod.metadata.annotations?.[MIRROR_ANNOTATION];
  return {
    uid: pod.metadata.uid ?? "",
    namespace: pod.metadata.namespace ?? "",
    name: pod.metadata.name,
    labels: pod.metadata.labels ?? {},
    priority,
    request: podMemoryRequest(pod),
    qos: podQos(pod),
    neverEvicted: neverEvicted(pod, priority),
    staticUid: mirror || undefined,
  };
}

/** Pods by the UID their cgroup carries: their own, or for a mirror pod its static pod's. */
export function byCgroupUid(pods: Iterable<PodFacts>): Map<string, PodFacts> {
  const out = new Map<string, PodFacts>();
  for (const p of pods) {
    if (p.uid) out.set(p.uid, p);
    if (p.staticUid) out.set(p.staticUid, p);
  }
  return out;
}

const KEPT_ANNOTATIONS = [MIRROR_ANNOTATION, SOURCE_ANNOTATION];

/** Keeps only what podFacts reads, so a node's pod list sits small in the resident process. */
export function trimPod(pod: Pod): Pod {
  const res = (c: Container): Container => ({
    restartPolicy: c.restartPolicy,
    resources: {
      requests: pick(c.resources?.requests),
      limits: pick(c.resources?.limits),
    },
  });
  return {
    metadata: {
      name: pod.metadata.name,
      namespace: pod.metadata.namespace,
      uid: pod.metadata.uid,
      resourceVersion: pod.metadata.resourceVersion,
      labels: pod.metadata.labels,
      annotations: keptAnnotations(pod.metadata.annotations),
    },
    spec: {
      priority: pod.spec?.priority,
      priorityClassName: pod.spec?.priorityClassName,
      containers: pod.spec?.containers?.map(res),
      initContainers: pod.spec?.initContainers?.map(res),
      overhead: pod.spec?.overhead ? { memory: pod.spec.overhead.memory ?? 0 } : undefined,
    },
    status: { qosClass: pod.status?.qosClass },
  };
}

function keptAnnotations(a: Record<string, string> | undefined): Record<string, string> | undefined {
  const kept = KEPT_ANNOTATIONS.filter((k) => a?.[k] !== undefined);
  return kept.length ? Object.fromEntries(kept.map((k) => [k, a?.[k] ?? ""])) : undefined;
}

function pick(r: Record<string, string | number> | undefined): Record<string, string | number> | undefined {
  if (!r) return undefined;
  const out: Record<string, string | number> = {};
  if (r.memory !== undefined) out.memory = r.memory;
  if (r.cpu !== undefined) out.cpu = r.cpu;
  return out;
}

/** Where pod objects come from: looked up by the UID the cgroup tree carries. */
export interface PodSource {
  /** All pods known now, by the UID their cgroup carries (byCgroupUid). */
  byUid(): Map<string, PodFacts>;
  /** Whether the source has a complete list (an informer that listed at least once). */
  readonly synced: boolean;
  readonly error: string | undefined;
  stop(): void;
}

/** A fixed list (a `kubectl get pods -o json` file, or a test's). */
export class StaticPods implements PodSource {
  private readonly map: Map<string, PodFacts>;
  readonly synced = true;
  readonly error = undefined;
  constructor(pods: Pod[]) {
    this.map = byCgroupUid(pods.filter((p) => p.metadata?.uid).map(podFacts));
  }
  byUid(): Map<string, PodFacts> {
    return this.map;
  }
  stop(): void {}
}

/** Parses a pod list as `kubectl get pods -o json` writes it (a List), or a single Pod. */
export function podsFromJson(text: string, file: string): Pod[] {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw new Error(`${file}: not JSON (${(err as Error).message}); write it with 'kubectl get pods -o json'`);
  }
  const d = doc as { kind?: string; items?: unknown };
  const items = Array.isArray(d.items) ? d.items : d.kind === "Pod" ? [doc] : undefined;
  if (!items) throw new Error(`${file}: expected a pod list ('kubectl get pods -o json'), got kind ${d.kind}`);
  return items.filter((p): p is Pod => typeof p === "object" && p !== null && (p as Pod).kind !== "Status");
}

/** This node's pods from a list + watch (fieldSelector spec.nodeName). */
export class WatchedPods implements PodSource {
  readonly client: KubeClient;
  private readonly informer: Informer<Pod>;
  private cache: Map<string, PodFacts> | undefined;

  constructor(client: KubeClient, nodeName: string, log: Logger) {
    this.client = client;
    this.informer = new Informer<Pod>({
      client,
      path: "/api/v1/pods",
      fieldSelector: `spec.nodeName=${nodeName}`,
      log,
      trim: trimPod,
      onEvent: () => {
        this.cache = undefined;
      },
    });
    this.informer.run();
  }

  get synced(): boolean {
    return this.informer.synced;
  }

  get error(): string | undefined {
    return this.informer.error?.message;
  }

  byUid(): Map<string, PodFacts> {
    if (!this.cache) {
      const facts: PodFacts[] = [];
      for (const p of this.informer.objects.values()) if (p.metadata.uid) facts.push(podFacts(p));
      this.cache = byCgroupUid(facts);
    }
    return this.cache;
  }

  stop(): void {
    this.informer.stop();
  }
}
