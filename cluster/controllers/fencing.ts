// The fencing controller: frees the workloads of a node that has stopped being part of the
// cluster. For Nodes labelled node-manager.deckhouse.io/fencing-enabled (their agent watches
// itself with a watchdog) and without a maintenance annotation, when the kubelet's Lease in
// kube-node-lease has not been renewed for longer than the threshold: delete the node's pods
// with grace 0, then the Node (kept for Static and CloudStatic nodes; Notify mode only reports:
// an Event and a condition).
//
// Lease age is measured on this controller's own clock, from the moment it saw the renewal
// (as the node lifecycle controller does), never from renewTime against our clock: node clocks
// drift, and after an API outage every Lease looks old. Any gap in what the controller saw (a
// failed watch, a re-list, a new leader) restarts every node's count, and nothing is done while
// the Lease watch is failing.
import type { KubeClient } from "../../lib/kube/client.ts";
import { createEvent, deletePod, list, type KubeObject } from "../../lib/kube/api.ts";
import { isNotFound } from "../../lib/kube/errors.ts";
import { Informer } from "../../lib/informer.ts";
import type { Logger } from "../../lib/log/log.ts";
import type { Counter, Registry } from "../../lib/prometheus.ts";
import { EVENTS, LEASES, NAMESPACE, NODE_KEYS } from "../../bundles/names.ts";
import { whileLeading, type Leadership } from "../leadership.ts";
import { CONTROLLER_METRICS, type ControllerMetrics, type Samples } from "./metrics.ts";
import {
  type ControllerTimings,
  DEFAULT_CONTROLLER_TIMINGS,
  maintenanceOf,
  parseAgentTimingsAnnotation,
  unsafeTimings,
} from "../../bundles/fencing.ts";

export class FencingConfigError extends Error {
  override name = "FencingConfigError";
}

export interface FencingControllerOptions {
  client: KubeClient;
  log: Logger;
  timings?: Partial<ControllerTimings>;
  /** How often nodes are looked at (default 5 s). */
  resyncMs?: number;
  metrics?: Registry;
  /** Where its gauges are served (d8_fencing_*); default the process's (the server's /metrics). */
  gauges?: ControllerMetrics;
  /**
   * Leader election: the Lease (default d8-cloud-instance-manager/bashible-fencing-controller)
   * and its duration (default the server's, 10 s: `--lease-duration`).
   */
  lease?: { namespace?: string; name?: string; durationSeconds?: number };
  /** Controller clock (tests). */
  now?: () => number;
}

export const CONDITION_TYPE = "FencingTriggered";
const STATIC_TYPES = new Set(["Static", "CloudStatic"]);

/** Validates the timings and fills defaults; throws FencingConfigError naming the numbers. */
export function fencingTimings(t: Partial<ControllerTimings> = {}): ControllerTimings {
  const full = { ...DEFAULT_CONTROLLER_TIMINGS, ...t };
  const why = unsafeTimings(full);
  if (why) throw new FencingConfigError(why);
  return full;
}

type Outcome = "fenced" | "notified" | "refused";

/** The reconcile loop while leading. */
export class FencingController {
  private readonly o: FencingControllerOptions;
  private readonly log: Logger;
  readonly timings: ControllerTimings;
  private readonly now: () => number;
  private readonly nodes: Informer;
  private readonly leases: Informer;
  /** Lease name → the renewTime last seen and when (our clock). */
  private readonly seen = new Map<string, { renewTime: string; at: number }>();
  /** Nodes acted on, until their Lease is renewed again. */
  private readonly handled = new Map<string, Outcome>();
  private timer: NodeJS.Timeout | undefined;
  private busy = false;
  private readonly counter: Counter | undefined;
  private removeGauges: (() => void) | undefined;

  constructor(o: FencingControllerOptions) {
    this.o = o;
    this.log = o.log.child({ component: "fencing-controller" });
    this.timings = fencingTimings(o.timings);
    this.now = o.now ?? Date.now;
    this.counter = o.metrics?.counter("bashible_fencing_controller_actions_total", "Fencing actions by outcome");
    this.nodes = new Informer({
      client: o.client,
      path: "/api/v1/nodes",
      labelSelector: NODE_KEYS.fencingEnabled,
      log: this.log,
      trim: (n) => ({ metadata: n.metadata }),
    });
    this.leases = new Informer({
      client: o.client,
      path: "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
      log: this.log,
      trim: (l) => ({ metadata: { name: l.metadata.name }, spec: { renewTime: (l.spec as LeaseSpec)?.renewTime } }),
      onEvent: (ev) => {
        const at = this.now();
        if (ev.type === "SYNC") {
          // First list, or a re-list after a gap: nobody's age counts from before it.
          this.seen.clear();
          for (const l of this.leases.objects.values()) this.seen.set(l.metadata.name, { renewTime: renewOf(l), at });
        } else if (ev.type === "DELETED") this.seen.delete(ev.object.metadata.name);
        else {
          const renewTime = renewOf(ev.object);
          if (this.seen.get(ev.object.metadata.name)?.renewTime !== renewTime)
            this.seen.set(ev.object.metadata.name, { renewTime, at });
        }
      },
    });
  }

