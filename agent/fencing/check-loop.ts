// The check loop: every check interval one round. Ask the API for this node's kubelet Lease
// (health.ts); when it does not answer, ask the peers (peer-asker.ts); feed the round to the
// decision (decision.ts next()) and say what changed; then what the mode asks for given the
// last Node seen: maintenance stands down, Watchdog mode arms, a ready node carries the label.
// The interval is measured from a round's start, so a slow round is not followed by a full
// wait. Unexpected failures are counted: `badRounds` of them in a row disarm cleanly and take
// the label away, so the controller does not count on a node that no longer watches itself.
import type { KubeClient } from "../../lib/kube/client.ts";
import type { Logger } from "../../lib/log/log.ts";
import { sleep } from "../../lib/sleep.ts";
import { type AgentTimings, maintenanceOf } from "../../bundles/fencing.ts";
import type { Clock } from "./clock.ts";
import type { Verdict } from "./decide.ts";
import { checked, type FencingState, next } from "./decision.ts";
import type { FencingDevice } from "./device.ts";
import type { FencingConfig } from "./fencing.ts";
import { type ApiCheck, checkApi, leasePath } from "./health.ts";
import { LeaseProbe } from "./lease-probe.ts";
import type { FencingMetrics } from "./metrics.ts";
import type { NodeFollower } from "./node-follower.ts";
import type { NodeLabels } from "./node-labels.ts";
import type { PeerAsker } from "./peer-asker.ts";
import type { PeerEndpoint } from "./peer-endpoint.ts";
import type { PeerAnswer } from "./peers.ts";

/** Deadline of a label removal when standing down: the magic close must not wait for an API that is down. */
export const UNLABEL_DEADLINE_MS = 2_000;

/**
 * How much earlier than due a round may start to share a pet tick's wakeup: 1 % of the check
 * interval, at most 50 ms. Earlier, never later, so every window stays what the timings say.
 */
export const alignSlackMs = (t: AgentTimings) => Math.min(50, t.checkIntervalMs / 100);

export interface CheckLoopOptions {
  nodeName: string;
  kube: () => KubeClient | undefined;
  timings: AgentTimings;
  now: Clock;
  log: Logger;
  metrics: FencingMetrics;
  device: FencingDevice;
  nodes: NodeFollower;
  labels: NodeLabels;
  endpoint: PeerEndpoint;
  asker: PeerAsker;
  /** The decision state, shared with the pet timer (which only reads it). */
  state: { get(): FencingState; set(s: FencingState): void };
  /** The pet timer, whose ticks a round may start right after (PetTimer.tickBefore). */
  ticks?: { tickBefore(due: number, slackMs: number): Promise<void> | undefined };
  /** Writes the status when it changed or is due; `force`: now. */
  writeStatus: (o?: { force?: boolean }) => Promise<void>;
}

export class CheckLoop {
  private readonly o: CheckLoopOptions;
  /** The peers' answers in the last round (none when the API answered). */
  lastPeers: PeerAnswer[] | undefined;
  /** The maintenance annotation holding fencing down, as last seen. */
  maintenance: string | undefined;
  /** When the API check in flight started, if one is (the peer endpoint reports a hang). */
  inFlightSince: number | undefined;
  private lastVerdictKind: string | undefined;
  /** The API check's own connection, for the current client's credentials. */
  private probe: { client: KubeClient; probe: LeaseProbe } | undefined;

  constructor(o: CheckLoopOptions) {
    this.o = o;
  }

  /** Closes the API check's connection. */
  close(): void {
    this.probe?.probe.close();
    this.probe = undefined;
  }

  private probeFor(client: KubeClient | undefined): LeaseProbe | undefined {
    if (!client) return undefined;
    if (this.probe?.client !== client) {
      this.close();
      this.probe = { client, probe: new LeaseProbe(client.connection, leasePath(this.o.nodeName)) };
    }
    return this.probe.probe;
  }

  /** Runs rounds for `cfg` until `signal` aborts; never rejects. */
  async run(cfg: FencingConfig, signal: AbortSignal): Promise<void> {
    const { log, now } = this.o;
    let failures = 0;
    let statusFailing = false;
    while (!signal.aborted) {
      const started = now();
      try {
        await this.round(cfg, signal);
        failures = 0;
      } catch (err) {
        failures++;
        log.error({ err: (err as Error).message, internalErrors: failures }, "fencing check failed unexpectedly");
        await this.failing(err as Error, failures, signal);
      }
      try {
        await this.o.writeStatus();
        statusFailing = false;
      } catch (err) {
        // Once per stretch: the status is for a person; the loop goes on without it.
        if (!statusFailing)
          log.warn(
            { err: (err as Error).message },
            "cannot write the fencing status; `bashible fencing status` is stale",
          );
        statusFailing = true;
      }
      const due = started + this.o.timings.checkIntervalMs;
      // Right after a pet tick due just before, if there is one (one wakeup for both).
      const aligned = this.o.ticks?.tickBefore(due, alignSlackMs(this.o.timings));
      if (aligned) await aligned;
      else await sleep(Math.max(0, due - now()), signal);
    }
  }

