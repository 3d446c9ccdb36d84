// Leader election through a coordination.k8s.io Lease, as client-go does it: the holder renews
// every `renewMs`; anyone may take the Lease once `leaseDurationSeconds` passed without a
// renewal. Every write is a compare-and-swap on resourceVersion, so two candidates never both
// win. A leader that cannot renew within the lease duration steps down by itself (onStop)
// before anyone else can take over, so the writers it guards never overlap.
import os from "node:os";
import { randomBytes } from "node:crypto";
import type { Logger } from "./log/log.ts";
import type { KubeClient } from "./kube/client.ts";
import { createLease, getLease, microTime, updateLease, type KubeObject } from "./kube/api.ts";
import { isConflict, isNotFound } from "./kube/errors.ts";
import { sleep } from "./sleep.ts";

export interface LeaderElectionOptions {
  client: KubeClient;
  namespace: string;
  name: string;
  log: Logger;
  /** Unique per candidate; default hostname + random suffix. */
  identity?: string;
  leaseDurationSeconds?: number;
  renewMs?: number;
  retryMs?: number;
  onStart(signal: AbortSignal): void;
  onStop(): void;
  /** Injected clock for tests. */
  now?: () => number;
}

interface LeaseSpec {
  holderIdentity?: string;
  leaseDurationSeconds?: number;
  acquireTime?: string;
  renewTime?: string;
  leaseTransitions?: number;
}

export class LeaderElection {
  readonly identity: string;
  private readonly o: LeaderElectionOptions;
  private readonly abort = new AbortController();
  private leading: AbortController | undefined;
  private lastRenew = 0;
  readonly done: Promise<void>;

  constructor(o: LeaderElectionOptions) {
    this.o = o;
    this.identity = o.identity ?? `${os.hostname()}_${randomBytes(4).toString("hex")}`;
    this.done = this.loop();
  }

  get isLeader(): boolean {
    return this.leading !== undefined;
  }

  /** Steps down (releasing the Lease so a successor need not wait) and stops. */
  async stop(): Promise<void> {
    this.abort.abort();
    await this.done;
  }

  private now(): number {
    return this.o.now?.() ?? Date.now();
  }

  private get durationMs(): number {
    return (this.o.leaseDurationSeconds ?? 15) * 1000;
  }

  private async loop(): Promise<void> {
    const renewMs = this.o.renewMs ?? Math.round(this.durationMs / 3);
    const retryMs = this.o.retryMs ?? 2000;
    while (!this.abort.signal.aborted) {
      let outcome: "held" | "lost" | "error" = "error";
      try {
        outcome = (await this.tryAcquireOrRenew()) ? "held" : "lost";
      } catch (err) {
        this.o.log.warn({ lease: this.o.name, err: (err as Error).message }, "lease: cannot reach the API");
      }
      if (outcome === "held") {
        this.lastRenew = this.now();
        if (!this.leading) {
          this.leading = new AbortController();
          this.o.log.info({ lease: this.o.name, identity: this.identity }, "became leader");
          this.o.onStart(this.leading.signal);
        }
      } else if (this.leading && (outcome === "lost" || this.now() - this.lastRenew >= this.durationMs * 0.8)) {
        // Lost it, or could not renew in time: stop before another candidate may take over.
        this.stepDown(outcome === "lost" ? "another candidate holds the lease" : "lease not renewed in time");
      }
      await sleep(this.leading ? renewMs : retryMs, this.abort.signal);
    }
    if (this.leading) {
      this.stepDown("stopping");
      await this.release().catch(() => undefined);
    }
  }

  private stepDown(why: string): void {
    this.o.log.warn({ lease: this.o.name, why }, "stopped leading");
    this.leading?.abort();
    this.leading = undefined;
    this.o.onStop();
  }

  private async tryAcquireOrRenew(): Promise<boolean> {
    const { client, namespace, name } = this.o;
    const now = this.now();
    let lease: KubeObject;
    try {
      lease = await getLease(client, namespace, name, { timeoutMs: 5000 });
    } catch (err) {
      if (!isNotFound(err)) throw err;
      const spec: LeaseSpec = {
        holderIdentity: this.identity,
        leaseDurationSeconds: this.o.leaseDurationSeconds ?? 15,
        acquireTime: microTime(now),
        renewTime: microTime(now),
        leaseTransitions: 0,
      };
      try {
        await createLease(
          client,
          { apiVersion: "coordination.k8s.io/v1", kind: "Lease", metadata: { name, namespace }, spec },
          { timeoutMs: 5000 },
        );
        return true;
      } catch (e) {
        if (isConflict(e) || (e as { status?: number }).status === 409) return false;
        throw e;
      }
    }
    const spec = (lease.spec ?? {}) as LeaseSpec;
    const renewed = spec.renewTime ? Date.parse(spec.renewTime) : 0;
    const expired = now - renewed > (spec.leaseDurationSeconds ?? 15) * 1000;
    const mine = spec.holderIdentity === this.identity;
    if (!mine && spec.holderIdentity && !expired) return false;
    const next: LeaseSpec = {
      ...spec,
      holderIdentity: this.identity,
      leaseDurationSeconds: this.o.leaseDurationSeconds ?? 15,
      renewTime: microTime(now),
      ...(mine ? {} : { acquireTime: microTime(now), leaseTransitions: (spec.leaseTransitions ?? 0) + 1 }),
    };
    try {
      await updateLease(client, { ...lease, spec: next }, { timeoutMs: 5000 });
      return true;
    } catch (err) {
      if (isConflict(err)) return false;
      throw err;
    }
  }

  /** Gives the Lease up at once (renewTime in the past), so the next candidate need not wait. */
  private async release(): Promise<void> {
    const lease = await getLease(this.o.client, this.o.namespace, this.o.name, { timeoutMs: 3000 });
    const spec = (lease.spec ?? {}) as LeaseSpec;
    if (spec.holderIdentity !== this.identity) return;
    await updateLease(
      this.o.client,
      { ...lease, spec: { ...spec, holderIdentity: "", renewTime: microTime(0) } },
      { timeoutMs: 3000 },
    );
  }
}
