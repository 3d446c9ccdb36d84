// Fencing inside the resident agent: the node pets its watchdog only while it can show it is
// part of the cluster. Three independent parts, so one failing never stops another:
//   - the pet timer: every petInterval, pet when armed, healthy and the verdict is fresh;
//   - the check loop: every checkInterval, ask the API, and when it fails ask the peers; decide
//     (decide.ts); `badRounds` bad verdicts in a row stop the pets; maintenance and labels;
//   - the peer endpoint: answers the other agents of the group with this node's last check.
// The pet timer trusts only a fresh verdict: if the check loop hangs, the pets stop and the
// device fires. An unexpected error in the check loop disarms cleanly (magic close) and takes
// the label away, so the controller does not count on a node that no longer watches itself.
import { mkdir, readFile, rename, writeFile } from "node:fs/promises";
import https from "node:https";
import path from "node:path";
import type { KubeClient } from "../../lib/kube/client.ts";
import { getNode, patchNode, type KubeObject } from "../../lib/kube/api.ts";
import { uptime } from "node:os";
import { Informer } from "../../lib/informer.ts";
import { sleep } from "../../lib/sleep.ts";
import { readBootId } from "../facts.ts";
import type { Logger } from "../../lib/log/log.ts";
import type { Counter, Gauge, Histogram, Registry } from "../../lib/prometheus.ts";
import { NODE_KEYS } from "../../bundles/names.ts";
import { PATHS } from "../../bundles/paths.ts";
import {
  type AgentTimings,
  DEFAULT_AGENT_TIMINGS,
  DEFAULT_WATCHDOG_TIMEOUT_SECONDS,
  detectionWindowMs,
  formatAgentTimingsAnnotation,
  kubeletWindowMs,
  maintenanceOf,
  verdictMaxAgeMs,
} from "../../bundles/fencing.ts";
import { type ApiCheck, checkApi } from "./health.ts";
import { decide, type Verdict } from "./decide.ts";
import { askPeer, type Peer, type PeerAnswer, PeerServer, type PeerTls } from "./peers.ts";
import { readWatchdogInfo, Watchdog, type WatchdogInfo } from "./watchdog.ts";
import { setupSoftdog } from "./softdog.ts";

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
  /** Wall clock for decisions and status (tests); timers stay real. */
  clock?: () => number;
}

export interface FencingStatus {
  pid: number;
  node: string;
  mode?: FencingConfig["mode"];
  nodeGroup?: string;
  device: string;
  armed: boolean;
  /** Pets go out (healthy, fresh verdict, armed). */
  petting: boolean;
  /** Pets were stopped by bad verdicts: the node is being fenced. */
  fencing: boolean;
  lastPetAt?: string;
  pets: number;
  timings: AgentTimings;
  detectionWindowMs: number;
  watchdog?: WatchdogInfo;
  maintenance?: string;
  labelled: boolean;
  lastCheck?: ApiCheck;
  peersKnown: number;
  /** The peers from the last Node list seen, kept for a restart while the API is out of reach. */
  peers: Peer[];
  lastPeers?: PeerAnswer[];
  verdict?: Verdict & { at: string };
  badRounds: number;
  /** The kubelet renewed its Lease since this boot (the kubelet rule applies from then on). */
  kubeletSeenAlive?: boolean;
  /** Since when the API has answered every check (continued across a quick restart). */
  apiReachableSince?: string;
  /** The newest kubelet Lease renewal seen. */
  kubeletRenewSeenAt?: string;
  /** The boot these kubelet facts belong to (kernel boot id). */
  bootId?: string;
  /** Why the device is not armed although the mode asks for it. */
  problem?: string;
  updatedAt: string;
}

interface Metrics {
  armed: Gauge;
  petting: Gauge;
  maintenance: Gauge;
  pets: Counter;
  petErrors: Counter;
  gap: Histogram;
  checks: Counter;
  verdicts: Counter;
  peerAnswers: Counter;
  badRounds: Gauge;
}

function metrics(r: Registry): Metrics {
  return {
    armed: r.gauge("bashible_fencing_armed", "1 while the watchdog device is open (armed)"),
    petting: r.gauge("bashible_fencing_petting", "1 while the watchdog is petted"),
    maintenance: r.gauge("bashible_fencing_maintenance", "1 while a maintenance annotation holds fencing down"),
    pets: r.counter("bashible_fencing_pets_total", "Pets written to the watchdog device"),
    petErrors: r.counter("bashible_fencing_pet_errors_total", "Pets that could not be written"),
    gap: r.histogram(
      "bashible_fencing_pet_gap_seconds",
      "Time between consecutive pets",
      [0.5, 1, 2, 3, 5, 6, 7.5, 10, 15, 30, 60],
    ),
    checks: r.counter("bashible_fencing_api_checks_total", "API reachability checks by result"),
    verdicts: r.counter("bashible_fencing_verdicts_total", "Health verdicts by kind"),
    peerAnswers: r.counter("bashible_fencing_peer_answers_total", "Peer answers by outcome"),
    badRounds: r.gauge(
      "bashible_fencing_bad_rounds",
      "Consecutive bad verdicts (petting stops at the configured count)",
    ),
  };
}

