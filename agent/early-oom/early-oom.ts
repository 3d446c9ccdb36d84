// Early OOM, the resident agent's third job: sample memory pressure (four times a second near a
// threshold, once a second while the node is calm: pace.ts), and when the node is really short
// of memory (trigger.ts), kill the pod the kubelet would evict first (rank.ts), whole (kill.ts),
// before the kernel's OOM killer or the kubelet's 10-second eviction loop would act; then an
// Event on the pod, metrics, a cooldown. Static and critical pods are never killed.
import { writeFileSync } from "node:fs";
import path from "node:path";
import type { KubeClient } from "../../lib/kube/client.ts";
import type { Logger } from "../../lib/log/log.ts";
import { Counter, type Gauge, type Histogram, type Registry } from "../../lib/prometheus.ts";
import { createEvent } from "../../lib/kube/api.ts";
import { EVENTS } from "../../bundles/names.ts";
import { type EarlyOomConfig, resolveEarlyOomConfig } from "./config.ts";
import { type Clock, monotonicClock } from "./clock.ts";
import { PsiUnavailableError, Sampler, type WindowFigures } from "./sampler.ts";
import { CALM, cooldown, evaluate, type TriggerState } from "./trigger.ts";
import { type Pace, pace } from "./pace.ts";
import { type CgroupLayout, detectLayout, discoverPods } from "./cgroups.ts";
import { type PodFacts, type PodSource, WatchedPods } from "./pods.ts";
import { podLabel, type RankedCandidate, type Ranking, rankCandidates } from "./rank.ts";
import { type KillResult, killPod } from "./kill.ts";
import { bytes, pct } from "./format.ts";

const DONE = Promise.resolve();

export { DEFAULT_EARLY_OOM, type EarlyOomConfig, EarlyOomConfigError, resolveEarlyOomConfig } from "./config.ts";

export interface EarlyOomOptions {
  /** `/proc` (or the tree standing in for it). */
  procRoot: string;
  /** `/sys/fs/cgroup` (or the tree standing in for it). */
  cgroupRoot: string;
  /** `/proc/sysrq-trigger`, for the fallback. */
  sysrqPath: string;
  nodeName: string;
  log: Logger;
  /** The agent's current API client (it changes when credentials are reloaded); undefined in local mode. */
  kube: () => KubeClient | undefined;
  metrics: Registry;
  clock?: Clock;
  /** Pod objects from somewhere other than a watch of the API (tests; a saved list). */
  pods?: PodSource;
}

export interface EarlyOomAction {
  at: string;
  action: "kill" | "dry-run" | "sysrq" | "none";
  pod?: string;
  uid?: string;
  trigger: string;
  victim?: string;
  result?: string;
  figures: Record<string, number | undefined>;
}

/** What to act on: the pods in the cgroup tree, matched and ranked. */
export function rankNode(
  cgroupRoot: string,
  pods: Map<string, PodFacts>,
  cfg: EarlyOomConfig,
): Ranking & {
  layout: CgroupLayout | undefined;
} {
  const layout = detectLayout(cgroupRoot);
  if (!layout) return { layout, ranked: [], excluded: [] };
  return { layout, ...rankCandidates(discoverPods(layout), pods, cfg) };
}

interface Metrics {
  enabled: Gauge;
  dryRun: Gauge;
  psiUnavailable: Gauge;
  stall: Gauge;
  memAvailable: Gauge;
  reclaim: Gauge;
  pressureSeconds: Gauge;
  cooldown: Gauge;
  decisions: Counter;
  kills: Counter;
  killFailures: Counter;
  killDuration: Histogram;
  lastAction: Gauge;
  samples: Counter;
  sampleErrors: Counter;
  sampleInterval: Gauge;
}

/** A counter read at scrape time: a plain number on the path of every sample, no label key built. */
class CountedAt extends Counter {
  private readonly read: () => number;
  constructor(name: string, help: string, read: () => number) {
    super(name, help);
    this.read = read;
  }
  override samples(): string[] {
    return [`${this.name} ${this.read()}`];
  }
}

