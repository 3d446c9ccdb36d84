// Fencing inside the resident agent: the node pets its watchdog only while it can show it is
// part of the cluster. This file wires small parts together and owns their life cycle
// (configure, stop, the status); none of them decides anything on its own:
//   - decision.ts: the pure state machine (next(state, round, now), petAllowed(state, now));
//   - pet-timer.ts: every pet interval, one pet when petAllowed says so (device.ts);
//   - check-loop.ts: every check interval one round: ask the API (health.ts), when it fails
//     ask the peers (peer-asker.ts), feed the round to next(), then maintenance, arming and
//     labels (node-labels.ts);
//   - peer-endpoint.ts: answers the other agents of the group with this node's last check;
//   - node-follower.ts: the group's Nodes (peers, this node's annotations);
//   - status-file.ts: /run/bashible/fencing.json, and what a restarted agent continues from.
// The parts run independently, so one failing never stops another: the pet timer trusts only a
// fresh verdict, so if the check loop hangs the pets stop and the device fires; an unexpected
// error in the check loop `badRounds` times in a row disarms cleanly (magic close) and takes the
// label away, so the controller does not count on a node that no longer watches itself.
// One clock (FencingOptions.clock) for every part.
import { uptime } from "node:os";
import type { KubeClient } from "../../lib/kube/client.ts";
import type { Logger } from "../../lib/log/log.ts";
import type { Registry } from "../../lib/prometheus.ts";
import { sleep } from "../../lib/sleep.ts";
import {
  type AgentTimings,
  DEFAULT_AGENT_TIMINGS,
  DEFAULT_WATCHDOG_TIMEOUT_SECONDS,
  detectionWindowMs,
  formatAgentTimingsAnnotation,
  kubeletWindowMs,
  roundMs,
} from "../../bundles/fencing.ts";
import { readBootId } from "../facts.ts";
import { CheckLoop, UNLABEL_DEADLINE_MS } from "./check-loop.ts";
import { type Clock, systemClock } from "./clock.ts";
import { type FencingState, initialState, petAllowed, resumed, rulesOf, starting, stopped } from "./decision.ts";
import { FencingDevice } from "./device.ts";
import { type FencingMetrics, fencingMetrics, fencingMetricsText } from "./metrics.ts";
import { NodeFollower } from "./node-follower.ts";
import { NodeLabels } from "./node-labels.ts";
import { PeerAsker } from "./peer-asker.ts";
import { PeerEndpoint } from "./peer-endpoint.ts";
import { peerLimits } from "./peer-limits.ts";
import type { PeerTls } from "./peers.ts";
import { ServingCertificate } from "./serving-cert.ts";
import { PetTimer } from "./pet-timer.ts";
import { continuationOf, type FencingStatus, iso, readSavedStatus, writeStatusFiles } from "./status-file.ts";

/** What the bundle says (context.nodeGroup.fencing) plus the group it is for. */
export interface FencingConfig {
  mode: "Watchdog" | "Notify";
  nodeGroup: string;
}

export interface FencingOptions {
  /** Root of the node's filesystem ("/" on a node); the device, sysfs and state live under it. */
  root: string;
  /** Watchdog device path under root (default /dev/watchdog). */
  device?: string;
  nodeName: string;
  log: Logger;
  /** The current API client (it changes when credentials are reloaded). */
  kube: () => KubeClient | undefined;
  metrics: Registry;
  /** TLS material for the peer endpoint (the kubelet client certificate and the cluster CA). */
  peerTls: () => PeerTls | undefined;
  /** Port the agents of the group answer on (default 4227). */
  peerPort?: number;
  /** This node's address for the peer endpoint: listen on it, and ask peers from it (default: listen on all). */
  peerAddress?: string;
  /** Port to listen on when it differs from peerPort (a proxy in front, in tests). */
  listenPort?: number;
  timings?: Partial<AgentTimings>;
  /** The longest watchdog timeout the cluster side is set up for; a longer device is not armed. */
  watchdogTimeoutSeconds?: number;
  /** With no peer in the group, stop petting when the API is lost (default false: keep the node). */
  fenceWithoutPeers?: boolean;
  /** Most peers asked in one round. */
  maxPeers?: number;
  /** A Node of the group younger than this is not asked yet (default 600 s; peer-admission.ts). */
  peerMinAgeMs?: number;
  /** Wall clock for decisions, certificates and status (tests); timers stay real. */
  clock?: Clock;
}