type NodeView = { name: string; labels: Record<string, string>; annotations: Record<string, string>; address?: string };

function nodeView(o: KubeObject): NodeView {
  const addresses = ((o.status as { addresses?: { type: string; address: string }[] } | undefined)?.addresses ??
    []) as { type: string; address: string }[];
  return {
    name: o.metadata.name,
    labels: o.metadata.labels ?? {},
    annotations: o.metadata.annotations ?? {},
    address: addresses.find((a) => a.type === "InternalIP")?.address ?? addresses[0]?.address,
  };
}

export class Fencing {
  private readonly o: FencingOptions;
  private readonly log: Logger;
  private readonly t: AgentTimings;
  /** Derived from the timings once: the pet timer reads them every pet. */
  private readonly verdictMaxAgeMs: number;
  private readonly kubeletWindowMs: number | undefined;
  /** When this boot started (epoch ms): a kubelet Lease renewed before it is the previous boot's. */
  private readonly bootedAt = Date.now() - uptime() * 1000;
  private readonly m: Metrics;
  private readonly now: () => number;
  private readonly watchdog: Watchdog;
  private cfg: FencingConfig | undefined;
  /** Serialises configure/stop: each change waits for the previous one. */
  private chain: Promise<void> = Promise.resolve();
  private running: { abort: AbortController; loop: Promise<void> } | undefined;
  private petTimer: NodeJS.Timeout | undefined;
  private informer: Informer | undefined;
  private informerClient: KubeClient | undefined;
  /** The last Node list seen (kept while the informer re-lists or the API is down). */
  private nodes = new Map<string, NodeView>();
  private peerServer: PeerServer | undefined;
  private peerTlsUsed: PeerTls | undefined;
  private lastCheck: ApiCheck | undefined;
  private lastPeers: PeerAnswer[] | undefined;
  private verdict: (Verdict & { at: number }) | undefined;
  private badRounds = 0;
  private kubeletSeenAlive = false;
  /**
   * Since when the API has answered (this.now()); undefined after a check showing the API away
   * for everyone (an outage: the kubelet could not renew either, and the cluster side restarts
   * its count). A check failing only here (cut off) does not reset it: the cluster keeps counting.
   */
  private apiReachableSince: number | undefined;
  /** The newest renewal of the kubelet's Lease seen (epoch ms, this machine's clock). */
  private kubeletRenewSeenAt: number | undefined;
  private bootId = "";
  private kubeletWindowLogged = false;
  private fencingNow = false;
  private lastPetAt: number | undefined;
  private lastPetHr: bigint | undefined;
  private maintenance: string | undefined;
  private labelled = false;
  private problem: string | undefined;
  private info: WatchdogInfo | undefined;
  private lastVerdictKind: string | undefined;
  /** Set while an API check is in flight. */
  private checkStartedAt: number | undefined;
  /** Keeps connections to peers open between rounds: a TLS handshake per peer per round costs CPU. */
  private peerAgent: { tls: PeerTls; agent: https.Agent } | undefined;

  constructor(o: FencingOptions) {
    this.o = o;
    this.log = o.log.child({ component: "fencing" });
    this.t = { ...DEFAULT_AGENT_TIMINGS, ...o.timings };
    this.verdictMaxAgeMs = verdictMaxAgeMs(this.t);
    this.kubeletWindowMs = kubeletWindowMs(this.t);
    this.m = metrics(o.metrics);
    this.now = o.clock ?? Date.now;
    this.watchdog = new Watchdog(path.join(o.root, o.device ?? "/dev/watchdog"));
  }

  /** Applies the node group's fencing setting; undefined turns fencing off (disarm, unlabel). */
  configure(cfg: FencingConfig | undefined): Promise<void> {
    const next = this.chain.then(async () => {
      if (cfg?.mode === this.cfg?.mode && cfg?.nodeGroup === this.cfg?.nodeGroup) return;
      if (this.running) await this.shutdown("configuration changed");
      if (cfg?.nodeGroup !== this.cfg?.nodeGroup) this.nodes = new Map();
      this.cfg = cfg;
      if (cfg) await this.startup(cfg);
      else await this.writeStatus();
    });
    // The caller logs a failure (startFencing); the chain only must not stay rejected.
    this.chain = next.catch(() => undefined);
    return next;
  }