  start(): void {
    this.log.info({ ...this.timings }, "fencing controller started");
    this.removeGauges = (this.o.gauges ?? CONTROLLER_METRICS).add(() => this.samples());
    this.nodes.run();
    this.leases.run();
    this.timer = setInterval(() => void this.tick(), this.o.resyncMs ?? 5000);
  }

  stop(): void {
    clearInterval(this.timer);
    this.removeGauges?.();
    this.nodes.stop();
    this.leases.stop();
  }

  /**
   * Deckhouse's fencing blockers, as this controller meets them: a fencing-enabled node that has
   * no kubelet Lease can never be judged (d8_fencing_invalid_node_reference, LeaseNotFound), and
   * one whose agent states timings that fail the invariants would be refused when it goes
   * silent (d8_fencing_configuration_error, profile agent-timings). Known before it matters.
   */
  samples(): Samples {
    if (!this.nodes.synced || !this.leases.synced) return {};
    const invalid: Samples[string] = [];
    const config: Samples[string] = [];
    for (const node of this.nodes.objects.values()) {
      const name = node.metadata.name;
      // `seen` is keyed by Lease name (the informer's own keys carry the namespace).
      if (!this.seen.has(name)) invalid.push({ labels: { node: name, reason: "LeaseNotFound" }, value: 1 });
      const own = parseAgentTimingsAnnotation(node.metadata.annotations?.[NODE_KEYS.fencingTimings]);
      if (own && unsafeTimings({ ...this.timings, ...own, kubeletWindowSeconds: own.kubeletWindowSeconds }))
        config.push({ labels: { node: name, profile: "agent-timings" }, value: 1 });
    }
    return { d8_fencing_invalid_node_reference: invalid, d8_fencing_configuration_error: config };
  }

  /** Seconds since the kubelet was last seen renewing its Lease (our clock), if known. */
  leaseAgeSeconds(node: string): number | undefined {
    const s = this.seen.get(node);
    return s ? (this.now() - s.at) / 1000 : undefined;
  }

  /** One pass over the labelled nodes (exported for tests that do not want to wait for the timer). */
  async tick(): Promise<void> {
    if (this.busy) return;
    // Act only on a picture that is whole and current.
    if (!this.nodes.synced || !this.leases.synced || this.nodes.error || this.leases.error) return;
    this.busy = true;
    try {
      for (const node of [...this.nodes.objects.values()]) {
        try {
          await this.reconcile(node);
        } catch (err) {
          this.log.warn({ node: node.metadata.name, err: (err as Error).message }, "fencing: cannot act on node");
        }
      }
    } finally {
      this.busy = false;
    }
  }

  private async reconcile(node: KubeObject): Promise<void> {
    const name = node.metadata.name;
    const labels = node.metadata.labels ?? {};
    const annotations = node.metadata.annotations ?? {};
    const age = this.leaseAgeSeconds(name);
    const t = this.timings;
    if (age === undefined || age <= t.thresholdSeconds) {
      if (age !== undefined && this.handled.delete(name)) this.log.info({ node: name }, "kubelet Lease renewed again");
      return;
    }
    if (maintenanceOf(annotations)) return;
    if (this.handled.has(name)) {
      // Static nodes stay: pods that land on them again are deleted again, quietly.
      if (this.handled.get(name) === "fenced") await this.deletePods(name);
      return;
    }
    const ageText = `kubelet Lease not renewed for ${Math.round(age)} s (threshold ${t.thresholdSeconds} s)`;
    const own = parseAgentTimingsAnnotation(annotations[NODE_KEYS.fencingTimings]);
    if (own) {
      // The node's own windows, exactly: one without the kubelet rule states no kubelet window.
      const why = unsafeTimings({ ...t, ...own, kubeletWindowSeconds: own.kubeletWindowSeconds });
      if (why) {
        await this.report(node, "refused", EVENTS.fencingRefused, `${ageText}; not fencing: the node's own ${why}`);
        return;
      }
    }
    if (labels[NODE_KEYS.fencingMode] === "Notify") {
      await this.report(node, "notified", EVENTS.fencingNotify, `${ageText}; Notify mode: nothing deleted`);
      return;
    }
    const deleted = await this.deletePods(name);
    const keep = STATIC_TYPES.has(labels[NODE_KEYS.nodeType] ?? "");
    const msg = `${ageText}; its watchdog has fired by now. Deleted ${deleted} pod(s) with grace 0${keep ? `; the ${labels[NODE_KEYS.nodeType]} Node is kept` : "; deleting the Node"}`;
    await this.report(node, "fenced", EVENTS.nodeFenced, msg);
    if (!keep) {
      await this.o.client
        .request("DELETE", `/api/v1/nodes/${encodeURIComponent(name)}`, {
          body: { apiVersion: "v1", kind: "DeleteOptions", propagationPolicy: "Background" },
        })
        .catch((err) => {
          if (!isNotFound(err)) throw err;
        });
      this.log.warn({ node: name }, "Node deleted");
    }
  }

