// Test helper: a real Prometheus server (Debian's prometheus package) on loopback, and what it
// cannot do here. Debian builds Prometheus without the Kubernetes service discovery, and the
// upstream build from the Go module proxy took more than 14 minutes on this 2-core machine
// without finishing (too much for every CI run), so a `kubernetes_sd_configs` entry is turned
// into a `file_sd_configs` one whose targets carry the labels Prometheus' Kubernetes discovery
// gives (`__address__`, `instance` and the `__meta_kubernetes_*` of roles node and pod, as
// Prometheus documents them), read from the real API server's objects. Everything after the
// discovery (relabeling, TLS, authorization, scraping, rules, alerts) is Prometheus' own.
import { spawn } from "node:child_process";
import { openSync } from "node:fs";
import { readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import { stringify } from "yaml";
import type { KubeObject } from "../../lib/kube/api.ts";
import type { KubeClient } from "../../lib/kube/client.ts";
import { freePort } from "./control-plane.ts";
import { until } from "./until.ts";

/** Prometheus' label-name sanitizing of Kubernetes label and annotation keys. */
const labelName = (k: string) => k.replace(/[^a-zA-Z0-9_]/g, "_");

interface NodeObject extends KubeObject {
  status?: {
    addresses?: { type: string; address: string }[];
    daemonEndpoints?: { kubeletEndpoint?: { Port?: number } };
  };
  spec?: { providerID?: string };
}
interface PodObject extends KubeObject {
  spec: {
    nodeName?: string;
    containers: { name: string; ports?: { name?: string; containerPort: number; protocol?: string }[] }[];
  };
  status?: { podIP?: string; phase?: string };
}

type TargetGroup = { targets: string[]; labels: Record<string, string> };

const metaOf = (prefix: string, o: KubeObject) => {
  const labels: Record<string, string> = {};
  for (const [k, v] of Object.entries(o.metadata.labels ?? {})) {
    labels[`${prefix}_label_${labelName(k)}`] = v;
    labels[`${prefix}_labelpresent_${labelName(k)}`] = "true";
  }
  for (const [k, v] of Object.entries(o.metadata.annotations ?? {})) {
    labels[`${prefix}_annotation_${labelName(k)}`] = v;
    labels[`${prefix}_annotationpresent_${labelName(k)}`] = "true";
  }
  return labels;
};

/** Address priority of the node role (Prometheus' nodeAddress). */
const ADDRESS_ORDER = ["InternalIP", "InternalDNS", "ExternalIP", "ExternalDNS", "LegacyHostIP", "Hostname"];

/** What role `node` discovers: one target per Node, at its first address and kubelet port. */
async function nodeTargets(kube: KubeClient): Promise<TargetGroup[]> {
  const nodes = await kube.request<{ items: NodeObject[] }>("GET", "/api/v1/nodes");
  return nodes.items.flatMap((n) => {
    const addresses = n.status?.addresses ?? [];
    const first = ADDRESS_ORDER.map((t) => addresses.find((a) => a.type === t)).find(Boolean);
    if (!first) return [];
    const labels: Record<string, string> = {
      instance: n.metadata.name,
      __meta_kubernetes_node_name: n.metadata.name,
      __meta_kubernetes_node_provider_id: n.spec?.providerID ?? "",
      ...metaOf("__meta_kubernetes_node", n),
    };
    for (const a of addresses) labels[`__meta_kubernetes_node_address_${a.type}`] ??= a.address;
    const port = n.status?.daemonEndpoints?.kubeletEndpoint?.Port ?? 0;
    return [{ targets: [`${first.address}:${port}`], labels }];
  });
}

/** What role `pod` discovers: one target per declared container port of each pod. */
async function podTargets(kube: KubeClient, namespaces: string[] | undefined): Promise<TargetGroup[]> {
  const lists = namespaces?.length
    ? await Promise.all(
        namespaces.map((ns) => kube.request<{ items: PodObject[] }>("GET", `/api/v1/namespaces/${ns}/pods`)),
      )
    : [await kube.request<{ items: PodObject[] }>("GET", "/api/v1/pods")];
  return lists.flatMap((l) =>
    l.items.flatMap((p) =>
      p.spec.containers.flatMap((c) =>
        (c.ports ?? []).map((port) => ({
          targets: [`${p.status?.podIP ?? ""}:${port.containerPort}`],
          labels: {
            __meta_kubernetes_namespace: p.metadata.namespace ?? "",
            __meta_kubernetes_pod_name: p.metadata.name,
            __meta_kubernetes_pod_ip: p.status?.podIP ?? "",
            __meta_kubernetes_pod_phase: p.status?.phase ?? "",
            __meta_kubernetes_pod_node_name: p.spec.nodeName ?? "",
            __meta_kubernetes_pod_container_name: c.name,
            __meta_kubernetes_pod_container_port_name: port.name ?? "",
            __meta_kubernetes_pod_container_port_number: String(port.containerPort),
            __meta_kubernetes_pod_container_port_protocol: port.protocol ?? "TCP",
            ...metaOf("__meta_kubernetes_pod", p),
          },
        })),
      ),
    ),
  );
}

interface KubernetesSd {
  role: string;
  namespaces?: { names?: string[] };
}
export interface ScrapeJob {
  job_name: string;
  kubernetes_sd_configs?: KubernetesSd[];
  file_sd_configs?: { files: string[] }[];
  [k: string]: unknown;
}

/**
 * Replaces each job's `kubernetes_sd_configs` with a file of the targets that discovery would
 * find now (roles node and pod), written under `dir`. Returns the jobs, changed in place.
 */
export async function discoverNow(kube: KubeClient, jobs: ScrapeJob[], dir: string): Promise<ScrapeJob[]> {
  for (const job of jobs) {
    const sds = job.kubernetes_sd_configs;
    if (!sds) continue;
    const groups: TargetGroup[] = [];
    for (const sd of sds) {
      if (sd.role === "node") groups.push(...(await nodeTargets(kube)));
      else if (sd.role === "pod") groups.push(...(await podTargets(kube, sd.namespaces?.names)));
      else throw new Error(`${job.job_name}: role ${sd.role} is not discovered here (node and pod are)`);
    }
    const file = path.join(dir, `${job.job_name}.targets.json`);
    await writeFile(file, JSON.stringify(groups));
    delete job.kubernetes_sd_configs;
    job.file_sd_configs = [{ files: [file] }];
  }
  return jobs;
}

export interface Target {
  labels: Record<string, string>;
  health: string;
  lastError: string;
  scrapePool: string;
}
export interface Alert {
  labels: Record<string, string>;
  annotations: Record<string, string>;
  state: string;
}

export interface Prometheus {
  query(q: string): Promise<{ metric: Record<string, string>; value: [number, string] }[]>;
  targets(): Promise<Target[]>;
  alerts(): Promise<Alert[]>;
  /** Resolves with the job's target `match` picks once it is up; fails if Prometheus exits. */
  upTarget(job: string, match: (labels: Record<string, string>) => boolean): Promise<Target>;
  stop(): Promise<void>;
}

/** Starts Prometheus with `config` (written to dir/prometheus.yml) and waits until it is ready. */
export async function startPrometheus(dir: string, config: unknown): Promise<Prometheus> {
  const configFile = path.join(dir, "prometheus.yml");
  await writeFile(configFile, stringify(config));
  const port = await freePort();
  const logFile = path.join(dir, "prometheus.log");
  const proc = spawn(
    "prometheus",
    [
      `--config.file=${configFile}`,
      `--storage.tsdb.path=${path.join(dir, "tsdb")}`,
      `--web.listen-address=127.0.0.1:${port}`,
      "--log.level=warn",
    ],
    { stdio: ["ignore", "ignore", openSync(logFile, "w")] },
  );
  const exited = new Promise<void>((resolve) => proc.once("exit", () => resolve()));
  const alive = async () => {
    if (proc.exitCode !== null) throw new Error(`prometheus exited; its log:\n${await readFile(logFile, "utf8")}`);
  };
  const api = async <T>(p: string): Promise<T> => {
    await alive();
    const res = await fetch(`http://127.0.0.1:${port}${p}`);
    const body = (await res.json()) as { status: string; data: T; error?: string };
    if (body.status !== "success") throw new Error(`prometheus ${p}: ${body.error ?? JSON.stringify(body)}`);
    return body.data;
  };
  await until("prometheus to be ready", async () => {
    await alive();
    return (await fetch(`http://127.0.0.1:${port}/-/ready`).catch(() => undefined))?.ok;
  });
  const targets = () => api<{ activeTargets: Target[] }>("/api/v1/targets?state=active").then((d) => d.activeTargets);
  return {
    query: (q) =>
      api<{ result: { metric: Record<string, string>; value: [number, string] }[] }>(
        `/api/v1/query?query=${encodeURIComponent(q)}`,
      ).then((d) => d.result),
    targets,
    alerts: () => api<{ alerts: Alert[] }>("/api/v1/alerts").then((d) => d.alerts),
    upTarget: (job, match) =>
      until(`the ${job} target to be up`, async () => {
        await alive();
        const found = (await targets()).find((x) => x.scrapePool === job && match(x.labels));
        return found?.health === "up" && found;
      }),
    async stop() {
      proc.kill("SIGTERM");
      await exited;
    },
  };
}

/**
 * kube-state-metrics' `kube_node_status_condition` (the series Deckhouse's alerts join on), read
 * from the real Nodes at each scrape: kube-state-metrics itself is not served by the module
 * proxy here. As it exports them: one series per condition and status (true, false, unknown),
 * 1 for the Node's and 0 for the other two.
 */
export async function startNodeConditionExporter(
  kube: KubeClient,
): Promise<{ address: string; stop(): Promise<void> }> {
  const { createServer } = await import("node:http");
  const server = createServer((_req, res) => {
    kube
      .request<{
        items: { metadata: { name: string }; status?: { conditions?: { type: string; status: string }[] } }[];
      }>("GET", "/api/v1/nodes")
      .then((list) => {
        const lines = ["# TYPE kube_node_status_condition gauge"];
        for (const n of list.items) {
          for (const c of n.status?.conditions ?? []) {
            for (const s of ["true", "false", "unknown"]) {
              const value = c.status.toLowerCase() === s ? 1 : 0;
              lines.push(
                `kube_node_status_condition{node="${n.metadata.name}",condition="${c.type}",status="${s}"} ${value}`,
              );
            }
          }
        }
        res.writeHead(200, { "content-type": "text/plain; version=0.0.4" }).end(`${lines.join("\n")}\n`);
      })
      .catch((err: Error) => res.writeHead(500).end(err.message));
  });
  const port = await freePort();
  await new Promise<void>((resolve) => server.listen(port, "127.0.0.1", resolve));
  return {
    address: `127.0.0.1:${port}`,
    stop: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