  /** Stops: removes the label when the API answers, and disarms in every case but a fence in progress. */
  stop(): Promise<void> {
    const next = this.chain.then(() => this.shutdown("agent stopping"));
    this.chain = next.catch(() => undefined);
    return next;
  }

  status(): FencingStatus {
    const iso = (ms: number | undefined) => (ms === undefined ? undefined : new Date(ms).toISOString());
    return {
      pid: process.pid,
      node: this.o.nodeName,
      mode: this.cfg?.mode,
      nodeGroup: this.cfg?.nodeGroup,
      device: this.watchdog.device,
      armed: this.watchdog.isOpen,
      petting: this.watchdog.isOpen && this.shouldPet(),
      fencing: this.fencingNow,
      lastPetAt: iso(this.lastPetAt),
      pets: this.watchdog.petCount,
      timings: this.t,
      detectionWindowMs: detectionWindowMs(this.t),
      watchdog: this.info,
      maintenance: this.maintenance,
      labelled: this.labelled,
      lastCheck: this.lastCheck,
      peersKnown: this.peers().length,
      peers: this.peers(),
      lastPeers: this.lastPeers,
      verdict: this.verdict ? { ...this.verdict, at: iso(this.verdict.at) ?? "" } : undefined,
      badRounds: this.badRounds,
      kubeletSeenAlive: this.kubeletSeenAlive,
      apiReachableSince: iso(this.apiReachableSince),
      kubeletRenewSeenAt: iso(this.kubeletRenewSeenAt),
      bootId: this.bootId,
      problem: this.problem,
      updatedAt: new Date(this.now()).toISOString(),
    };
  }

  // ---- lifecycle -------------------------------------------------------------------------

  private async startup(cfg: FencingConfig): Promise<void> {
    const [previous, peers, kubelet] = await this.readPreviousStatus(cfg);
    if (kubelet) {
      this.kubeletSeenAlive ||= kubelet.seenAlive;
      this.apiReachableSince ??= kubelet.apiReachableSince;
      this.kubeletRenewSeenAt ??= kubelet.renewSeenAt;
    }
    // The last Node list seen, until the API gives a new one: a restart while the API is out of
    // reach must still have peers to ask (with none, a node would be kept as a lone node).
    if (this.nodes.size === 0)
      for (const p of peers)
        this.nodes.set(p.name, {
          name: p.name,
          address: p.address,
          labels: { [NODE_KEYS.fencingEnabled]: "" },
          annotations: {},
        });
    // A restart in the middle of a fence must not re-open the device (an open is a pet):
    // stay down until a healthy verdict.
    if (previous?.fencing) {
      this.fencingNow = true;
      this.badRounds = previous.badRounds;
      this.log.warn(
        { badRounds: previous.badRounds },
        "the previous agent was fencing this node: the device stays closed until the node is healthy again",
      );
    } else if (previous && previous.badRounds > 0) {
      // Continue counting bad rounds across a restart, so a crash loop cannot postpone a fence.
      this.badRounds = previous.badRounds;
    }
    const abort = new AbortController();
    this.running = { abort, loop: Promise.resolve() };
    this.log.info(
      {
        mode: cfg.mode,
        group: cfg.nodeGroup,
        device: this.watchdog.device,
        detectionWindowMs: detectionWindowMs(this.t),
        ...this.t,
      },
      "fencing on",
    );
    if (cfg.mode === "Watchdog" && !this.fencingNow) {
      // Arm at once, before any API answer: after a crash, systemd restarts the agent within
      // seconds and the pets must resume well inside the watchdog timeout. The first check
      // follows immediately; a startup verdict counts as healthy only until then.
      this.verdict = { healthy: true, kind: "api", reason: "starting: first check in flight", at: this.now() };
      await this.arm();
      this.petTick();
    }
    this.petTimer = setInterval(() => this.petTick(), this.t.petIntervalMs);
    this.running.loop = this.checkLoop(abort.signal);
  }

