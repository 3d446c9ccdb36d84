// With several replicas, what a node is served must not depend on which replica answers, and
// must never go back to an older checksum when its watch moves to another replica. So every
// replica serves a group's bundle only once Secret configuration-checksums names its checksum:
// the leader renders, writes the Secret, and serves; the others serve when they see the Secret
// change (having rendered the same inputs, they have the same bundle). The Secret's
// resourceVersion (an etcd revision, the same on every replica) orders what was served:
// served objects carry resourceVersion = revision × 2^16 + a counter, so a watch resumed on
// another replica gets only what is newer than what it had.
import { SECRETS } from "../../bundles/names.ts";
import type { KubeClient } from "../../lib/kube/client.ts";
import type { KubeObject } from "../../lib/kube/api.ts";
import { Informer } from "../../lib/informer.ts";
import type { Logger } from "../../lib/log/log.ts";

const revisionOf = (s: KubeObject | undefined) => Number(s?.metadata.resourceVersion ?? 0) || 0;

export class ChecksumGate {
  private readonly informer: Informer;
  private readonly key: string;
  private current: KubeObject | undefined;
  private wantedMap = new Map<string, string>();
  private readonly listeners = new Set<() => void>();

  constructor(client: KubeClient, namespace: string, log: Logger) {
    this.key = `${namespace}/${SECRETS.checksums}`;
    this.informer = new Informer({
      client,
      path: `/api/v1/namespaces/${namespace}/secrets`,
      fieldSelector: `metadata.name=${SECRETS.checksums}`,
      log,
      onEvent: (ev) => {
        if (ev.type === "SYNC") this.take(this.informer.objects.get(this.key), true);
        else if (ev.type === "DELETED") this.take(undefined, true);
        else this.take(ev.object, false);
      },
    });
  }

  /** Lists the Secret once (throws when that fails), then follows it. */
  async start(): Promise<void> {
    await this.informer.start();
  }

  stop(): void {
    this.informer.stop();
  }

  /** The Secret as this replica last saw it; a newer one (the leader's own write) may come first. */
  note(secret: KubeObject): void {
    this.take(secret, false);
  }

  /** The revision of the Secret this replica knows (0: none yet). */
  get revision(): number {
    return revisionOf(this.current);
  }

  /** The checksum group `g` is to be served at, per the Secret. */
  wanted(group: string): string | undefined {
    return this.wantedMap.get(group);
  }

  onChange(fn: () => void): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  private take(secret: KubeObject | undefined, relisted: boolean): void {
    // Never back to an older revision (the leader's own write can arrive before its watch
    // event, and a list begun before that write can end after it); a deletion is taken.
    if (secret && this.current && revisionOf(secret) <= revisionOf(this.current)) return;
    if (!secret && !relisted && !this.current) return;
    this.current = secret;
    const data = (secret?.data ?? {}) as Record<string, string>;
    this.wantedMap = new Map(Object.entries(data).map(([g, v]) => [g, Buffer.from(v, "base64").toString("utf8")]));
    for (const fn of this.listeners) fn();
  }
}
