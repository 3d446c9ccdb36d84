// The update controller: approval of updates and disruptions, drains, NodeGroup status and
// Events. Level-triggered: informers (list + watch) keep Nodes, NodeGroups and the checksums
// Secret in memory, and any change runs one reconcile pass over every group; nothing is polled.
// A pass decides from the cache only (decide.ts) and writes Nodes with their resourceVersion as
// a precondition, so a decision never lands on a Node that changed since it was read; a group
// is not decided again until the cache shows this controller's own last writes.
import { EVENTS, NAMESPACE, NODE_KEYS, SECRETS } from "../../bundles/names.ts";
import type { KubeClient } from "../../lib/kube/client.ts";
import type { KubeObject } from "../../lib/kube/api.ts";
import { isConflict, isNotFound } from "../../lib/kube/errors.ts";
import { Informer, type InformerEvent } from "../../lib/informer.ts";
import type { Logger } from "../../lib/log/log.ts";
import { decideGroup, type GroupDecision, type NodeEvent, type NodePatch } from "./decide.ts";
import { NodeDrain } from "./drain.ts";
import { EventRecorder } from "./events.ts";
import { groupPolicy, nodeView, trimNode, type GroupPolicy, type NodeView } from "./model.ts";
import { StatusWriter, statusBody } from "./status.ts";
import { groupConditions, groupErrors, groupKubernetesVersion } from "./group-conditions.ts";

export interface UpdateControllerOptions {
  client: KubeClient;
  log: Logger;
  /** Namespace of the checksums Secret. */
  namespace?: string;
  /** Injected clock (maintenance windows, drain deadlines, eviction retries). */
  now?: () => number;
  /** Wait between attempts at a refused eviction; default 20 s. */
  evictionRetryMs?: number;
  /** Drain timeout when the group sets no nodeDrainTimeoutSecond; default 5 min. */
  drainTimeoutMs?: number;
  /** At most one NodeGroup status write per group per this long; default 1 s. */
  statusIntervalMs?: number;
  /** Longest time between passes when nothing happens (re-reads the clock; no API calls); default 30 s. */
  recheckMs?: number;
  /** Also told every event of the managed Nodes' watch (another controller sharing it). */
  onNodeEvent?: (ev: InformerEvent<KubeObject>) => void;
  /** Told when a NodeGroup or the checksums Secret changes (the controllers that read them too). */
  onGroupEvent?: (ev: InformerEvent<KubeObject>) => void;
  onChecksumsEvent?: () => void;
  /** A drain finished (the drains metric counts them). */
  onDrainDone?: (node: string, group: string, result: "clean" | "forced") => void;
}

/** What the update controller sees now, for the metrics (read at scrape time). */
export interface UpdateView {
  groups: { policy: GroupPolicy; spec: Record<string, unknown> }[];
  nodes: NodeView[];
  checksums: Map<string, string>;
  /** Nodes being drained whose pods could not all be evicted: the node and what is wrong. */
  drainTrouble: Map<string, string>;
}

export const DEFAULTS = { evictionRetryMs: 20_000, drainTimeoutMs: 300_000, statusIntervalMs: 1000, recheckMs: 30_000 };

/** How many of a Node's latest resourceVersions are remembered (seenRvs). */
const SEEN_RVS = 16;

interface Pending {
  rv: string;
  since: number;
}

export class UpdateController {
  private readonly o: UpdateControllerOptions;
  private readonly log: Logger;
  private readonly now: () => number;
  /** The managed Nodes (trimNode), shared with the kubelet serving approver. */
  readonly nodes: Informer;
  readonly groups: Informer;
  private readonly secret: Informer;
  /** NodeGroupConfigurations: their render errors go into the groups' status (and the metrics). */
  readonly configurations: Informer;
  private readonly events: EventRecorder;
  private readonly status: StatusWriter;
  private readonly drains = new Map<string, NodeDrain>();
  /** Node → resourceVersion of this controller's last write, until the cache shows it. */
  private readonly pending = new Map<string, Pending>();
  /**
   * The last resourceVersions the watch delivered per Node. A write's response can come after
   * the watch delivered the write and a later change (a busy machine, a node writing at once):
   * then the cache holds the later version, and waiting for the write's own would wait for an
   * event that already went by.
   */
  private readonly seenRvs = new Map<string, string[]>();
  private readonly unknownGroups = new Set<string>();
  private running: Promise<void> | undefined;
  private again = false;
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  private retryAt: number | undefined;
  /** Counters for tests and the benchmark. */
  readonly stats = { passes: 0, nodeWrites: 0, conflicts: 0 };