  private async shutdown(why: string): Promise<void> {
    const r = this.running;
    if (!r) return;
    this.running = undefined;
    r.abort.abort();
    clearInterval(this.petTimer);
    this.petTimer = undefined;
    // A round in flight may wait for its API and peer deadlines; it cannot arm or label any
    // more (both check `running`), so waiting for it is bounded and short.
    // At most a second for the loop to finish; the timer goes with it so it does not hold exit.
    const loopDone = new AbortController();
    await Promise.race([r.loop.catch(() => undefined).finally(() => loopDone.abort()), sleep(1000, loopDone.signal)]);
    const fenceInProgress = this.fencingNow && this.watchdog.isOpen;
    try {
      if (this.labelled) await this.unlabel(2_000);
    } finally {
      if (fenceInProgress) {
        // Closing without 'V': the fence completes even though the agent goes away.
        this.watchdog.release();
        this.log.warn({ why }, "watchdog released without disarming: a fence is in progress");
      } else if (this.watchdog.isOpen) {
        this.watchdog.disarm();
        this.log.info({ why }, "watchdog disarmed (magic close)");
      }
      this.m.armed.set(0);
      this.m.petting.set(0);
    }
    this.informer?.stop();
    this.informer = undefined;
    this.informerClient = undefined;
    await this.peerServer?.stop();
    this.peerServer = undefined;
    this.peerAgent?.agent.destroy();
    this.peerAgent = undefined;
    this.peerTlsUsed = undefined;
    if (!fenceInProgress) {
      this.fencingNow = false;
      this.badRounds = 0;
    }
    await this.writeStatus();
  }

  // ---- the device ------------------------------------------------------------------------

  private async arm(): Promise<void> {
    if (this.watchdog.isOpen || !this.running) return;
    try {
      const limit = this.o.watchdogTimeoutSeconds ?? DEFAULT_WATCHDOG_TIMEOUT_SECONDS;
      const setup = await setupSoftdog(this.o.root, this.o.device ?? "/dev/watchdog", limit);
      if (setup.changed.length) this.log.info({ files: setup.changed, load: setup.load }, "softdog set up");
      this.info = await readWatchdogInfo(this.o.root, this.o.device ?? "/dev/watchdog");
      if (this.info.timeoutSeconds !== undefined && this.info.timeoutSeconds > limit) {
        // The controller counts on the node being dead `limit` seconds after the last pet.
        this.problem = `watchdog timeout ${this.info.timeoutSeconds} s (${this.info.source}) is longer than the ${limit} s the cluster side is set up for; not arming`;
        this.log.error(this.problem);
        return;
      }
      await this.watchdog.arm();
      if (!this.running) {
        // Stopped while the device was opening.
        this.watchdog.disarm();
        return;
      }
      this.problem = undefined;
      this.lastPetAt = this.now();
      this.lastPetHr = process.hrtime.bigint();
      this.m.armed.set(1);
      this.log.info(
        {
          device: this.watchdog.device,
          timeoutSeconds: this.info.timeoutSeconds ?? limit,
          timeoutFrom:
            this.info.timeoutSeconds === undefined ? "softdog soft_margin (not readable here)" : this.info.source,
          identity: this.info.identity,
        },
        "watchdog armed",
      );
    } catch (err) {
      this.problem = (err as Error).message;
      this.log.error({ err: this.problem }, "cannot arm the watchdog");
    }
  }

  private disarm(why: string): void {
    if (!this.watchdog.isOpen) return;
    try {
      this.watchdog.disarm();
      this.log.info({ why }, "watchdog disarmed (magic close)");
    } catch (err) {
      this.log.error({ err: (err as Error).message, why }, "magic close failed; the device is closed");
    }
    this.m.armed.set(0);
    this.m.petting.set(0);
  }

  /**
   * Pets go out until `badRounds` bad verdicts in a row (fencingNow), not after the first: one
   * failed round is a blip. They also stop when the check loop stopped deciding (stale verdict).
   */
  private shouldPet(): boolean {
    const v = this.verdict;
    return !!v && !this.fencingNow && this.now() - v.at <= this.verdictMaxAgeMs && !this.kubeletWindowPassed();
  }

  /**
   * The kubelet rule's hard bound, on the pet timer: rounds can take longer than the window
   * assumes (a slow API, a label patch), but no pet goes out once the kubelet's Lease, counted
   * as the rule counts it, is older than the kubelet window the node stated.
   */
  private kubeletWindowPassed(): boolean {
    const windowMs = this.kubeletWindowMs;
    // Only while the last check read the Lease (none: the cluster side has nothing to count
    // either), and not before this process's first check: a restarted agent's first pet must go
    // out at once.
    if (windowMs === undefined || !this.kubeletSeenAlive) return false;
    if (this.lastCheck?.result !== "ok" || this.lastCheck.kubeletLeaseRenewedAt === undefined) return false;
    if (this.kubeletRenewSeenAt === undefined || this.apiReachableSince === undefined) return false;
    const ageMs = Math.min(Date.now() - this.kubeletRenewSeenAt, this.now() - this.apiReachableSince);
    const passed = ageMs > windowMs;
    if (passed && !this.kubeletWindowLogged)
      this.log.error(
        { kubeletLeaseAgeMs: ageMs, kubeletWindowMs: windowMs },
        "stopped petting: the kubelet's Lease is older than the kubelet window; the watchdog fires unless the kubelet recovers",
      );
    this.kubeletWindowLogged = passed;
    return passed;
  }