/**
 * A Node must have been in the group this long before it is asked: long enough that fake
 * members sit in the cluster, visible, before they count; a real node is asked from then on.
 */
export const DEFAULT_PEER_MIN_AGE_MS = 600_000;

/** The status file's heartbeat when nothing in it changed. */
const STATUS_HEARTBEAT_MS = 30_000;

export class Fencing {
  private readonly o: FencingOptions;
  private readonly log: Logger;
  private readonly t: AgentTimings;
  private readonly now: Clock;
  private readonly metrics: FencingMetrics;
  private readonly device: FencingDevice;
  private readonly nodes: NodeFollower;
  private readonly labels: NodeLabels;
  private readonly endpoint: PeerEndpoint;
  private readonly asker: PeerAsker;
  private readonly pets: PetTimer;
  private readonly checks: CheckLoop;
  private state: FencingState;
  private cfg: FencingConfig | undefined;
  /** Serialises configure/stop: each change waits for the previous one. */
  private chain: Promise<void> = Promise.resolve();
  private running: { abort: AbortController; loop: Promise<void> } | undefined;
  private bootId = "";
  /** The status last written: what it said (statusKey) and when. */
  private written = { key: "", at: Number.NEGATIVE_INFINITY };
  /** The status is rewritten at least this often (writeStatus). */
  private readonly statusEveryMs: number;

  constructor(o: FencingOptions) {
    this.o = o;
    this.log = o.log.child({ component: "fencing" });
    const t = { ...DEFAULT_AGENT_TIMINGS, ...o.timings };
    this.t = t;
    this.now = o.clock ?? systemClock;
    // Well inside the watchdog timeout (a restarted agent takes the kubelet facts over while the
    // file is younger than that), and within a detection window for compressed timings.
    this.statusEveryMs = Math.min(STATUS_HEARTBEAT_MS, detectionWindowMs(t));
    const metrics = fencingMetrics(o.metrics);
    this.metrics = metrics;
    const base = { now: this.now, log: this.log, metrics };
    this.state = initialState(
      // A kubelet Lease renewed before this boot started is the previous boot's.
      rulesOf(t, { fenceWithoutPeers: o.fenceWithoutPeers ?? false, bootedAt: this.now() - uptime() * 1000 }),
    );
    this.device = new FencingDevice({
      ...base,
      root: o.root,
      device: o.device ?? "/dev/watchdog",
      timeoutLimitSeconds: o.watchdogTimeoutSeconds,
    });
    this.pets = new PetTimer({ ...base, device: this.device, state: () => this.state, intervalMs: t.petIntervalMs });
    this.nodes = new NodeFollower({
      nodeName: o.nodeName,
      log: this.log,
      now: this.now,
      minAgeMs: o.peerMinAgeMs ?? DEFAULT_PEER_MIN_AGE_MS,
    });
    const serving = new ServingCertificate({ root: o.root, nodeName: o.nodeName, log: this.log, now: this.now });
    this.labels = new NodeLabels({
      nodeName: o.nodeName,
      follower: this.nodes,
      log: this.log,
      annotation: () => {
        const kubelet = kubeletWindowMs(t);
        return formatAgentTimingsAnnotation(
          this.device.timeoutSeconds,
          Math.ceil(detectionWindowMs(t) / 1000),
          kubelet === undefined ? undefined : Math.ceil(kubelet / 1000),
        );
      },
    });
    const peerPort = o.peerPort ?? 4227;
    this.endpoint = new PeerEndpoint({
      ...base,
      nodeName: o.nodeName,
      tls: o.peerTls,
      serving: () => serving.current(),
      limits: peerLimits({ peerTimeoutMs: t.peerTimeoutMs, roundMs: roundMs(t) }),
      isNodeAddress: (ip) => this.nodes.isNodeAddress(ip),
      host: o.peerAddress,
      port: o.listenPort ?? peerPort,
      allowed: (node) => this.nodes.allows(node),
      lastCheck: () => this.state.lastCheck,
      inFlightSince: () => this.checks.inFlightSince,
      apiTimeoutMs: t.apiTimeoutMs,
    });
    this.asker = new PeerAsker({
      now: this.now,
      tls: o.peerTls,
      port: peerPort,
      localAddress: o.peerAddress,
      maxPeers: o.maxPeers ?? 10,
      timeoutMs: t.peerTimeoutMs,
      maxReportAgeMs: 2 * t.checkIntervalMs + t.apiTimeoutMs,
    });
    this.checks = new CheckLoop({
      ...base,
      nodeName: o.nodeName,
      kube: o.kube,
      timings: t,
      device: this.device,
      nodes: this.nodes,
      labels: this.labels,
      endpoint: this.endpoint,
      asker: this.asker,
      state: { get: () => this.state, set: (s) => (this.state = s) },
      ticks: this.pets,
      writeStatus: (w) => this.writeStatus(w),
    });
  }