  constructor(o: UpdateControllerOptions) {
    this.o = o;
    this.log = o.log;
    this.now = o.now ?? Date.now;
    const onEvent = (ev: InformerEvent<KubeObject>) => this.onNodeEvent(ev);
    this.nodes = new Informer({
      client: o.client,
      path: "/api/v1/nodes",
      labelSelector: NODE_KEYS.group,
      log: o.log,
      trim: trimNode,
      onEvent,
    });
    this.groups = new Informer({
      client: o.client,
      path: "/apis/deckhouse.io/v1/nodegroups",
      log: o.log,
      onEvent: (ev) => {
        this.o.onGroupEvent?.(ev);
        this.poke();
      },
    });
    this.secret = new Informer({
      client: o.client,
      path: `/api/v1/namespaces/${o.namespace ?? NAMESPACE}/secrets`,
      fieldSelector: `metadata.name=${SECRETS.checksums}`,
      log: o.log,
      onEvent: () => {
        this.o.onChecksumsEvent?.();
        this.poke();
      },
    });
    this.configurations = new Informer({
      client: o.client,
      path: "/apis/deckhouse.io/v1alpha1/nodegroupconfigurations",
      log: o.log,
      trim: (c) => ({
        metadata: { name: c.metadata.name, resourceVersion: c.metadata.resourceVersion },
        spec: { nodeGroups: (c.spec as { nodeGroups?: string[] } | undefined)?.nodeGroups },
        status: {
          error: (c.status as { error?: string } | undefined)?.error,
          failedNodeGroups: (c.status as { failedNodeGroups?: string[] } | undefined)?.failedNodeGroups,
        },
      }),
      onEvent: () => this.poke(),
    });
    this.events = new EventRecorder(o.client, o.log);
    this.status = new StatusWriter(o.client, o.log, o.statusIntervalMs ?? DEFAULTS.statusIntervalMs);
  }