  private petTick(): void {
    if (!this.watchdog.isOpen) return;
    if (!this.shouldPet()) {
      this.m.petting.set(0);
      return;
    }
    try {
      this.watchdog.pet();
    } catch (err) {
      this.m.petErrors.inc();
      this.log.error({ err: (err as Error).message }, "pet failed");
      return;
    }
    const hr = process.hrtime.bigint();
    if (this.lastPetHr !== undefined) this.m.gap.observe(Number(hr - this.lastPetHr) / 1e9);
    this.lastPetHr = hr;
    this.lastPetAt = this.now();
    this.m.pets.inc();
    this.m.petting.set(1);
  }

  // ---- the check loop --------------------------------------------------------------------

  private async checkLoop(signal: AbortSignal): Promise<void> {
    let internalErrors = 0;
    while (!signal.aborted) {
      const started = this.now();
      try {
        await this.round(signal);
        internalErrors = 0;
      } catch (err) {
        internalErrors++;
        this.log.error({ err: (err as Error).message, internalErrors }, "fencing check failed unexpectedly");
        if (internalErrors >= this.t.badRounds && this.watchdog.isOpen && !this.fencingNow) {
          // A broken loop must not leave the device armed and unpetted by accident.
          await this.unlabel(2_000).catch(() => undefined);
          this.disarm("the fencing check loop keeps failing");
          this.problem = `check loop failing: ${(err as Error).message}`;
        }
      }
      await this.writeStatus().catch(() => undefined);
      const wait = Math.max(0, this.t.checkIntervalMs - (this.now() - started));
      await sleep(wait, signal);
    }
  }

  private async round(signal: AbortSignal): Promise<void> {
    const cfg = this.cfg;
    if (!cfg) return;
    const client = this.o.kube();
    this.followNodes(client, cfg.nodeGroup);
    await this.ensurePeerServer();
    this.checkStartedAt = this.now();
    const api = await checkApi(client, this.o.nodeName, this.t.apiTimeoutMs, this.now).finally(() => {
      this.checkStartedAt = undefined;
    });
    if (signal.aborted) return;
    this.lastCheck = api;
    this.m.checks.inc({ result: api.result });
    const peers = this.peers();
    let answers: PeerAnswer[] | undefined;
    if (!api.reached && peers.length) {
      answers = await this.askPeers(peers);
      for (const a of answers) this.m.peerAnswers.inc({ outcome: a.outcome });
    }
    if (signal.aborted) return;
    this.lastPeers = answers;
    if (api.kubeletLeaseRenewedAt !== undefined)
      this.kubeletRenewSeenAt = Math.max(this.kubeletRenewSeenAt ?? 0, api.kubeletLeaseRenewedAt);
    const staleSeconds = this.t.kubeletStaleMs > 0 ? this.t.kubeletStaleMs / 1000 : undefined;
    const age = api.result === "ok" ? api.kubeletLeaseAgeSeconds : undefined;
    // Renewed since this boot (a fast reboot leaves a Lease young enough to pass for alive).
    const sinceBoot = (api.kubeletLeaseRenewedAt ?? 0) > this.bootedAt;
    if (staleSeconds !== undefined && age !== undefined && age <= staleSeconds && sinceBoot && !this.kubeletSeenAlive) {
      this.kubeletSeenAlive = true;
      this.log.info(
        { kubeletLeaseAgeSeconds: age },
        "the kubelet renews its Lease: fencing also watches it from now on",
      );
    }
    if (api.reached) this.apiReachableSince ??= api.at;
    const v = decide(api, answers, peers.length, {
      apiReachableForSeconds: api.reached ? (this.now() - (this.apiReachableSince ?? this.now())) / 1000 : 0,
      fenceWithoutPeers: this.o.fenceWithoutPeers ?? false,
      kubeletStaleSeconds: staleSeconds,
      kubeletSeenAlive: this.kubeletSeenAlive,
    });
    this.verdict = { ...v, at: this.now() };
    // Away for everyone (or no one to tell): the kubelets could not renew either.
    if (v.kind === "outage" || v.kind === "no-peers" || v.kind === "inconclusive") this.apiReachableSince = undefined;
    this.m.verdicts.inc({ kind: v.kind });
    this.badRounds = v.neutral ? this.badRounds : v.healthy ? 0 : this.badRounds + 1;
    this.m.badRounds.set(this.badRounds);
    this.logVerdict(v, api, answers);
    if (v.healthy && this.fencingNow) {
      this.fencingNow = false;
      this.log.warn({ verdict: v.kind, reason: v.reason }, "healthy again: petting resumes");
    } else if (!v.healthy && !this.fencingNow && this.badRounds >= this.t.badRounds) {
      this.fencingNow = true;
      this.m.petting.set(0);
      this.log.error(
        {
          verdict: v.kind,
          reason: v.reason,
          badRounds: this.badRounds,
          api: { result: api.result, detail: api.detail },
          peers: answers,
          lastPetAt: this.lastPetAt ? new Date(this.lastPetAt).toISOString() : undefined,
        },
        v.kind === "kubelet-stale"
          ? "stopped petting: the kubelet stopped renewing its Lease and the cluster will free this node's pods; the watchdog fires unless the kubelet recovers"
          : "stopped petting: this node is not part of the cluster; the watchdog fires unless it recovers",
      );
      await this.writeStatus();
    }
    const listed = this.informer?.synced && !this.informer.error;
    if (api.reached && client && !listed) await this.readSelf(client);
    await this.applyMode(cfg, api.reached ? client : undefined);
  }

