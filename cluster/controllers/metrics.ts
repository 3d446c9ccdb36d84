// The controllers' metrics, on the bundle server's /metrics (cluster/server/metrics.ts appends
// them) and on `bashible controllers --metrics-address`. Gauges are computed at scrape time
// from what the controllers hold in their caches (operator-metrics.ts), so a series exists
// exactly while its cause does, as Deckhouse's hooks expire and re-set theirs on every run. A
// source is registered while its controller leads and removed when it stops: a replica that
// does not lead exports none of them (alerts take `max by` over replicas, as Deckhouse's do).
import { Gauge, Registry, type Counter, type Labels } from "../../lib/prometheus.ts";

export type Sample = { labels: Labels; value: number };
/** name → samples; every name must be in FAMILIES. */
export type Samples = Record<string, Sample[]>;

export const FAMILIES: Record<string, string> = {
  // Deckhouse's names (modules/040-node-manager/hooks/…), so its dashboards and alerts work.
  node_group_node_status:
    "Node's update state (update_approval.go): 1 for the state it is in, 0 for the others. Statuses: WaitingForApproval, Approved, DrainingForDisruption, Draining, Drained, WaitingForDisruptionApproval, WaitingForManualDisruptionApproval, DisruptionApproved, ToBeUpdated, UpToDate, UpdateFailedNoConfigChecksum",
  node_group_info: "1 per NodeGroup, with its CRI type",
  d8_node_draining: "1 while a node's drain cannot evict its pods (they are deleted at the drain's deadline)",
  d8_unmanaged_nodes_on_cluster: "1 per Node without the node.deckhouse.io/group label",
  d8_node_group_configurations_total: "NodeGroupConfigurations per entry of their spec.nodeGroups ('*' counted as '*')",
  d8_nodegroup_taint_missing: "1 when NodeGroup master lacks the node-role.kubernetes.io/control-plane taint",
  d8_fencing_configuration_error:
    "1 while a fencing-enabled node could not be fenced for its configuration (profile: agent-timings, the node's own timings fail the controller's invariants)",
  d8_fencing_invalid_node_reference:
    "1 while a fencing-enabled node cannot be judged (reason LeaseNotFound: no kubelet Lease in kube-node-lease)",
  // This project's own.
  bashible_node_group_nodes: "Nodes of the group",
  bashible_node_group_nodes_ready: "Nodes of the group whose Ready condition is True",
  bashible_node_group_nodes_up_to_date: "Nodes of the group whose configuration checksum is the group's",
  bashible_node_group_fencing_mode: "1 per NodeGroup with spec.fencing, labelled with its mode",
  bashible_node_fencing_disarmed:
    "1 while a Ready node of a Watchdog fencing group, not in maintenance, lacks the node-manager.deckhouse.io/fencing-enabled label (its agent does not fence it)",
  bashible_node_converge_failing:
    "1 while a node's converge to its group's current checksum failed and it has not applied it since, with the failing step",
  bashible_node_bundle_rejected:
    "1 while a node refuses its group's bundle (BashibleBundleRejected) and keeps its last good one",
  bashible_node_drain_forced_timestamp_seconds:
    "When the node's last drain deleted pods it could not evict (from bashible.deckhouse.io/drain-forced)",
};

export class ControllerMetrics {
  /** Counters that live as long as the process. */
  readonly registry = new Registry();
  readonly drains: Counter = this.registry.counter(
    "bashible_node_drains_total",
    "Drains finished by this replica, by node group and result (clean, or forced: pods deleted without eviction)",
  );
  readonly templatePatches: Counter = this.registry.counter(
    "bashible_node_template_patches_total",
    "Node patches that applied a nodeTemplate, by node group",
  );
  private readonly sources = new Set<() => Samples>();

  /** Adds a source of gauges; returns its removal. */
  add(source: () => Samples): () => void {
    this.sources.add(source);
    return () => this.sources.delete(source);
  }

  text(): string {
    const gauges = new Map<string, Gauge>();
    for (const source of this.sources) {
      for (const [name, samples] of Object.entries(source())) {
        const help = FAMILIES[name];
        if (help === undefined) throw new Error(`metric ${name} is not in FAMILIES (cluster/controllers/metrics.ts)`);
        let g = gauges.get(name);
        if (!g) {
          g = new Gauge(name, help);
          gauges.set(name, g);
        }
        for (const s of samples) g.set(s.labels, s.value);
      }
    }
    return this.registry.text() + [...gauges.values()].map((g) => g.text()).join("");
  }
}

/** The process's one set, as a Prometheus client's default registry: the server's /metrics serves it. */
export const CONTROLLER_METRICS = new ControllerMetrics();
