// NodeGroup status, where `kubectl get nodegroups` and `kubectl describe` look: node counts, a
// one-line summary of the rollout, and Deckhouse's conditions, kubernetesVersion and error
// (group-conditions.ts). Written only when it changed, and at most once per interval per group
// (a rollout of 200 nodes changes it hundreds of times; the last value wins).
import type { KubeClient } from "../../lib/kube/client.ts";
import { isNotFound } from "../../lib/kube/errors.ts";
import type { Logger } from "../../lib/log/log.ts";
import type { GroupStatus } from "./decide.ts";
import type { GroupCondition } from "./group-conditions.ts";

const enc = encodeURIComponent;

export interface StatusExtras {
  /** Everything wrong with the group (its spec, NodeGroupConfigurations that fail for it). */
  errors: readonly string[];
  conditions: GroupCondition[];
  kubernetesVersion: string;
}

export function statusBody(s: GroupStatus, x: StatusExtras): Record<string, unknown> {
  const { message, ...counts } = s;
  // The spec's own error already leads the rollout summary (decide.ts); others are put before it.
  const more = x.errors.filter((e) => !message.startsWith(e));
  return {
    ...counts,
    kubernetesVersion: x.kubernetesVersion,
    error: x.errors.join("; "),
    conditions: x.conditions,
    conditionSummary: {
      statusMessage: [...more, message].join("; "),
      ready: x.errors.length ? "False" : "True",
    },
  };
}

export class StatusWriter {
  private readonly client: KubeClient;
  private readonly log: Logger;
  private readonly intervalMs: number;
  private readonly written = new Map<string, string>();
  private readonly wanted = new Map<string, Record<string, unknown>>();
  private readonly lastWriteAt = new Map<string, number>();
  private readonly timers = new Map<string, NodeJS.Timeout>();
  private stopped = false;
  writes = 0;

  constructor(client: KubeClient, log: Logger, intervalMs: number) {
    this.client = client;
    this.log = log;
    this.intervalMs = intervalMs;
  }

  /** `current` is the status the API shows now (from the informer), so a restart writes nothing new. */
  set(group: string, body: Record<string, unknown>, current: unknown): void {
    const text = JSON.stringify(body);
    if (!this.written.has(group) && sameFields(current, body)) this.written.set(group, text);
    if (this.written.get(group) === text) {
      this.wanted.delete(group);
      return;
    }
    this.wanted.set(group, body);
    if (this.timers.has(group)) return;
    const wait = Math.max(0, (this.lastWriteAt.get(group) ?? 0) + this.intervalMs - Date.now());
    const t = setTimeout(() => {
      this.timers.delete(group);
      void this.flush(group);
    }, wait);
    t.unref();
    this.timers.set(group, t);
  }

  private async flush(group: string): Promise<void> {
    const body = this.wanted.get(group);
    if (!body || this.stopped) return;
    this.wanted.delete(group);
    this.lastWriteAt.set(group, Date.now());
    const text = JSON.stringify(body);
    try {
      this.writes++;
      await this.client.request("PATCH", `/apis/deckhouse.io/v1/nodegroups/${enc(group)}/status`, {
        body: { status: body },
        timeoutMs: 10_000,
      });
      this.written.set(group, text);
    } catch (err) {
      if (isNotFound(err)) return;
      this.log.warn({ group, err: (err as Error).message }, "cannot write NodeGroup status; retrying");
      if (!this.wanted.has(group)) this.set(group, body, undefined);
    }
  }

  forget(group: string): void {
    clearTimeout(this.timers.get(group));
    this.timers.delete(group);
    this.written.delete(group);
    this.wanted.delete(group);
  }

  stop(): void {
    this.stopped = true;
    for (const t of this.timers.values()) clearTimeout(t);
    this.timers.clear();
  }
}

function sameFields(current: unknown, body: Record<string, unknown>): boolean {
  if (!current || typeof current !== "object") return false;
  const cur = current as Record<string, unknown>;
  return Object.entries(body).every(([k, v]) => JSON.stringify(cur[k]) === JSON.stringify(v));
}
