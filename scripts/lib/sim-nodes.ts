// Nodes without machines, for controller tests and the rollout benchmark: Node objects whose
// status the test sets (Ready or not), Pods bound to them whose status says Running and Ready
// (so PodDisruptionBudgets count them), and a stand-in for the kubelets' part of pod deletion
// (a kubelet removes a terminating pod once its containers stopped; here at once). The node
// agent's side of the update handshake is driven by annotation patches from the test.
import type { KubeClient } from "../../lib/kube/client.ts";
import type { KubeObject } from "../../lib/kube/api.ts";
import { Informer } from "../../lib/informer.ts";
import type { Logger } from "../../lib/log/log.ts";
import { isNotFound } from "../../lib/kube/errors.ts";
import { sleep } from "../../lib/sleep.ts";
import { NODE_KEYS } from "../../bundles/names.ts";

const enc = encodeURIComponent;

export async function createNode(
  c: KubeClient,
  name: string,
  group: string,
  o: { ready?: boolean; annotations?: Record<string, string> } = {},
): Promise<void> {
  await c.request("POST", "/api/v1/nodes", {
    body: {
      apiVersion: "v1",
      kind: "Node",
      metadata: { name, labels: { [NODE_KEYS.group]: group }, annotations: o.annotations ?? {} },
    },
  });
  await setReady(c, name, o.ready ?? true);
}

export async function setReady(c: KubeClient, name: string, ready: boolean): Promise<void> {
  const now = new Date().toISOString().replace(/\.\d+Z$/, "Z");
  await c.request("PATCH", `/api/v1/nodes/${enc(name)}/status`, {
    contentType: "application/strategic-merge-patch+json",
    body: {
      status: {
        conditions: [
          {
            type: "Ready",
            status: ready ? "True" : "False",
            reason: ready ? "KubeletReady" : "KubeletNotReady",
            message: ready ? "simulated" : "simulated: not ready",
            lastHeartbeatTime: now,
            lastTransitionTime: now,
          },
        ],
      },
    },
  });
}

/** Merge-patches a Node's annotations as its agent would (null removes). */
export function annotate(c: KubeClient, name: string, annotations: Record<string, string | null>): Promise<unknown> {
  return c.request("PATCH", `/api/v1/nodes/${enc(name)}`, { body: { metadata: { annotations } } });
}

export interface PodSpec {
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  ownerReferences?: { apiVersion: string; kind: string; name: string; uid: string; controller?: boolean }[];
}

/** A Pod bound to `node`, reported Running and Ready. */
export async function createPod(
  c: KubeClient,
  namespace: string,
  name: string,
  node: string,
  o: PodSpec = {},
): Promise<KubeObject> {
  const pod = await c.request<KubeObject>("POST", `/api/v1/namespaces/${enc(namespace)}/pods`, {
    body: {
      apiVersion: "v1",
      kind: "Pod",
      metadata: {
        name,
        labels: o.labels ?? {},
        annotations: o.annotations ?? {},
        ...(o.ownerReferences ? { ownerReferences: o.ownerReferences } : {}),
      },
      spec: {
        nodeName: node,
        terminationGracePeriodSeconds: 30,
        containers: [{ name: "main", image: "registry.invalid/none:1" }],
      },
    },
  });
  const now = new Date().toISOString().replace(/\.\d+Z$/, "Z");
  await c.request("PATCH", `/api/v1/namespaces/${enc(namespace)}/pods/${enc(name)}/status`, {
    contentType: "application/strategic-merge-patch+json",
    body: {
      status: {
        phase: "Running",
        conditions: [
          { type: "Ready", status: "True", lastTransitionTime: now },
          { type: "ContainersReady", status: "True", lastTransitionTime: now },
        ],
        podIP: "10.0.0.1",
        podIPs: [{ ip: "10.0.0.1" }],
      },
    },
  });
  return pod;
}

