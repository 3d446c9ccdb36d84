// The one list + watch loop: keeps a collection current, re-lists on 410 Gone or a broken
// watch (with lib/backoff's rhythm), and tells the owner what changed. The daemon's Node watch,
// the server's sources, the controllers and early OOM's pod list all use it, so reconnect and
// backoff behave the same everywhere.
import type { Logger } from "./log/log.ts";
import type { KubeClient } from "./kube/client.ts";
import { list, type KubeObject } from "./kube/api.ts";
import { isGone } from "./kube/errors.ts";
import { Backoff } from "./backoff.ts";
import { sleep } from "./sleep.ts";

export type InformerEvent<T> =
  /** `previous`: what the collection held under that key before the event, when anything. */
  | { type: "ADDED" | "MODIFIED" | "DELETED"; object: T; previous?: T }
  /** The collection was listed afresh (first sync or after a broken watch). */
  | { type: "SYNC" };

export interface InformerOptions<T> {
  client: KubeClient;
  /** Collection path, e.g. /api/v1/nodes or /api/v1/namespaces/x/pods. */
  path: string;
  fieldSelector?: string;
  labelSelector?: string;
  log: Logger;
  onEvent?: (ev: InformerEvent<T>) => void;
  /** Keep only what the owner reads (a Node's status would otherwise sit in memory). */
  trim?: (obj: T) => T;
  /** Server-side watch timeout; the loop re-opens it from the last resourceVersion. */
  watchSeconds?: number;
  backoff?: Backoff;
}

const keyOf = (o: KubeObject) =>
  o.metadata.namespace ? `${o.metadata.namespace}/${o.metadata.name}` : o.metadata.name;

export class Informer<T extends KubeObject = KubeObject> {
  /** Current objects by `namespace/name` (or `name` for cluster-scoped ones). */
  readonly objects = new Map<string, T>();
  private readonly o: InformerOptions<T>;
  private readonly abort = new AbortController();
  /** The running loop's own switch: resync() replaces the loop without stopping the informer. */
  private loopAbort = new AbortController();
  private readonly backoff: Backoff;
  private syncedOnce = false;
  private lastError: Error | undefined;

  constructor(o: InformerOptions<T>) {
    this.o = o;
    this.backoff = o.backoff ?? new Backoff();
  }

  /** The collection this informer keeps. */
  get path(): string {
    return this.o.path;
  }

  get synced(): boolean {
    return this.syncedOnce;
  }

  /** The last list or watch failure, cleared by the next success. */
  get error(): Error | undefined {
    return this.lastError;
  }

  /**
   * Lists once (throws when that fails, so the caller can say why), then keeps watching in the
   * background until stop().
   */
  async start(): Promise<void> {
    const signal = this.loopSignal();
    const rv = await this.relist(signal);
    void this.loop(rv, signal);
  }

  /** Like start(), but a failing first list is retried in the background instead of thrown. */
  run(): void {
    void this.loop(undefined, this.loopSignal());
  }

  /**
   * Lists afresh (a quorum read: at least as new as any write made before the call) and watches
   * on from there. The old loop stops first, so none of its events, older than the new list, can
   * land after it. When the list fails the loop goes on retrying in the background and the
   * failure is thrown.
   */
  async resync(): Promise<void> {
    this.loopAbort.abort();
    this.loopAbort = new AbortController();
    const signal = this.loopSignal();
    let rv: string | undefined;
    try {
      rv = await this.relist(signal);
    } finally {
      if (!signal.aborted) void this.loop(rv, signal);
    }
  }

  stop(): void {
    this.abort.abort();
  }

  private loopSignal(): AbortSignal {
    return AbortSignal.any([this.abort.signal, this.loopAbort.signal]);
  }

  private async relist(signal: AbortSignal): Promise<string> {
    const l = await list<T>(this.o.client, this.o.path, {
      fieldSelector: this.o.fieldSelector,
      labelSelector: this.o.labelSelector,
      signal,
    });
    // A resync() replaced this loop while the list was on its way: its result is older.
    if (signal.aborted) throw new Error("relist superseded");
    this.objects.clear();
    for (const item of l.items) this.objects.set(keyOf(item), this.o.trim ? this.o.trim(item) : item);
    this.syncedOnce = true;
    this.lastError = undefined;
    this.o.onEvent?.({ type: "SYNC" });
    return l.metadata.resourceVersion;
  }

  private async loop(startRv: string | undefined, signal: AbortSignal): Promise<void> {
    let rv = startRv;
    while (!signal.aborted) {
      try {
        if (rv === undefined) rv = await this.relist(signal);
        for await (const ev of this.o.client.watch<T>(this.o.path, {
          resourceVersion: rv,
          allowWatchBookmarks: true,
          timeoutSeconds: this.o.watchSeconds ?? 300,
          fieldSelector: this.o.fieldSelector,
          labelSelector: this.o.labelSelector,
          idleTimeoutMs: ((this.o.watchSeconds ?? 300) + 30) * 1000,
          signal,
        })) {
          if (signal.aborted) return;
          this.backoff.reset();
          this.lastError = undefined;
          rv = ev.object.metadata?.resourceVersion ?? rv;
          if (ev.type === "BOOKMARK") continue;
          const obj = this.o.trim ? this.o.trim(ev.object) : ev.object;
          const key = keyOf(ev.object); // as the list keys it: a trim may drop the namespace
          const previous = this.objects.get(key);
          if (ev.type === "DELETED") this.objects.delete(key);
          else this.objects.set(key, obj);
          this.o.onEvent?.(previous ? { type: ev.type, object: obj, previous } : { type: ev.type, object: obj });
        }
      } catch (err) {
        if (signal.aborted) return;
        this.lastError = err as Error;
        if (!isGone(err))
          this.o.log.warn({ path: this.o.path, err: (err as Error).message }, "watch failed; relisting");
        rv = undefined;
        await sleep(this.backoff.next(), signal);
      }
    }
  }
}