  /** A broken loop must not leave the device armed and unpetted by accident. */
  private async failing(err: Error, inARow: number, signal: AbortSignal): Promise<void> {
    const { device } = this.o;
    if (signal.aborted || inARow < this.o.timings.badRounds || !device.isOpen || this.o.state.get().fencing) return;
    await this.o.labels.unlabel(this.o.kube(), UNLABEL_DEADLINE_MS);
    device.disarm("the fencing check loop keeps failing");
    device.problem = `check loop failing: ${err.message}`;
  }

  private async round(cfg: FencingConfig, signal: AbortSignal): Promise<void> {
    const { o } = this;
    const client = o.kube();
    o.nodes.follow(client, cfg.nodeGroup);
    await o.endpoint.ensure();
    this.inFlightSince = o.now();
    const api = await checkApi(this.probeFor(client), o.timings.apiTimeoutMs, o.now).finally(() => {
      this.inFlightSince = undefined;
    });
    if (signal.aborted) return;
    o.state.set(checked(o.state.get(), api));
    o.metrics.checks.inc({ result: api.result });
    // The peers matter only when the API did not answer (the common round skips the list).
    const peers = api.reached ? [] : o.nodes.peers();
    let answers: PeerAnswer[] | undefined;
    if (peers.length) {
      answers = await o.asker.ask(peers);
      for (const a of answers) o.metrics.peerAnswers.inc({ outcome: a.outcome });
    }
    if (signal.aborted) return;
    this.lastPeers = answers;
    const step = next(o.state.get(), { api, answers, knownPeers: peers.length }, o.now());
    o.state.set(step.state);
    if (step.kubeletWatched)
      o.log.info(
        { kubeletLeaseAgeSeconds: api.kubeletLeaseAgeSeconds },
        "the kubelet renews its Lease: fencing also watches it from now on",
      );
    o.metrics.verdicts.inc({ kind: step.verdict.kind });
    o.metrics.badRounds.set(step.state.badRounds);
    this.logVerdict(step.verdict, step.state.badRounds, api, answers);
    if (step.change === "recovered")
      o.log.warn({ verdict: step.verdict.kind, reason: step.verdict.reason }, "healthy again: petting resumes");
    else if (step.change === "fenced") await this.fenced(step.verdict, step.state.badRounds, api, answers);
    if (api.reached && client && !o.nodes.listing) await o.nodes.readSelf(client, o.timings.apiTimeoutMs);
    await this.applyMode(cfg, api.reached ? client : undefined, signal);
  }

  private async fenced(v: Verdict, badRounds: number, api: ApiCheck, answers: PeerAnswer[] | undefined) {
    this.o.metrics.petting.set(0);
    this.o.log.error(
      {
        verdict: v.kind,
        reason: v.reason,
        badRounds,
        api: { result: api.result, detail: api.detail },
        peers: answers,
        lastPetAt: this.o.device.lastPetAt === undefined ? undefined : new Date(this.o.device.lastPetAt).toISOString(),
      },
      v.kind === "kubelet-stale"
        ? "stopped petting: the kubelet stopped renewing its Lease and the cluster will free this node's pods; the watchdog fires unless the kubelet recovers"
        : "stopped petting: this node is not part of the cluster; the watchdog fires unless it recovers",
    );
    await this.o.writeStatus({ force: true });
  }

  /** One line when the verdict changes, and on every bad one, with its evidence. */
  private logVerdict(v: Verdict, badRounds: number, api: ApiCheck, answers: PeerAnswer[] | undefined): void {
    const changed = v.kind !== this.lastVerdictKind;
    this.lastVerdictKind = v.kind;
    if (!changed && v.healthy) return;
    const evidence = {
      verdict: v.kind,
      healthy: v.healthy,
      badRounds,
      api: { result: api.result, detail: api.detail, ms: api.durationMs },
      ...(answers ? { peers: answers } : {}),
    };
    if (v.healthy) this.o.log.info(evidence, `fencing decision: ${v.reason}`);
    else this.o.log.warn(evidence, `fencing decision: ${v.reason}`);
  }

  /** Maintenance, arming, labels: what the mode asks for, given the last Node seen. */
  private async applyMode(cfg: FencingConfig, client: KubeClient | undefined, signal: AbortSignal): Promise<void> {
    const { device, labels, log, metrics, timings } = this.o;
    const self = this.o.nodes.self();
    const maintenance = self ? maintenanceOf(self.annotations) : this.maintenance;
    if (maintenance !== this.maintenance) {
      log.info(
        { annotation: maintenance ?? this.maintenance },
        maintenance ? "maintenance: fencing stands down" : "maintenance over: fencing re-arms",
      );
      this.maintenance = maintenance;
      metrics.maintenance.set(maintenance ? 1 : 0);
    }
    if (maintenance) {
      if (labels.labelled && client) await labels.unlabel(client, timings.apiTimeoutMs);
      device.disarm(`maintenance: ${maintenance}`);
      return;
    }
    // Fencing may stop while a round is in flight: from then on it neither arms nor labels.
    const running = () => !signal.aborted;
    if (cfg.mode === "Watchdog" && !this.o.state.get().fencing && !device.isOpen) await device.arm(running);
    const ready = cfg.mode === "Notify" || device.isOpen;
    if (!ready || !self) return;
    if (labels.carries(self, cfg.mode)) labels.labelled = true;
    else if (client && running()) await labels.label(client, cfg.mode, timings.apiTimeoutMs);
  }
}