  /** Applies the node group's fencing setting; undefined turns fencing off (disarm, unlabel). */
  configure(cfg: FencingConfig | undefined): Promise<void> {
    return this.serialised(async () => {
      if (cfg?.mode === this.cfg?.mode && cfg?.nodeGroup === this.cfg?.nodeGroup) return;
      if (this.running) await this.shutdown("configuration changed");
      if (cfg?.nodeGroup !== this.cfg?.nodeGroup) this.nodes.reset();
      this.cfg = cfg;
      if (cfg) await this.startup(cfg);
      else await this.writeStatus({ force: true });
    });
  }

  /** Stops: removes the label when the API answers, and disarms in every case but a fence in progress. */
  stop(): Promise<void> {
    return this.serialised(() => this.shutdown("agent stopping"));
  }

  status(): FencingStatus {
    const s = this.state;
    const peers = this.nodes.peers();
    return {
      pid: process.pid,
      node: this.o.nodeName,
      mode: this.cfg?.mode,
      nodeGroup: this.cfg?.nodeGroup,
      device: this.device.path,
      armed: this.device.isOpen,
      petting: this.device.isOpen && petAllowed(s, this.now()).ok,
      fencing: s.fencing,
      lastPetAt: iso(this.device.lastPetAt),
      pets: this.device.petCount,
      timings: this.t,
      detectionWindowMs: detectionWindowMs(this.t),
      watchdog: this.device.info,
      maintenance: this.checks.maintenance,
      labelled: this.labels.labelled,
      lastCheck: s.lastCheck,
      peersKnown: peers.length,
      peers,
      peersWaiting: this.nodes.waiting(),
      lastPeers: this.checks.lastPeers,
      verdict: s.verdict ? { ...s.verdict, at: iso(s.verdict.at) ?? "" } : undefined,
      badRounds: s.badRounds,
      kubeletSeenAlive: s.kubelet.seenAlive,
      apiReachableSince: iso(s.kubelet.apiReachableSince),
      kubeletRenewSeenAt: iso(s.kubelet.renewSeenAt),
      bootId: this.bootId,
      problem: this.device.problem,
      updatedAt: new Date(this.now()).toISOString(),
    };
  }

  private serialised(step: () => Promise<void>): Promise<void> {
    const run = this.chain.then(step);
    // The caller logs a failure (startFencing); the chain only must not stay rejected.
    this.chain = run.catch(() => undefined);
    return run;
  }