  start(): void {
    this.log.info("update controller starting");
    this.nodes.run();
    this.groups.run();
    this.secret.run();
    this.configurations.run();
  }

  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
    for (const i of [this.nodes, this.groups, this.secret, this.configurations]) i.stop();
    for (const d of this.drains.values()) d.stop();
    this.drains.clear();
    this.status.stop();
  }

  /** Run a pass soon (something changed, or the injected clock moved). */
  poke(): void {
    if (this.stopped) return;
    if (this.running) {
      this.again = true;
      return;
    }
    this.running = this.pass()
      .catch((err: Error) => this.log.error({ err: err.message }, "update controller pass failed; retrying"))
      .finally(() => {
        this.running = undefined;
        if (this.again && !this.stopped) {
          this.again = false;
          this.poke();
        }
      });
  }

  /** What the controller sees now (the metrics read it at scrape time). */
  view(): UpdateView {
    const drainTrouble = new Map<string, string>();
    for (const [name, d] of this.drains) if (d.trouble) drainTrouble.set(name, d.trouble);
    return {
      groups: [...this.groups.objects.values()].map((ng) => ({
        policy: groupPolicy(ng),
        spec: (ng.spec ?? {}) as Record<string, unknown>,
      })),
      nodes: [...this.nodes.objects.values()].map(nodeView),
      checksums: this.checksums(),
      drainTrouble,
    };
  }

  /** Whether every watch has listed once (metrics are only exported from a whole picture). */
  get synced(): boolean {
    return this.nodes.synced && this.groups.synced && this.secret.synced;
  }

  /** Resolves once no pass runs (tests). */
  async settled(): Promise<void> {
    while (this.running) await this.running;
  }

  /** Nodes whose decisions wait for the watch to show the controller's own write (tests). */
  get pendingNodes(): string[] {
    return [...this.pending.keys()];
  }

  get eventsSent(): number {
    return this.events.sent;
  }

  get statusWrites(): number {
    return this.status.writes;
  }

  private onNodeEvent(ev: InformerEvent<KubeObject>): void {
    this.o.onNodeEvent?.(ev);
    if (ev.type === "SYNC") {
      this.pending.clear();
      this.seenRvs.clear();
      for (const n of this.nodes.objects.values()) {
        const rv = n.metadata.resourceVersion;
        if (rv) this.seenRvs.set(n.metadata.name, [rv]);
      }
    } else {
      const name = ev.object.metadata.name;
      if (ev.type === "DELETED") this.seenRvs.delete(name);
      else {
        const rv = ev.object.metadata.resourceVersion;
        const seen = this.seenRvs.get(name) ?? [];
        if (rv) this.seenRvs.set(name, [...seen.slice(-(SEEN_RVS - 1)), rv]);
      }
      const p = this.pending.get(name);
      if (p && (ev.type === "DELETED" || ev.object.metadata.resourceVersion === p.rv)) this.pending.delete(name);
      if (ev.type === "DELETED") this.events.forget(name);
    }
    this.poke();
  }

  /** The groups' checksums from Secret configuration-checksums. */
  checksums(): Map<string, string> {
    const s = this.secret.objects.get(`${this.o.namespace ?? NAMESPACE}/${SECRETS.checksums}`);
    const data = (s?.data ?? {}) as Record<string, string>;
    return new Map(Object.entries(data).map(([g, v]) => [g, Buffer.from(v, "base64").toString("utf8").trim()]));
  }

  private isPending(node: string): boolean {
    const p = this.pending.get(node);
    if (!p) return false;
    // The watch should show a write within moments; if it never does, decide anew.
    if (this.now() - p.since > 30_000 && Date.now() - p.since > 30_000) {
      this.log.warn({ node }, "own write not seen in the watch after 30 s; deciding from the cache");
      this.pending.delete(node);
      return false;
    }
    return true;
  }

  private async pass(): Promise<void> {
    if (!this.nodes.synced || !this.groups.synced || !this.secret.synced) return;
    this.stats.passes++;
    const now = this.now();
    const checksums = this.checksums();
    const byGroup = new Map<string, NodeView[]>();
    for (const obj of this.nodes.objects.values()) {
      const v = nodeView(obj);
      const list = byGroup.get(v.group);
      if (list) list.push(v);
      else byGroup.set(v.group, [v]);
    }
    let wake = now + (this.o.recheckMs ?? DEFAULTS.recheckMs);
    const timeouts = new Map<string, number>();
    const work: Promise<void>[] = [];
    for (const ng of this.groups.objects.values()) {
      const policy = groupPolicy(ng);
      const name = policy.name;
      timeouts.set(name, policy.drainTimeoutMs ?? this.o.drainTimeoutMs ?? DEFAULTS.drainTimeoutMs);
      const members = byGroup.get(name) ?? [];
      byGroup.delete(name);
      if (members.some((n) => this.isPending(n.name))) continue;
      const d = decideGroup(policy, members, checksums.get(name), now);
      work.push(this.apply(d.actions, new Map(members.map((n) => [n.name, n]))));
      for (const w of d.waits) this.events.emit(w, members.find((n) => n.name === w.node)?.uid);
      // A NodeGroupConfiguration that does not render for this group is its error too; until
      // they are listed (or without the CRD), none is known.
      const errors = groupErrors(name, policy.error, this.configurations.objects.values());
      const current = (ng.status as { conditions?: [] } | undefined)?.conditions;
      this.status.set(
        name,
        statusBody(d.status, {
          errors,
          conditions: groupConditions(members, errors, current, now),
          kubernetesVersion: groupKubernetesVersion(members),
        }),
        ng.status,
      );
      if (d.wakeAt !== undefined) wake = Math.min(wake, d.wakeAt);
    }
    for (const g of byGroup.keys()) {
      if (this.unknownGroups.has(g)) continue;
      this.unknownGroups.add(g);
      this.log.warn({ group: g }, `nodes carry ${NODE_KEYS.group}=${g} but there is no such NodeGroup; left alone`);
    }
    await Promise.all(work);
    wake = Math.min(wake, await this.runDrains(now, timeouts));
    if (this.retryAt !== undefined) wake = Math.min(wake, this.retryAt);
    this.retryAt = undefined;
    this.schedule(wake);
  }

  /**
   * Writes one group's decisions: nodes that finished first, and only if all of those landed
   * the rest, so the API never shows more nodes approved than maxConcurrent allows.
   */
  private async apply(actions: GroupDecision["actions"], nodes: Map<string, NodeView>): Promise<void> {
    const finished = actions.filter((a) => a.event.reason === EVENTS.updateFinished);
    const rest = actions.filter((a) => a.event.reason !== EVENTS.updateFinished);
    const write = async (a: GroupDecision["actions"][number]) => {
      const n = nodes.get(a.patch.node);
      if (!(await this.write(n, a.patch))) return false;
      this.events.emit(a.event, n?.uid);
      if (a.event.reason === EVENTS.updateFinished) this.events.forget(a.patch.node);
      return true;
    };
    const ok = await Promise.all(finished.map(write));
    if (ok.every(Boolean)) await Promise.all(rest.map(write));
  }

  /** Drains every node that carries `draining`, whichever group or mode asked for it. */
  private async runDrains(now: number, timeouts: Map<string, number>): Promise<number> {
    let wake = Number.POSITIVE_INFINITY;
    const want = new Set<string>();
    const steps: Promise<void>[] = [];
    for (const obj of this.nodes.objects.values()) {
      const n = nodeView(obj);
      if (n.annotations[NODE_KEYS.draining] === undefined) continue;
      want.add(n.name);
      if (this.isPending(n.name)) continue;
      let drain = this.drains.get(n.name);
      if (!drain) {
        drain = new NodeDrain(n.name, {
          client: this.o.client,
          log: this.log,
          events: this.events,
          now: this.now,
          retryMs: this.o.evictionRetryMs ?? DEFAULTS.evictionRetryMs,
          poke: () => this.poke(),
          onDone: (result) => this.o.onDrainDone?.(n.name, n.group, result),
        });
        this.drains.set(n.name, drain);
      }
      const timeout = timeouts.get(n.group) ?? this.o.drainTimeoutMs ?? DEFAULTS.drainTimeoutMs;
      steps.push(
        drain
          .step(n, timeout)
          .then(async (s) => {
            if (s.wakeAt !== undefined) wake = Math.min(wake, s.wakeAt);
            if (s.patch && (await this.write(n, s.patch)) && s.event) this.events.emit(s.event, n.uid);
          })
          .catch((err: Error) => {
            this.log.warn({ node: n.name, err: err.message }, "drain step failed; retrying");
            wake = Math.min(wake, now + 5000);
          }),
      );
    }
    await Promise.all(steps);
    for (const [name, d] of this.drains) {
      if (want.has(name)) continue;
      d.stop();
      this.drains.delete(name);
    }
    return wake;
  }

  /** Merge-patches a Node with its cached resourceVersion as a precondition. */
  private async write(n: NodeView | undefined, p: NodePatch): Promise<boolean> {
    if (!n) return false;
    const body: Record<string, unknown> = {
      metadata: { resourceVersion: n.resourceVersion, annotations: p.annotations },
    };
    if (p.unschedulable !== undefined) body.spec = { unschedulable: p.unschedulable ? true : null };
    try {
      this.stats.nodeWrites++;
      const res = await this.o.client.request<KubeObject>("PATCH", `/api/v1/nodes/${encodeURIComponent(n.name)}`, {
        body,
        timeoutMs: 10_000,
      });
      const rv = res.metadata.resourceVersion;
      // Unless the watch already delivered it, hold decisions on this node until it does.
      if (rv && !this.seenRvs.get(n.name)?.includes(rv)) this.pending.set(n.name, { rv, since: this.now() });
      return true;
    } catch (err) {
      if (isConflict(err)) {
        // The Node changed since it was read: the watch brings the new state, decide again then.
        this.stats.conflicts++;
        return false;
      }
      if (isNotFound(err)) return false;
      this.log.warn({ node: n.name, err: (err as Error).message }, "cannot write Node; retrying");
      this.retryAt = Math.min(this.retryAt ?? Number.POSITIVE_INFINITY, this.now() + 2000);
      return false;
    }
  }

  private schedule(at: number): void {
    if (this.stopped) return;
    clearTimeout(this.timer);
    const delay = Math.min(Math.max(at - this.now(), 10), this.o.recheckMs ?? DEFAULTS.recheckMs);
    this.timer = setTimeout(() => this.poke(), delay);
    this.timer.unref();
  }
}

export type { NodeEvent };