function registerMetrics(r: Registry, samples: () => number): Metrics {
  const p = "bashible_early_oom_";
  return {
    enabled: r.gauge(`${p}enabled`, "1 when early OOM samples memory pressure"),
    dryRun: r.gauge(`${p}dry_run`, "1 when early OOM only logs its decisions"),
    psiUnavailable: r.gauge(`${p}psi_unavailable`, "1 when /proc/pressure/memory is missing; early OOM then idles"),
    stall: r.gauge(`${p}memory_stall_ratio`, "share of the last window with memory stall (kind=some|full), 0..1"),
    memAvailable: r.gauge(`${p}memory_available_bytes`, "MemAvailable from /proc/meminfo"),
    reclaim: r.gauge(`${p}reclaim_pages_per_second`, "pages scanned + working-set refaults per second, last window"),
    pressureSeconds: r.gauge(
      `${p}pressure_seconds`,
      "how long the full stall has stayed at or above the threshold (0 when below)",
    ),
    cooldown: r.gauge(`${p}cooldown`, "1 while early OOM waits after an action"),
    decisions: r.counter(`${p}decisions_total`, "trigger met, by what was done (action=kill|dry-run|sysrq|none)"),
    kills: r.counter(`${p}kills_total`, "pods killed, by namespace and QoS class"),
    killFailures: r.counter(`${p}kill_failures_total`, "kills that failed or left tasks behind"),
    killDuration: r.histogram(
      `${p}kill_duration_seconds`,
      "from the decision to the victim's last task gone",
      [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
    ),
    lastAction: r.gauge(`${p}last_action_timestamp_seconds`, "Unix time of the last action (kill, dry-run, sysrq)"),
    samples: r.add(new CountedAt(`${p}samples_total`, "pressure samples taken", samples)),
    sampleErrors: r.counter(`${p}sample_errors_total`, "pressure samples that could not be read"),
    sampleInterval: r.gauge(
      `${p}sample_interval_seconds`,
      "time to the next sample: short near a threshold, long while the node is calm",
    ),
  };
}

export class EarlyOom {
  private readonly o: EarlyOomOptions;
  private readonly log: Logger;
  private readonly clock: Clock;
  private readonly m: Metrics;
  private cfg: EarlyOomConfig | undefined;
  private sampler: Sampler | undefined;
  private state: TriggerState = CALM;
  private pace: Pace = { ms: 0, calm: false, reason: "not started" };
  private psi: "unknown" | "available" | "unavailable" = "unknown";
  private timer: { cancel(): void } | undefined;
  private inflight: Promise<void> | undefined;
  private watched: WatchedPods | undefined;
  private readonly pending = new Set<Promise<void>>();
  private lastFigures: WindowFigures | undefined;
  private lastSampleError: string | undefined;
  private lastAction: EarlyOomAction | undefined;
  private readonly counts = { kill: 0, "dry-run": 0, sysrq: 0, none: 0 };
  private sampleCount = 0;

  constructor(o: EarlyOomOptions) {
    this.o = o;
    this.log = o.log.child({ component: "early-oom" });
    this.clock = o.clock ?? monotonicClock;
    this.m = registerMetrics(o.metrics, () => this.sampleCount);
    this.m.enabled.set(0);
    this.m.psiUnavailable.set(0);
  }

  /**
   * Applies a configuration (defaults fill what is missing). undefined or enabled=false stops
   * sampling. A bad configuration throws EarlyOomConfigError and the running one stays.
   */
  configure(input: Partial<EarlyOomConfig> | undefined): void {
    const next = input === undefined ? undefined : resolveEarlyOomConfig(input);
    const was = this.cfg;
    if (!next?.enabled) {
      if (was) this.log.info("early OOM disabled");
      this.halt();
      this.cfg = undefined;
      this.m.enabled.set(0);
      return;
    }
    if (was && JSON.stringify(was) === JSON.stringify(next)) return;
    this.halt();
    this.cfg = next;
    this.sampler = new Sampler(
      this.o.procRoot,
      next.durationMs + 2 * next.windowMs + 2 * Math.max(next.sampleIntervalMs, next.calmSampleIntervalMs),
    );
    this.state = CALM;
    this.pace = pace(next, CALM, undefined);
    this.psi = "unknown";
    this.m.enabled.set(1);
    this.m.dryRun.set(next.dryRun ? 1 : 0);
    this.log.info(
      {
        fullStallPercent: next.fullStallPercent,
        durationMs: next.durationMs,
        windowMs: next.windowMs,
        sampleIntervalMs: next.sampleIntervalMs,
        calmSampleIntervalMs: next.calmSampleIntervalMs,
        memAvailablePercent: next.memAvailablePercent,
        reclaimPagesPerSecond: next.reclaimPagesPerSecond,
        dryRun: next.dryRun,
        fallback: next.fallback,
      },
      was ? "early OOM reconfigured" : "early OOM on",
    );
    this.schedule(0);
  }

  /** Stops sampling and the pod watch; waits for a tick in progress and for Events being written. */
  async stop(): Promise<void> {
    this.halt();
    this.cfg = undefined;
    this.m.enabled.set(0);
    await this.inflight;
    const settle = Promise.all([...this.pending]);
    await Promise.race([settle, new Promise((r) => setTimeout(r, 3000).unref())]);
  }

  status() {
    const cfg = this.cfg;
    const f = this.lastFigures;
    const now = this.clock.now();
    const pods = this.podSource();
    return {
      enabled: cfg !== undefined,
      dryRun: cfg?.dryRun ?? false,
      psi: this.psi,
      psiFile: this.sampler?.psiFile ?? path.join(this.o.procRoot, "pressure/memory"),
      sampleError: this.lastSampleError,
      config: cfg,
      pressure: f && {
        windowSeconds: f.spanMs / 1000,
        fullStall: f.full,
        someStall: f.some,
        fullAvg10: f.fullAvg10,
        memAvailableBytes: f.memAvailable,
        memTotalBytes: f.memTotal,
        reclaimPagesPerSecond: f.reclaimPerSecond,
        refaultPagesPerSecond: f.refaultPerSecond,
      },
      sampling: { intervalMs: this.pace.ms, calm: this.pace.calm, reason: this.pace.reason },
      trigger: {
        phase: this.state.phase,
        reason: this.state.reason,
        aboveForSeconds:
          this.state.aboveSince !== undefined && this.state.phase !== "cooldown"
            ? (now - this.state.aboveSince) / 1000
            : 0,
        cooldownRemainingSeconds:
          this.state.phase === "cooldown" && this.state.cooldownUntil !== undefined
            ? Math.max(0, (this.state.cooldownUntil - now) / 1000)
            : 0,
      },
      pods: {
        source: this.o.pods ? "given" : this.watched ? "watch" : "none",
        synced: pods?.synced ?? false,
        count: pods ? new Set(pods.byUid().values()).size : 0,
        error: pods?.error,
      },
      actions: { ...this.counts },
      lastAction: this.lastAction,
    };
  }

  /** The ranking as it would be decided now (for status and dry runs). */
  rank(): ReturnType<typeof rankNode> {
    return rankNode(this.o.cgroupRoot, this.podSource()?.byUid() ?? new Map(), this.cfg ?? resolveEarlyOomConfig({}));
  }

  private halt(): void {
    this.timer?.cancel();
    this.timer = undefined;
    this.watched?.stop();
    this.watched = undefined;
    this.sampler?.close();
  }

  private schedule(ms: number): void {
    this.timer = this.clock.timer(ms, () => {
      this.timer = undefined;
      // A tick still running (a kill, say) finishes before the next one starts. Otherwise a
      // sample is synchronous, and only an action returns a promise: no promise chain per sample.
      const prev = this.inflight;
      const run = prev ? prev.then(() => this.tick()) : this.tick();
      if (!run) {
        this.next();
        return DONE;
      }
      const tracked = run.finally(() => {
        this.inflight = undefined;
        this.next();
      });
      this.inflight = tracked;
      return tracked;
    });
  }

  /** The next sample at the current pace (a whole number of ms: Node keeps one timer list per duration). */
  private next(): void {
    if (this.cfg && this.psi !== "unavailable" && !this.timer) this.schedule(Math.round(this.pace.ms));
  }

  /** This node's pods: given, or from a watch with the agent's current client. */
  private podSource(): PodSource | undefined {
    if (this.o.pods) return this.o.pods;
    if (!this.cfg) return this.watched;
    const client = this.o.kube();
    if (client !== this.watched?.client) {
      this.watched?.stop();
      this.watched = client ? new WatchedPods(client, this.o.nodeName, this.log) : undefined;
    }
    return this.watched;
  }

  /** One sample and its decision; a promise only when it acts. */
  private tick(): Promise<void> | undefined {
    const cfg = this.cfg;
    const sampler = this.sampler;
    if (!cfg || !sampler) return undefined;
    const now = this.clock.now();
    try {
      sampler.push(sampler.read(now, this.pace.calm));
    } catch (err) {
      if (err instanceof PsiUnavailableError) {
        this.psi = "unavailable";
        this.m.psiUnavailable.set(1);
        this.log.warn(
          { file: sampler.psiFile },
          `memory pressure (PSI) is not available (${err.message}); early OOM idles. It needs a kernel with CONFIG_PSI, booted without psi=0`,
        );
        return undefined;
      }
      this.m.sampleErrors.inc();
      const msg = (err as Error).message;
      if (msg !== this.lastSampleError) this.log.error(`early OOM cannot read memory pressure: ${msg}`);
      this.lastSampleError = msg;
      return undefined;
    }
    this.lastSampleError = undefined;
    if (this.psi !== "available") {
      this.psi = "available";
      this.m.psiUnavailable.set(0);
    }
    this.sampleCount++;
    // The common case on a calm node: nothing moved since the last sample and nothing new was
    // read, so the figures, the trigger's state and the pace are what they were.
    if (this.pace.calm && this.state.phase === "calm" && sampler.unchanged()) return undefined;
    this.podSource(); // keeps the watch on the current client (at least every few seconds)
    const w = sampler.window(cfg.windowMs);
    this.lastFigures = w;
    if (w) {
      this.m.stall.set({ kind: "full" }, w.full);
      this.m.stall.set({ kind: "some" }, w.some);
      if (w.memAvailable !== undefined) this.m.memAvailable.set(w.memAvailable);
      if (w.reclaimPerSecond !== undefined) this.m.reclaim.set(w.reclaimPerSecond);
    }
    const prev = this.state;
    this.state = evaluate(prev, cfg, now, w, (from) => sampler.rates(from).reclaimPerSecond);
    this.m.pressureSeconds.set(
      this.state.aboveSince !== undefined && this.state.phase !== "cooldown" ? (now - this.state.aboveSince) / 1000 : 0,
    );
    this.m.cooldown.set(this.state.phase === "cooldown" ? 1 : 0);
    if (prev.phase !== this.state.phase) {
      if (this.state.phase === "building")
        this.log.info({ trigger: this.state.reason }, "memory stall above threshold");
      else if (this.state.phase === "calm" && prev.phase === "building")
        this.log.info({ trigger: this.state.reason }, "memory stall back below threshold");
    }
    if (this.state.phase === "met" && w) return this.act(cfg, w, this.state).then(() => this.repace(cfg, w));
    this.repace(cfg, w);
    return undefined;
  }

  private repace(cfg: EarlyOomConfig, w: WindowFigures | undefined): void {
    this.pace = pace(cfg, this.state, w);
    this.m.sampleInterval.set(this.pace.ms / 1000);
  }

  private figures(w: WindowFigures, trigger: TriggerState): Record<string, number | undefined> {
    return {
      fullStall: w.full,
      someStall: w.some,
      fullAvg10: w.fullAvg10,
      windowSeconds: w.spanMs / 1000,
      heldSeconds: trigger.aboveSince === undefined ? undefined : (this.clock.now() - trigger.aboveSince) / 1000,
      memAvailableBytes: w.memAvailable,
      memTotalBytes: w.memTotal,
      reclaimPagesPerSecond: this.sampler?.rates((trigger.aboveSince ?? 0) - (this.cfg?.windowMs ?? 0))
        .reclaimPerSecond,
    };
  }

  private async act(cfg: EarlyOomConfig, w: WindowFigures, trigger: TriggerState): Promise<void> {
    const figures = this.figures(w, trigger);
    const base = { at: new Date().toISOString(), trigger: trigger.reason, figures };
    let ranked: RankedCandidate[] = [];
    try {
      ranked = this.rank().ranked;
    } catch (err) {
      this.log.error(
        `early OOM could not read the pods' cgroups under ${this.o.cgroupRoot}: ${(err as Error).message}`,
      );
    }
    let action: EarlyOomAction;
    if (cfg.dryRun && ranked[0]) {
      const v = ranked[0];
      action = { ...base, action: "dry-run", pod: podLabel(v), uid: v.cgroup.uid, victim: v.reason };
      this.log.warn(
        { pod: podLabel(v), rank: v.reason, trigger: trigger.reason, candidates: ranked.length },
        "dry run: early OOM would kill this pod",
      );
    } else if (ranked.length) {
      action = await this.killFirst(ranked, base, cfg);
    } else {
      action = this.fallback(cfg, base);
    }
    this.lastAction = action;
    this.counts[action.action]++;
    this.m.decisions.inc({ action: action.action });
    if (action.action !== "none") this.m.lastAction.set(Date.now() / 1000);
    this.state = cooldown(this.clock.now(), cfg.cooldownMs, `${action.action} at ${action.at}`);
    this.m.cooldown.set(1);
    this.m.pressureSeconds.set(0);
    this.sampler?.reset();
  }

  private async killFirst(
    ranked: RankedCandidate[],
    base: Omit<EarlyOomAction, "action">,
    cfg: EarlyOomConfig,
  ): Promise<EarlyOomAction> {
    const t0 = this.clock.now();
    let last: EarlyOomAction = { ...base, action: "none", result: "no candidate had tasks left" };
    // A pod whose tasks are all gone already (it just ended) frees nothing; take the next one.
    for (const v of ranked.slice(0, 3)) {
      let r: KillResult;
      try {
        r = await killPod(v.cgroup, cfg.killTimeoutMs);
      } catch (err) {
        this.m.killFailures.inc();
        this.log.error({ pod: podLabel(v) }, `early OOM could not kill ${podLabel(v)}: ${(err as Error).message}`);
        last = { ...base, action: "none", pod: podLabel(v), result: `kill failed: ${(err as Error).message}` };
        continue;
      }
      if (!r.pids.length) continue;
      const seconds = (this.clock.now() - t0) / 1000;
      const result = `${r.pids.length} process(es) killed (${r.method}) in ${Math.round(r.durationMs)} ms${r.remaining ? `; ${r.remaining} still listed after ${cfg.killTimeoutMs} ms` : ""}`;
      if (r.remaining) this.m.killFailures.inc();
      this.m.kills.inc({ namespace: v.pod?.namespace ?? "", qos: v.qos });
      this.m.killDuration.observe(r.durationMs / 1000);
      const action: EarlyOomAction = {
        ...base,
        action: "kill",
        pod: podLabel(v),
        uid: v.cgroup.uid,
        victim: `ranked 1 of ${ranked.length}: ${v.reason}`,
        result,
      };
      this.log.warn(
        {
          pod: podLabel(v),
          uid: v.cgroup.uid,
          trigger: base.trigger,
          rank: v.reason,
          method: r.method,
          processes: r.pids.length,
          remaining: r.remaining,
          killMs: Math.round(r.durationMs),
          decisionSeconds: seconds,
        },
        "early OOM killed a pod",
      );
      if (v.pod) this.event(v, action);
      return action;
    }
    return last;
  }

  private fallback(cfg: EarlyOomConfig, base: Omit<EarlyOomAction, "action">): EarlyOomAction {
    if (cfg.fallback !== "sysrq") {
      this.log.warn({ trigger: base.trigger }, "early OOM: no pod to kill and the sysrq fallback is off; nothing done");
      return { ...base, action: "none", result: "no candidate; fallback off" };
    }
    if (cfg.dryRun) {
      this.log.warn({ trigger: base.trigger }, "dry run: no pod to kill; early OOM would ask the kernel's OOM killer");
      return { ...base, action: "dry-run", result: "no candidate; would write f to sysrq-trigger" };
    }
    try {
      writeFileSync(this.o.sysrqPath, "f");
      this.log.warn(
        { trigger: base.trigger, file: this.o.sysrqPath },
        "early OOM: no pod to kill; asked the kernel's OOM killer (sysrq f)",
      );
      return { ...base, action: "sysrq", result: `wrote f to ${this.o.sysrqPath}` };
    } catch (err) {
      this.log.error(`early OOM: no pod to kill and ${this.o.sysrqPath} failed: ${(err as Error).message}`);
      return { ...base, action: "none", result: `sysrq failed: ${(err as Error).message}` };
    }
  }

  private event(v: RankedCandidate, a: EarlyOomAction): void {
    const client = this.o.kube();
    if (!client || !v.pod) return;
    const f = a.figures;
    const figures = [
      `memory full stall ${pct(f.fullStall ?? 0)} (some ${pct(f.someStall ?? 0)}) over the last ${f.windowSeconds?.toFixed(1)} s, held ${f.heldSeconds?.toFixed(1)} s`,
      f.memAvailableBytes !== undefined && f.memTotalBytes
        ? `MemAvailable ${bytes(f.memAvailableBytes)} of ${bytes(f.memTotalBytes)}`
        : undefined,
      f.reclaimPagesPerSecond !== undefined ? `reclaim ${Math.round(f.reclaimPagesPerSecond)} pages/s` : undefined,
    ]
      .filter(Boolean)
      .join("; ");
    const message = `Early OOM killed the pod's processes: ${figures}. Trigger: ${a.trigger}. Victim ${a.victim}. ${a.result}.`;
    const p = createEvent(client, {
      namespace: v.pod.namespace,
      involved: { kind: "Pod", apiVersion: "v1", name: v.pod.name, namespace: v.pod.namespace, uid: v.pod.uid },
      reason: EVENTS.earlyOomKilled,
      message: message.slice(0, 1024),
      type: "Warning",
      component: "bashible-early-oom",
      host: this.o.nodeName,
    })
      .then(() => undefined)
      .catch((err: Error) =>
        this.log.warn({ pod: podLabel(v) }, `could not record the EarlyOOMKilled Event: ${err.message}`),
      )
      .finally(() => this.pending.delete(p));
    this.pending.add(p);
  }
}