  private async deletePods(node: string): Promise<number> {
    const pods = await list(this.o.client, "/api/v1/pods", { fieldSelector: `spec.nodeName=${node}` });
    let n = 0;
    for (const p of pods.items) {
      try {
        await deletePod(this.o.client, p.metadata.namespace ?? "default", p.metadata.name, 0);
        n++;
      } catch (err) {
        if (!isNotFound(err)) throw err;
      }
    }
    if (n) this.log.warn({ node, pods: n }, "pods of a fenced node deleted with grace 0");
    return n;
  }

  private async report(node: KubeObject, outcome: Outcome, reason: string, message: string): Promise<void> {
    const name = node.metadata.name;
    this.handled.set(name, outcome);
    this.counter?.inc({ outcome });
    (outcome === "fenced" ? this.log.error : this.log.warn).call(this.log, { node: name, reason }, message);
    const now = new Date(this.now()).toISOString().replace(/\.\d+Z$/, "Z");
    await createEvent(this.o.client, {
      namespace: "default",
      involved: { kind: "Node", name, uid: node.metadata.uid, apiVersion: "v1" },
      reason,
      message,
      type: "Warning",
      component: "bashible-fencing-controller",
    }).catch((err) => this.log.warn({ err: (err as Error).message }, "cannot write the fencing Event"));
    await this.o.client
      .request("PATCH", `/api/v1/nodes/${encodeURIComponent(name)}/status`, {
        contentType: "application/strategic-merge-patch+json",
        body: {
          status: {
            conditions: [
              {
                type: CONDITION_TYPE,
                status: "True",
                reason,
                message: message.slice(0, 1000),
                lastHeartbeatTime: now,
                lastTransitionTime: now,
              },
            ],
          },
        },
      })
      .catch((err) => {
        if (!isNotFound(err)) this.log.warn({ err: (err as Error).message }, "cannot set the fencing condition");
      });
  }
}

interface LeaseSpec {
  renewTime?: string;
}
const renewOf = (l: KubeObject) => (l.spec as LeaseSpec | undefined)?.renewTime ?? "";

/**
 * Runs the controller on the leader only (a Lease in d8-cloud-instance-manager), through the
 * same leadership helper as the server's writers and the update controllers. Validates the
 * timings first: an unsafe threshold is refused before anything starts.
 */
export function startFencingController(o: FencingControllerOptions): Leadership {
  fencingTimings(o.timings);
  return whileLeading(
    {
      client: o.client,
      namespace: o.lease?.namespace ?? NAMESPACE,
      name: o.lease?.name ?? LEASES.fencing,
      log: o.log,
      leaseDurationSeconds: o.lease?.durationSeconds,
    },
    (signal) => {
      const controller = new FencingController(o);
      controller.start();
      // Stopping leading (lost the Lease, or stopping) stops the controller.
      signal.addEventListener("abort", () => controller.stop(), { once: true });
    },
  );
}

// ---- `bashible server` flags -----------------------------------------------------------------

export const FENCING_CONTROLLER_OPTIONS = {
  "fencing-threshold": { type: "string" },
  "fencing-watchdog-timeout": { type: "string" },
  "fencing-detection-window": { type: "string" },
  "fencing-kubelet-window": { type: "string" },
  "fencing-margin": { type: "string" },
  "no-fencing-controller": { type: "boolean" },
} as const;

const D = DEFAULT_CONTROLLER_TIMINGS;
export const FENCING_CONTROLLER_HELP = `Fencing controller (with a cluster; leader-elected; see docs/fencing.md):
      --fencing-threshold S         kubelet Lease age that frees a node's workloads (default ${D.thresholdSeconds})
      --fencing-watchdog-timeout S  the nodes' watchdog timeout (default ${D.watchdogTimeoutSeconds})
      --fencing-detection-window S  the nodes' detection window (default ${D.detectionWindowSeconds})
      --fencing-kubelet-window S    the nodes' kubelet window (default ${D.kubeletWindowSeconds})
      --fencing-margin S            safety margin (default ${D.marginSeconds}); the threshold must be
                                    greater than watchdog timeout + each window + margin (a node
                                    that states its own windows is checked against those)
      --no-fencing-controller       do not run it (--no-controllers turns it off as well)`;

/** Timings from the server's flags; throws FencingConfigError (a usage error) when unsafe. */
export function fencingTimingsFromFlags(v: Record<string, unknown>): ControllerTimings {
  const num = (k: string): number | undefined => {
    const s = v[k];
    if (s === undefined) return undefined;
    const n = Number(s);
    if (!Number.isFinite(n) || n < 0) throw new FencingConfigError(`--${k} '${String(s)}' is not a number of seconds`);
    return n;
  };
  const t: Partial<ControllerTimings> = {};
  const set = (k: keyof ControllerTimings, flag: string) => {
    const n = num(flag);
    if (n !== undefined) t[k] = n;
  };
  set("thresholdSeconds", "fencing-threshold");
  set("watchdogTimeoutSeconds", "fencing-watchdog-timeout");
  set("detectionWindowSeconds", "fencing-detection-window");
  set("kubeletWindowSeconds", "fencing-kubelet-window");
  set("marginSeconds", "fencing-margin");
  return fencingTimings(t);
}
