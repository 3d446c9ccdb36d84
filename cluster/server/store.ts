// What the server serves: per resource and group, the current object already serialised, its
// ETag and resourceVersion. Rendering publishes here; requests and watches read from here.
// resourceVersions are one counter for all objects (like etcd's revision) that starts at the
// wall clock, so a restarted server never hands out numbers older than before; with several
// replicas they follow the checksums Secret's revision instead (checksum-gate.ts).
import { createHash } from "node:crypto";
import { canonicalJson } from "../../bundles/checksum.ts";
import type { RenderedGroup, ServedObject } from "../render/render.ts";
import { RESOURCE_NAMES, type ResourceName } from "./resources.ts";

/** Served resourceVersion = Secret revision × this + a counter (see checksum-gate.ts). */
export const REVISION_SHIFT = 65_536;

export interface Entry {
  group: string;
  object: ServedObject;
  /** canonical JSON of `object` (with its resourceVersion). */
  json: string;
  etag: string;
  rv: number;
  createdRv: number;
}

export interface StoreEvent {
  type: "ADDED" | "MODIFIED" | "DELETED";
  resource: ResourceName;
  entry: Entry;
}

type Listener = (ev: StoreEvent) => void;

const objectOf = (r: RenderedGroup, resource: ResourceName): ServedObject =>
  resource === "nodegroupbundles"
    ? (r.bundle as unknown as ServedObject)
    : r[resource === "bashibles" ? "bashible" : "bootstrap"];

/** An ETag that depends on content only, so it survives restarts (resourceVersion does not). */
const etagOf = (obj: ServedObject) => `"${createHash("sha256").update(canonicalJson(obj)).digest("hex").slice(0, 40)}"`;

export class BundleStore {
  private counter: number;
  private readonly entries = new Map<ResourceName, Map<string, Entry>>(RESOURCE_NAMES.map((r) => [r, new Map()]));
  /** Deleted objects, so a watch resuming from an older resourceVersion still hears DELETED. */
  private readonly tombstones = new Map<ResourceName, Map<string, Entry>>(RESOURCE_NAMES.map((r) => [r, new Map()]));
  private readonly listeners = new Map<ResourceName, Set<Listener>>(RESOURCE_NAMES.map((r) => [r, new Set()]));

  /**
   * `revisions`: resourceVersions follow the checksums Secret's revision (checksum-gate.ts)
   * instead of the wall clock, so every replica hands out comparable ones.
   */
  constructor(o: { revisions?: boolean } = {}) {
    this.counter = o.revisions ? 0 : Date.now();
  }

  get resourceVersion(): number {
    return this.counter;
  }

  get(resource: ResourceName, group: string): Entry | undefined {
    return this.entries.get(resource)!.get(group);
  }

  list(resource: ResourceName): Entry[] {
    return [...this.entries.get(resource)!.values()].sort((a, b) =>
      a.group < b.group ? -1 : a.group > b.group ? 1 : 0,
    );
  }

  deletedSince(resource: ResourceName, rv: number): Entry[] {
    return [...this.tombstones.get(resource)!.values()].filter((e) => e.rv > rv);
  }

  subscribe(resource: ResourceName, fn: Listener): () => void {
    const set = this.listeners.get(resource)!;
    set.add(fn);
    return () => set.delete(fn);
  }

  /** Whether the store serves any group yet (readiness). */
  get populated(): boolean {
    return this.entries.get("nodegroupbundles")!.size > 0;
  }

  /**
   * Makes `groups` the served set for the listed groups; groups in `remove` disappear.
   * Unchanged objects keep their resourceVersion and wake nobody. Returns the changed groups.
   */
  publish(groups: Iterable<RenderedGroup>, remove: Iterable<string> = [], revision?: number): Set<string> {
    const changed = new Set<string>();
    if (revision !== undefined) this.counter = Math.max(this.counter, revision * REVISION_SHIFT);
    for (const r of groups) {
      for (const resource of RESOURCE_NAMES) {
        const obj = objectOf(r, resource);
        const etag = etagOf(obj);
        const map = this.entries.get(resource)!;
        const prev = map.get(r.name);
        if (prev?.etag === etag) continue;
        const rv = ++this.counter;
        const object = { ...obj, metadata: { ...obj.metadata, resourceVersion: String(rv) } };
        const entry: Entry = {
          group: r.name,
          object,
          json: canonicalJson(object),
          etag,
          rv,
          createdRv: prev?.createdRv ?? rv,
        };
        map.set(r.name, entry);
        this.tombstones.get(resource)!.delete(r.name);
        changed.add(r.name);
        this.emit({ type: prev ? "MODIFIED" : "ADDED", resource, entry });
      }
    }
    for (const group of remove) {
      for (const resource of RESOURCE_NAMES) {
        const prev = this.entries.get(resource)!.get(group);
        if (!prev) continue;
        this.entries.get(resource)!.delete(group);
        const rv = ++this.counter;
        const object = { ...prev.object, metadata: { ...prev.object.metadata, resourceVersion: String(rv) } };
        const entry: Entry = { ...prev, object, json: canonicalJson(object), rv };
        const tomb = this.tombstones.get(resource)!;
        tomb.set(group, entry);
        // Bounded: a client resuming from before the oldest tombstone just relists.
        if (tomb.size > 1000) tomb.delete(tomb.keys().next().value as string);
        changed.add(group);
        this.emit({ type: "DELETED", resource, entry });
      }
    }
    return changed;
  }

  private emit(ev: StoreEvent): void {
    for (const fn of this.listeners.get(ev.resource)!) fn(ev);
  }
}