/** Label that keeps a pod terminating (a kubelet still stopping it) until the test says so. */
export const HOLD_LABEL = "sim.bashible.io/hold-termination";

/**
 * The kubelets' share of pod deletion: a pod with a deletionTimestamp is removed at once
 * (grace 0), unless it carries HOLD_LABEL. A pod that was terminating already when the informer
 * listed (its first list, or a re-list after a broken watch) is removed too, and a removal the
 * API did not take (a timeout on a busy machine) is tried again: a pod left terminating would
 * hold a drain until its deadline.
 */
export function startKubeletSim(
  c: KubeClient,
  log: Logger,
): { stop(): void; release(ns: string, name: string): Promise<void> } {
  const finishing = new Set<string>();
  let stopped = false;
  const finish = async (p: KubeObject): Promise<void> => {
    const ns = p.metadata.namespace ?? "default";
    const key = `${ns}/${p.metadata.name}`;
    if (finishing.has(key)) return;
    finishing.add(key);
    try {
      for (let attempt = 0; !stopped; attempt++) {
        try {
          await c.request("DELETE", `/api/v1/namespaces/${enc(ns)}/pods/${enc(p.metadata.name)}`, {
            body: { apiVersion: "v1", kind: "DeleteOptions", gracePeriodSeconds: 0 },
          });
          return;
        } catch (err) {
          if (isNotFound(err) || attempt >= 50) return;
          log.warn({ pod: key, err: (err as Error).message }, "kubelet sim: pod removal failed; trying again");
          await sleep(200);
        }
      }
    } finally {
      finishing.delete(key);
    }
  };
  const terminating = (p: KubeObject) =>
    p.metadata.deletionTimestamp !== undefined && p.metadata.labels?.[HOLD_LABEL] === undefined;
  const inf: Informer<KubeObject> = new Informer({
    client: c,
    path: "/api/v1/pods",
    log,
    onEvent: (ev) => {
      if (ev.type === "DELETED") return;
      if (ev.type === "SYNC") {
        for (const p of inf.objects.values()) if (terminating(p)) void finish(p);
        return;
      }
      if (terminating(ev.object)) void finish(ev.object);
    },
  });
  inf.run();
  return {
    stop: () => {
      stopped = true;
      inf.stop();
    },
    release: async (ns, name) => {
      await c.request("PATCH", `/api/v1/namespaces/${enc(ns)}/pods/${enc(name)}`, {
        body: { metadata: { labels: { [HOLD_LABEL]: null } } },
      });
    },
  };
}

export interface AuditEntry {
  verb: string;
  user: string;
  userAgent: string;
  resource: string;
  subresource?: string;
  namespace?: string;
  name?: string;
  code: number;
  at: number;
}

/** An audit policy recording pod creates/deletes and evictions (and nothing else). */
export const POD_AUDIT_POLICY = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [create, delete]
    resources:
      - group: ""
        resources: ["pods", "pods/eviction"]
  - level: None
`;

/** Parses the API server's audit log (JSON lines; only the ResponseComplete stage). */
export function parseAudit(text: string): AuditEntry[] {
  const out: AuditEntry[] = [];
  for (const line of text.split("\n")) {
    if (!line.trim()) continue;
    const e = JSON.parse(line) as {
      stage: string;
      verb: string;
      user: { username: string };
      userAgent?: string;
      objectRef?: { resource: string; subresource?: string; namespace?: string; name?: string };
      responseStatus?: { code: number };
      stageTimestamp: string;
    };
    if (e.stage !== "ResponseComplete" || !e.objectRef) continue;
    out.push({
      verb: e.verb,
      user: e.user.username,
      userAgent: e.userAgent ?? "",
      resource: e.objectRef.resource,
      subresource: e.objectRef.subresource,
      namespace: e.objectRef.namespace,
      name: e.objectRef.name,
      code: e.responseStatus?.code ?? 0,
      at: Date.parse(e.stageTimestamp),
    });
  }
  return out;
}
