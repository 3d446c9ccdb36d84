// A keyed work queue for the per-object controllers (nodeTemplate, Instance): a key queued
// while it is being worked on runs again after, never twice at once; at most `concurrency`
// keys run together; a failed key is retried after `retryMs`. Level-triggered: the worker
// reads the current state for the key, so queuing a key many times costs one pass.
import type { Logger } from "../../lib/log/log.ts";

export class WorkQueue {
  private readonly queued = new Set<string>();
  private readonly running = new Set<string>();
  private readonly again = new Set<string>();
  private readonly retries = new Map<string, NodeJS.Timeout>();
  private readonly work: (key: string) => Promise<void>;
  private readonly log: Logger;
  private readonly concurrency: number;
  private readonly retryMs: number;
  private stopped = false;
  private idle: (() => void)[] = [];

  constructor(o: { work: (key: string) => Promise<void>; log: Logger; concurrency?: number; retryMs?: number }) {
    this.work = o.work;
    this.log = o.log;
    this.concurrency = o.concurrency ?? 8;
    this.retryMs = o.retryMs ?? 10_000;
  }

  add(key: string): void {
    if (this.stopped) return;
    if (this.running.has(key)) {
      this.again.add(key);
      return;
    }
    this.queued.add(key);
    this.pump();
  }

  stop(): void {
    this.stopped = true;
    for (const t of this.retries.values()) clearTimeout(t);
    this.retries.clear();
    this.queued.clear();
  }

  /** Resolves once nothing is queued or running (tests). */
  settled(): Promise<void> {
    if (!this.queued.size && !this.running.size) return Promise.resolve();
    return new Promise((r) => this.idle.push(r));
  }

  private pump(): void {
    while (!this.stopped && this.running.size < this.concurrency && this.queued.size) {
      const key = this.queued.values().next().value as string;
      this.queued.delete(key);
      this.running.add(key);
      void this.work(key)
        .catch((err: Error) => {
          this.log.warn({ key, err: err.message }, `retrying in ${this.retryMs / 1000} s`);
          clearTimeout(this.retries.get(key));
          const t = setTimeout(() => {
            this.retries.delete(key);
            this.add(key);
          }, this.retryMs);
          t.unref();
          this.retries.set(key, t);
        })
        .finally(() => {
          this.running.delete(key);
          if (this.again.delete(key)) this.queued.add(key);
          this.pump();
          if (!this.queued.size && !this.running.size) for (const r of this.idle.splice(0)) r();
        });
    }
  }
}
