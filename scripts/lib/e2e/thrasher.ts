// A pod that makes real memory pressure on an e2e node, for early OOM in kubelet pods
// (test/e2e/join.test.ts, `npm run bench -- e2e --only oom`): a Burstable pod whose 64 MiB limit is
// below the 160 MiB file its eight readers keep re-reading, so its cgroup thrashes on page-cache
// refaults and the stall shows in the node's /proc/pressure/memory. It keeps a marker in its
// emptyDir: restarted after a kill (restartPolicy Always) it stays calm, so one pod is one kill.
import type { NspawnNode } from "../nspawn-node.ts";
import { BUSYBOX_IMAGE } from "./images.ts";

/** What the thrasher prints once its file is written and its readers start. */
export const THRASHING = "thrashing";
/** What it prints after a restart, when it stays calm. */
export const CALM_AFTER_RESTART = "calm after a restart";

/**
 * The group's early OOM thresholds for this busy 2-core machine (docs/testing.md): one thrashing
 * cgroup is a few percent of the node-wide full stall here, not the 30 % a whole node thrashing
 * reaches; MemAvailable never gets low (the file is page cache).
 */
export const THRASHER_EARLY_OOM = { fullStallPercent: 2, durationMs: 2000, memAvailablePercent: 0 } as const;

/** A pod of the node's (pinned by nodeName, no scheduler needed), busybox from the node's images. */
export function e2ePod(node: string, namespace: string, name: string, spec: Record<string, unknown>) {
  return {
    apiVersion: "v1",
    kind: "Pod",
    metadata: { name, namespace },
    spec: { nodeName: node, terminationGracePeriodSeconds: 0, ...spec },
  };
}

/** busybox running `command` with these resources. */
export function e2eContainer(command: string, resources: Record<string, unknown>, more: Record<string, unknown> = {}) {
  return {
    name: "main",
    image: BUSYBOX_IMAGE,
    imagePullPolicy: "Never",
    command: ["/bin/sh", "-c", command],
    resources,
    ...more,
  };
}

/** The thrasher (Burstable: requests 1 Mi, limit 64 Mi) in `default` on `node`. */
export function thrasherPod(node: string, name = "eo-thrasher") {
  return e2ePod(node, "default", name, {
    volumes: [{ name: "state", emptyDir: {} }],
    containers: [
      e2eContainer(
        [
          `if [ -e /state/started ]; then echo ${CALM_AFTER_RESTART}; exec sleep 3600; fi`,
          "touch /state/started",
          "head -c 167772160 /dev/urandom >/data",
          `echo ${THRASHING}`,
          "for i in 1 2 3 4 5 6 7 8; do (while :; do cat /data >/dev/null; done) & done",
          "wait",
        ].join("\n"),
        { requests: { memory: "1Mi" }, limits: { memory: "64Mi" } },
        { volumeMounts: [{ name: "state", mountPath: "/state" }] },
      ),
    ],
  });
}

/** An early OOM kill as the agent's /early-oom endpoint reports it. */
export interface EarlyOomKill {
  at: string;
  action: string;
  pod?: string;
  uid?: string;
  trigger: string;
  result?: string;
  figures: { heldSeconds?: number };
}

/** What the agent's early OOM endpoint (the metrics listener's /early-oom) says on a machine. */
export interface EarlyOomStatus {
  enabled?: boolean;
  config?: { fullStallPercent?: number };
  actions?: { kill?: number };
  lastAction?: EarlyOomKill;
}

export async function earlyOomStatus(machine: Pick<NspawnNode, "mustExec">): Promise<EarlyOomStatus> {
  const r = await machine.mustExec(["curl", "-sS", "--max-time", "5", "http://127.0.0.1:9650/early-oom"]);
  return JSON.parse(r.stdout) as EarlyOomStatus;
}

/**
 * A kill's latency from its record: onset (the stall first over the threshold) → the pod's
 * processes gone, and the part of it beyond the trigger's duration (what early OOM adds once the
 * trigger is met: the sample that sees it, ranking, the kill).
 */
export function killLatency(a: EarlyOomKill, durationMs: number): { onsetMs: number; beyondMs: number } {
  const killMs = Number(/in (\d+) ms/.exec(a.result ?? "")?.[1]);
  const heldMs = (a.figures.heldSeconds ?? Number.NaN) * 1000;
  if (!Number.isFinite(killMs) || !Number.isFinite(heldMs)) {
    throw new Error(
      `early OOM's record says neither how long the trigger held nor the kill took: ${JSON.stringify(a)}`,
    );
  }
  return { onsetMs: heldMs + killMs, beyondMs: heldMs - durationMs + killMs };
}