  /**
   * Without the group's Node list (nodes may not list Nodes unless RBAC grants it, see
   * cluster/deploy/fencing-rbac.yaml), read this node's own object for its annotations.
   */
  private async readSelf(client: KubeClient): Promise<void> {
    try {
      this.nodes.set(
        this.o.nodeName,
        nodeView(await getNode(client, this.o.nodeName, { timeoutMs: this.t.apiTimeoutMs })),
      );
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, "cannot read this node's Node object");
    }
  }

  private logVerdict(v: Verdict, api: ApiCheck, answers: PeerAnswer[] | undefined): void {
    const changed = v.kind !== this.lastVerdictKind;
    this.lastVerdictKind = v.kind;
    if (!changed && v.healthy) return;
    const evidence = {
      verdict: v.kind,
      healthy: v.healthy,
      badRounds: this.badRounds,
      api: { result: api.result, detail: api.detail, ms: api.durationMs },
      ...(answers ? { peers: answers } : {}),
    };
    if (v.healthy) this.log.info(evidence, `fencing decision: ${v.reason}`);
    else this.log.warn(evidence, `fencing decision: ${v.reason}`);
  }

  /** Maintenance, arming, labels: what the mode asks for, given the last Node seen. */
  private async applyMode(cfg: FencingConfig, client: KubeClient | undefined): Promise<void> {
    const self = this.nodes.get(this.o.nodeName);
    const maintenance = self ? maintenanceOf(self.annotations) : this.maintenance;
    if (maintenance !== this.maintenance) {
      this.log.info(
        { annotation: maintenance ?? this.maintenance },
        maintenance ? "maintenance: fencing stands down" : "maintenance over: fencing re-arms",
      );
      this.maintenance = maintenance;
      this.m.maintenance.set(maintenance ? 1 : 0);
    }
    const wantArmed = cfg.mode === "Watchdog" && !maintenance && !this.fencingNow;
    if (maintenance) {
      if (this.labelled && client) await this.unlabel(this.t.apiTimeoutMs, client);
      this.disarm(`maintenance: ${maintenance}`);
      return;
    }
    if (wantArmed && !this.watchdog.isOpen) await this.arm();
    const ready = cfg.mode === "Notify" || this.watchdog.isOpen;
    if (ready && client && self && !this.hasLabels(self, cfg)) await this.label(client, cfg);
    else if (ready && self && this.hasLabels(self, cfg)) this.labelled = true;
  }

  private hasLabels(self: NodeView, cfg: FencingConfig): boolean {
    return (
      self.labels[NODE_KEYS.fencingEnabled] !== undefined &&
      self.labels[NODE_KEYS.fencingMode] === cfg.mode &&
      self.annotations[NODE_KEYS.fencingTimings] === this.timingsAnnotation()
    );
  }

  private timingsAnnotation(): string {
    const kubelet = this.kubeletWindowMs;
    return formatAgentTimingsAnnotation(
      this.info?.timeoutSeconds ?? this.o.watchdogTimeoutSeconds ?? DEFAULT_WATCHDOG_TIMEOUT_SECONDS,
      Math.ceil(detectionWindowMs(this.t) / 1000),
      kubelet === undefined ? undefined : Math.ceil(kubelet / 1000),
    );
  }

  private async label(client: KubeClient, cfg: FencingConfig): Promise<void> {
    if (!this.running) return;
    try {
      const node = await patchNode(
        client,
        this.o.nodeName,
        {
          metadata: {
            labels: { [NODE_KEYS.fencingEnabled]: "", [NODE_KEYS.fencingMode]: cfg.mode },
            annotations: { [NODE_KEYS.fencingTimings]: this.timingsAnnotation() },
          },
        },
        { timeoutMs: this.t.apiTimeoutMs },
      );
      this.nodes.set(this.o.nodeName, nodeView(node));
      this.labelled = true;
      this.log.info({ label: NODE_KEYS.fencingEnabled, mode: cfg.mode }, "node labelled: fencing enabled");
    } catch (err) {
      // The device stays armed: without the label the controller never frees this node's
      // workloads, which is safe; the next round tries again.
      this.log.warn({ err: (err as Error).message }, "cannot label the node; retrying next round");
    }
  }

  private async unlabel(timeoutMs: number, client = this.o.kube()): Promise<void> {
    if (!client) return;
    try {
      const node = await patchNode(
        client,
        this.o.nodeName,
        {
          metadata: {
            labels: { [NODE_KEYS.fencingEnabled]: null, [NODE_KEYS.fencingMode]: null },
            annotations: { [NODE_KEYS.fencingTimings]: null },
          },
        },
        { timeoutMs },
      );
      this.nodes.set(this.o.nodeName, nodeView(node));
      this.labelled = false;
      this.log.info({ label: NODE_KEYS.fencingEnabled }, "fencing label removed");
    } catch (err) {
      this.log.warn(
        { err: (err as Error).message },
        "cannot remove the fencing label (the device is disarmed all the same)",
      );
    }
  }

  // ---- nodes and peers -------------------------------------------------------------------

  /** Keeps a Node list of the group, re-opened when the client changes; the last list stays meanwhile. */
  private followNodes(client: KubeClient | undefined, group: string): void {
    if (!client || client === this.informerClient) return;
    this.informer?.stop();
    this.informerClient = client;
    const informer: Informer = new Informer({
      client,
      path: "/api/v1/nodes",
      labelSelector: `${NODE_KEYS.group}=${group}`,
      log: this.log,
      // Only what fencing reads: no managedFields, images or conditions in the resident process.
      trim: (o) => ({
        metadata: { name: o.metadata.name, labels: o.metadata.labels, annotations: o.metadata.annotations },
        status: { addresses: (o.status as { addresses?: unknown })?.addresses },
      }),
      onEvent: (ev) => {
        if (ev.type === "SYNC") {
          this.nodes = new Map([...informer.objects.values()].map((o) => [o.metadata.name, nodeView(o)]));
        } else if (ev.type === "DELETED") this.nodes.delete(ev.object.metadata.name);
        else this.nodes.set(ev.object.metadata.name, nodeView(ev.object));
      },
    });
    this.informer = informer;
    informer.run();
  }

  /** Agents of the group that run fencing, with an address to ask. */
  private peers(): Peer[] {
    const out: Peer[] = [];
    for (const n of this.nodes.values())
      if (n.name !== this.o.nodeName && n.address && n.labels[NODE_KEYS.fencingEnabled] !== undefined)
        out.push({ name: n.name, address: n.address });
    return out;
  }

  private async askPeers(peers: Peer[]): Promise<PeerAnswer[]> {
    const tls = this.o.peerTls();
    const max = this.o.maxPeers ?? 10;
    const chosen = peers.length > max ? [...peers].sort(() => Math.random() - 0.5).slice(0, max) : peers;
    if (!tls)
      return chosen.map((p) => ({ node: p.name, outcome: "no-answer", detail: "no client certificate to ask with" }));
    if (this.peerAgent?.tls !== tls) {
      this.peerAgent?.agent.destroy();
      this.peerAgent = {
        tls,
        agent: new https.Agent({
          keepAlive: true,
          maxSockets: 1,
          // A resumed TLS session carries no peer certificate to check: full handshakes only.
          maxCachedSessions: 0,
          cert: tls.cert,
          ca: tls.ca,
          key: tls.key,
          rejectUnauthorized: false,
        }),
      };
    }
    const agent = this.peerAgent.agent;
    return Promise.all(
      chosen.map((p) =>
        askPeer(p, {
          port: this.o.peerPort ?? 4227,
          tls,
          timeoutMs: this.t.peerTimeoutMs,
          localAddress: this.o.peerAddress,
          maxReportAgeMs: 2 * this.t.checkIntervalMs + this.t.apiTimeoutMs,
          agent,
        }),
      ),
    );
  }

  private async ensurePeerServer(): Promise<void> {
    const tls = this.o.peerTls();
    if (!tls) return;
    if (this.peerServer) {
      if (tls !== this.peerTlsUsed) {
        this.peerServer.updateTls(tls);
        this.peerTlsUsed = tls;
      }
      return;
    }
    const server = new PeerServer({
      host: this.o.peerAddress ?? "0.0.0.0",
      port: this.o.listenPort ?? this.o.peerPort ?? 4227,
      tls,
      allowed: (node) => this.nodes.size === 0 || this.nodes.has(node),
      report: () => {
        const c = this.lastCheck;
        const pending = this.checkStartedAt === undefined ? 0 : this.now() - this.checkStartedAt;
        // A check hanging for more than half its deadline says more than an older success.
        if (pending > this.t.apiTimeoutMs / 2)
          return { node: this.o.nodeName, reachedApi: false, result: "pending", ageMs: 0 };
        return {
          node: this.o.nodeName,
          reachedApi: c?.reached ?? false,
          result: c?.result ?? "no-client",
          ageMs: c ? Math.max(0, this.now() - c.at) : Number.MAX_SAFE_INTEGER,
        };
      },
      onError: (msg) => this.log.warn(msg),
    });
    try {
      await server.start();
      this.peerServer = server;
      this.peerTlsUsed = tls;
      this.log.info({ address: this.o.peerAddress ?? "0.0.0.0", port: server.port }, "peer endpoint listening");
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, "peer endpoint cannot listen; retrying next round");
    }
  }

  // ---- state on disk ---------------------------------------------------------------------

  /**
   * The previous agent's status when it is recent enough to continue from, its peer list in any
   * case, and what it knew about the kubelet when it is from this boot and younger than the
   * watchdog timeout (an agent down longer either disarmed on the way out or the node rebooted):
   * a crash must not restart the kubelet count.
   */
  private async readPreviousStatus(
    cfg: FencingConfig,
  ): Promise<
    [
      FencingStatus | undefined,
      Peer[],
      { seenAlive: boolean; apiReachableSince?: number; renewSeenAt?: number } | undefined,
    ]
  > {
    this.bootId ||= await readBootId();
    let s: FencingStatus;
    try {
      s = JSON.parse(await readFile(path.join(this.o.root, PATHS.fencingStatus), "utf8")) as FencingStatus;
    } catch {
      return [undefined, [], undefined];
    }
    if (s.node !== this.o.nodeName) return [undefined, [], undefined];
    const age = this.now() - Date.parse(s.updatedAt);
    const watchdogMs = (this.o.watchdogTimeoutSeconds ?? DEFAULT_WATCHDOG_TIMEOUT_SECONDS) * 1000;
    const ms = (iso: string | undefined) => (iso ? Date.parse(iso) : Number.NaN);
    const kubelet =
      s.bootId === this.bootId && this.bootId !== "" && age <= watchdogMs
        ? {
            seenAlive: s.kubeletSeenAlive === true,
            ...(Number.isFinite(ms(s.apiReachableSince)) ? { apiReachableSince: ms(s.apiReachableSince) } : {}),
            ...(Number.isFinite(ms(s.kubeletRenewSeenAt)) ? { renewSeenAt: ms(s.kubeletRenewSeenAt) } : {}),
          }
        : undefined;
    if (s.nodeGroup !== cfg.nodeGroup) return [undefined, [], kubelet];
    const peers = Array.isArray(s.peers) ? s.peers : [];
    // A status older than one detection window says nothing about now.
    const recent = age <= detectionWindowMs(this.t) + this.t.checkIntervalMs;
    return [recent ? s : undefined, peers, kubelet];
  }

  private async writeStatus(): Promise<void> {
    const file = path.join(this.o.root, PATHS.fencingStatus);
    await mkdir(path.dirname(file), { recursive: true });
    const tmp = `${file}.${process.pid}.tmp`;
    await writeFile(tmp, `${JSON.stringify(this.status())}\n`, { mode: 0o644 });
    await rename(tmp, file);
    const prom = path.join(this.o.root, PATHS.fencingMetrics);
    await writeFile(`${prom}.${process.pid}.tmp`, this.o.metrics.text(), { mode: 0o644 });
    await rename(`${prom}.${process.pid}.tmp`, prom);
  }
}
