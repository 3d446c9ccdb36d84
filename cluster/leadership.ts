// Work that must run on one replica only (writes to shared objects, controllers), started when
// this replica wins its Lease and stopped when it loses it. Every replica runs a candidate; the
// others keep serving and take over within a lease duration of the leader's death. All such
// work goes through here, one Lease each (LEASES in bundles/names.ts): the bundle server's
// writers (server/app.ts), the update controllers (controllers/run.ts) and the fencing
// controller (controllers/fencing.ts).
import os from "node:os";
import { randomBytes } from "node:crypto";
import type { KubeClient } from "../lib/kube/client.ts";
import { LeaderElection } from "../lib/leader-election.ts";
import type { Logger } from "../lib/log/log.ts";

export interface LeaseTiming {
  /** A dead leader's Lease is taken over this long after its last renewal. Default 10 s. */
  leaseDurationSeconds?: number;
  /** How often a candidate that does not lead tries. Default 1 s. */
  retryMs?: number;
}

export interface Leadership {
  readonly isLeader: boolean;
  readonly identity: string;
  stop(): Promise<void>;
}

/** This replica's identity: the pod name when there is one, so `kubectl get lease` says who leads. */
export const candidateIdentity = () =>
  `${process.env.POD_NAME ?? os.hostname()}_${process.pid}_${randomBytes(3).toString("hex")}`;

/**
 * Runs `lead(signal)` while this replica holds Lease `name`; `signal` aborts when it stops
 * leading (lost the Lease, could not renew in time, or stopping).
 */
export function whileLeading(
  o: {
    client: KubeClient;
    namespace: string;
    name: string;
    log: Logger;
    identity?: string;
    now?: () => number;
  } & LeaseTiming,
  lead: (signal: AbortSignal) => void,
): Leadership {
  const leaseDurationSeconds = o.leaseDurationSeconds ?? 10;
  const election = new LeaderElection({
    client: o.client,
    namespace: o.namespace,
    name: o.name,
    log: o.log,
    identity: o.identity ?? candidateIdentity(),
    leaseDurationSeconds,
    renewMs: Math.max(200, Math.round((leaseDurationSeconds * 1000) / 4)),
    retryMs: o.retryMs ?? 1000,
    now: o.now,
    onStart: (signal) => lead(signal),
    onStop: () => {},
  });
  return {
    get isLeader() {
      return election.isLeader;
    },
    identity: election.identity,
    stop: () => election.stop(),
  };
}