  private async startup(cfg: FencingConfig): Promise<void> {
    this.bootId ||= await readBootId();
    const saved = await readSavedStatus(this.o.root);
    if (saved.problem) this.log.warn(`${saved.problem}; starting without the previous agent's state`);
    const c = continuationOf(saved.status, {
      node: this.o.nodeName,
      group: cfg.nodeGroup,
      bootId: this.bootId,
      now: this.now(),
      watchdogMs: (this.o.watchdogTimeoutSeconds ?? DEFAULT_WATCHDOG_TIMEOUT_SECONDS) * 1000,
      recentMs: detectionWindowMs(this.t) + this.t.checkIntervalMs,
    });
    this.nodes.seed(c.peers, cfg.nodeGroup);
    this.state = resumed(this.state, c.previous, c.kubelet);
    if (c.previous?.fencing)
      this.log.warn(
        { badRounds: c.previous.badRounds },
        "the previous agent was fencing this node: the device stays closed until the node is healthy again",
      );
    const abort = new AbortController();
    this.running = { abort, loop: Promise.resolve() };
    const { device } = this;
    this.log.info(
      {
        mode: cfg.mode,
        group: cfg.nodeGroup,
        device: device.path,
        detectionWindowMs: detectionWindowMs(this.t),
        ...this.t,
      },
      "fencing on",
    );
    if (cfg.mode === "Watchdog" && !this.state.fencing) {
      // Arm at once, before any API answer: after a crash, systemd restarts the agent within
      // seconds and the pets must resume well inside the watchdog timeout. The first check
      // follows immediately; the start-up verdict counts as healthy only until then.
      this.state = starting(this.state, this.now());
      await device.arm(() => !abort.signal.aborted);
      this.pets.tick();
    }
    this.pets.start();
    this.running.loop = this.checks.run(cfg, abort.signal);
  }

  private async shutdown(why: string): Promise<void> {
    const r = this.running;
    if (!r) return;
    this.running = undefined;
    r.abort.abort();
    this.pets.stop();
    // A round in flight may wait for its API and peer deadlines; it cannot arm or label any
    // more (both check the aborted signal), so waiting for it is bounded and short: at most a
    // second, and the timer goes with it so it does not hold exit.
    const loopDone = new AbortController();
    await Promise.race([r.loop.catch(() => undefined).finally(() => loopDone.abort()), sleep(1000, loopDone.signal)]);
    const fenceInProgress = this.state.fencing && this.device.isOpen;
    try {
      if (this.labels.labelled) await this.labels.unlabel(this.o.kube(), UNLABEL_DEADLINE_MS);
    } finally {
      this.device.close(why, fenceInProgress);
    }
    this.nodes.stop();
    this.checks.close();
    await this.endpoint.stop();
    this.asker.close();
    this.state = stopped(this.state, fenceInProgress);
    await this.writeStatus({ force: true });
  }

  /**
   * The status and metrics files, rewritten when something a person or a restarted agent reads
   * in them changed (the verdict, the count of bad rounds, arming, the label, what the kubelet
   * rule learnt, the peers), and otherwise every `statusEveryMs`, not on every check: writing
   * two files each round was a third of fencing's idle CPU. A fence in progress and the count
   * of bad rounds change every bad round, so what a restart takes over is always current; the
   * kubelet facts are taken over while younger than the watchdog timeout, which the heartbeat
   * is well inside.
   */
  private writeStatus(o: { force?: boolean } = {}): Promise<void> {
    const now = this.now();
    const key = this.statusKey(now);
    if (!o.force && key === this.written.key && now - this.written.at < this.statusEveryMs) return Promise.resolve();
    this.written = { key, at: now };
    return writeStatusFiles(this.o.root, this.status(), fencingMetricsText(this.metrics)).catch((err) => {
      this.written = { key: "", at: Number.NEGATIVE_INFINITY }; // try again next round
      throw err;
    });
  }

  /** What, changed, makes the status worth writing before the heartbeat. */
  private statusKey(now: number): string {
    const s = this.state;
    const d = this.device;
    return [
      this.cfg?.mode,
      this.cfg?.nodeGroup,
      d.isOpen,
      d.isOpen && petAllowed(s, now).ok,
      d.problem,
      s.fencing,
      s.badRounds,
      s.verdict?.kind,
      s.verdict?.healthy,
      s.lastCheck?.result,
      s.kubelet.seenAlive,
      s.kubelet.apiReachableSince,
      this.checks.maintenance,
      this.labels.labelled,
      this.nodes.version,
    ].join("|");
  }
}
