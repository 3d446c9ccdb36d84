// Keeps the served bundles in step with the inputs: re-renders when a source reports a change
// or a group's update epoch ends, publishes what changed, and hands the checksums on. A group
// whose render fails keeps serving its last good objects (and its checksum stays), and the
// failure is reported: a log line, a metric, and a Warning Event on the NodeGroup. A broken
// NodeGroupConfiguration is reported on itself too (status and Event, through a hook), with the
// groups it holds back; groups it does not select render as usual.
import type { Logger } from "../../lib/log/log.ts";
import { RenderError } from "../render/errors.ts";
import type { RenderInputs } from "../render/inputs.ts";
import { renderAll, selects, type RenderedGroup } from "../render/render.ts";
import type { Metrics } from "./metrics.ts";
import type { BundleStore } from "./store.ts";
import type { Source } from "../sources/types.ts";
import type { ChecksumGate } from "./checksum-gate.ts";

export interface RenderLoopHooks {
  /**
   * Called after each pass with every rendered group's checksum (only when the set changed).
   * Resolving `false` means "not written" (this replica does not lead): asked again next time.
   */
  onChecksums?: (checksums: ReadonlyMap<string, string>) => Promise<boolean | undefined>;
  /** Called once per distinct failure of a group. */
  onRenderError?: (group: string, err: RenderError) => Promise<void>;
  /** Called after each pass with the rendered inputs (bootstrap Secrets). */
  onRendered?: (inputs: RenderInputs, served: ReadonlyMap<string, RenderedGroup>) => Promise<void>;
  /**
   * A NodeGroupConfiguration started failing or its error changed (`error` set; `groups`: the
   * groups it selects that keep their last good bundle because of it), or it renders again
   * (`error` undefined). Called once per change.
   */
  onConfigurationError?: (name: string, error: string | undefined, groups: readonly string[]) => Promise<void>;
}

const NGC_PREFIX = "NodeGroupConfiguration/";

export class RenderLoop {
  private readonly source: Source;
  private readonly store: BundleStore;
  private readonly metrics: Metrics;
  private readonly log: Logger;
  private readonly hooks: RenderLoopHooks;
  private readonly now: () => number;
  private readonly served = new Map<string, RenderedGroup>();
  /** With a gate: the last few renders per group, by checksum, waiting to be named by the Secret. */
  private readonly candidates = new Map<string, Map<string, RenderedGroup>>();
  private readonly gate: ChecksumGate | undefined;
  private readonly reported = new Map<string, string>();
  /** NodeGroupConfiguration name → what was last reported about it. */
  private readonly configurationReported = new Map<string, string>();
  private lastChecksums = "";
  private running: Promise<void> | undefined;
  private again = false;
  private epochTimer: NodeJS.Timeout | undefined;
  private debounce: NodeJS.Timeout | undefined;
  private stopped = false;
  private waitingForContextLogged = false;
  passes = 0;

  constructor(
    deps: {
      source: Source;
      store: BundleStore;
      metrics: Metrics;
      log: Logger;
      now?: () => number;
      /** Serve a group only at the checksum Secret configuration-checksums names (replicas). */
      gate?: ChecksumGate;
    },
    hooks: RenderLoopHooks = {},
  ) {
    this.source = deps.source;
    this.store = deps.store;
    this.metrics = deps.metrics;
    this.log = deps.log;
    this.now = deps.now ?? Date.now;
    this.gate = deps.gate;
    this.hooks = hooks;
    this.gate?.onChange(() => this.publishGated([]));
  }

  /**
   * Forgets which checksums were written and which failures reported, so the next pass writes
   * and reports again (this replica just became the leader).
   */
  forgetWrites(): void {
    this.lastChecksums = "";
    this.reported.clear();
    this.configurationReported.clear();
  }

  /** Asks for a render pass soon; bursts of changes (a relist) collapse into one pass. */
  trigger(delayMs = 50): void {
    if (this.stopped) return;
    clearTimeout(this.debounce);
    this.debounce = setTimeout(() => void this.runOnce(), delayMs);
  }

  /** One pass now (or right after the running one). Resolves when it is done. */
  async runOnce(): Promise<void> {
    if (this.running) {
      this.again = true;
      return this.running;
    }
    this.running = this.pass().finally(() => {
      this.running = undefined;
      if (this.again && !this.stopped) {
        this.again = false;
        void this.runOnce();
      }
    });
    return this.running;
  }

  private async pass(): Promise<void> {
    const { inputs } = this.source.snapshot();
    if (!inputs.context) {
      if (!this.waitingForContextLogged) this.log.warn("no cluster context yet; nothing can be rendered");
      this.waitingForContextLogged = true;
      return;
    }
    const full = inputs as RenderInputs;
    const now = this.now();
    const result = renderAll(full, now);
    this.metrics.renders.inc();
    this.passes++;
    const present = new Set(full.nodeGroups.map((g) => g.metadata.name));
    for (const [group, r] of result.groups) {
      this.served.set(group, r);
      if (this.reported.delete(group)) this.log.info({ group }, `node group ${group} renders again`);
    }
    for (const [group, err] of result.errors) {
      this.metrics.renderErrors.inc({ group });
      if (this.reported.get(group) === err.message) continue;
      this.reported.set(group, err.message);
      const kept = this.served.get(group);
      this.log.error(
        { group, object: err.object, keptChecksum: kept?.checksum },
        `cannot render node group ${group}: ${err.message}; ${kept ? "serving its last good bundle" : "nothing served for it yet"}`,
      );
      await this.hooks
        .onRenderError?.(group, err)
        .catch((e: Error) => this.log.warn({ group, err: e.message }, "cannot report the render failure as an Event"));
    }
    await this.reportConfigurations(full, result.groups, result.errors);
    const removed = [...this.served.keys()].filter((g) => !present.has(g));
    for (const g of removed) {
      this.served.delete(g);
      this.reported.delete(g);
      this.candidates.delete(g);
    }
    if (this.gate) {
      for (const r of result.groups.values()) {
        const byChecksum = this.candidates.get(r.name) ?? new Map<string, RenderedGroup>();
        byChecksum.delete(r.checksum);
        byChecksum.set(r.checksum, r);
        // A replica a few renders ahead of the Secret still has what it names.
        if (byChecksum.size > 8) byChecksum.delete(byChecksum.keys().next().value as string);
        this.candidates.set(r.name, byChecksum);
      }
      this.publishGated(removed);
    } else {
      const changed = this.store.publish(result.groups.values(), removed);
      if (changed.size) this.log.info({ groups: [...changed].sort() }, "bundles changed");
    }

    const checksums = new Map([...this.served].map(([g, r]) => [g, r.checksum]));
    const key = JSON.stringify([...checksums].sort());
    if (key !== this.lastChecksums && this.hooks.onChecksums) {
      try {
        const written = await this.hooks.onChecksums(checksums);
        if (written !== false) {
          this.lastChecksums = key;
          this.metrics.checksumWrites.inc({ result: "ok" });
        }
      } catch (err) {
        this.metrics.checksumWrites.inc({ result: "error" });
        this.log.error({ err: (err as Error).message }, "cannot write the checksums Secret; retrying in 10 s");
        this.trigger(10_000);
      }
    }
    await this.hooks.onRendered?.(full, this.served).catch((err: Error) => {
      this.log.error({ err: err.message }, "cannot reconcile bootstrap Secrets; retrying in 30 s");
      this.trigger(30_000);
    });
    this.scheduleEpoch([...result.groups.values()]);
  }

  private async reportConfigurations(
    inputs: RenderInputs,
    rendered: ReadonlyMap<string, RenderedGroup>,
    errors: ReadonlyMap<string, RenderError>,
  ): Promise<void> {
    const failing = new Map<string, { messages: Set<string>; groups: string[] }>();
    for (const [group, err] of errors) {
      for (const cause of err.causes) {
        if (!cause.object.startsWith(NGC_PREFIX)) continue;
        const name = cause.object.slice(NGC_PREFIX.length);
        const entry = failing.get(name) ?? { messages: new Set<string>(), groups: [] };
        entry.messages.add(cause.message);
        entry.groups.push(group);
        failing.set(name, entry);
      }
    }
    const call = async (name: string, error: string | undefined, groups: string[]) => {
      await this.hooks
        .onConfigurationError?.(name, error, groups)
        .catch((e: Error) =>
          this.log.warn({ configuration: name, err: e.message }, "cannot report the NodeGroupConfiguration's state"),
        );
    };
    for (const [name, f] of failing) {
      const groups = [...new Set(f.groups)].sort();
      const message = [...f.messages].sort().join("; ");
      const key = JSON.stringify([message, groups]);
      if (this.configurationReported.get(name) === key) continue;
      this.configurationReported.set(name, key);
      this.log.error(
        { configuration: name, groups },
        `${message}; node groups ${groups.join(", ")} keep their last good bundle`,
      );
      await call(name, message, groups);
    }
    for (const name of [...this.configurationReported.keys()]) {
      if (failing.has(name)) continue;
      const ngc = inputs.configurations.find((c) => c.metadata?.name === name);
      if (!ngc) {
        this.configurationReported.delete(name); // deleted: nothing left to report on
        continue;
      }
      // Cleared only when known good: it rendered into some group, or no group it selects failed
      // (a group failing for another reason never got as far as this script).
      const selected = inputs.nodeGroups.filter((g) => selects(ngc.spec?.nodeGroups, g.metadata.name));
      const renderedSomewhere = selected.some((g) =>
        rendered
          .get(g.metadata.name)
          ?.bundle.steps.some((st) => st.kind === "Script" && st.spec.source === `${NGC_PREFIX}${name}`),
      );
      if (!renderedSomewhere && selected.some((g) => errors.has(g.metadata.name))) continue;
      this.configurationReported.delete(name);
      this.log.info({ configuration: name }, `NodeGroupConfiguration ${name} renders again`);
      await call(name, undefined, []);
    }
  }

  /** Publishes, per group, the render whose checksum the Secret names (if this replica has it). */
  private publishGated(removed: string[]): void {
    const gate = this.gate;
    if (!gate || this.stopped) return;
    const ready: RenderedGroup[] = [];
    for (const [group, byChecksum] of this.candidates) {
      const want = gate.wanted(group);
      const r = want ? byChecksum.get(want) : undefined;
      if (r && this.store.get("nodegroupbundles", group)?.object.checksum !== want) ready.push(r);
    }
    if (!ready.length && !removed.length) return;
    const changed = this.store.publish(ready, removed, gate.revision);
    if (changed.size) this.log.info({ groups: [...changed].sort(), revision: gate.revision }, "bundles changed");
  }

  /** Whether the group is served at the checksum the Secret names (or the Secret names none). */
  caughtUp(group: string): boolean {
    const want = this.gate?.wanted(group);
    return !want || this.store.get("nodegroupbundles", group)?.object.checksum === want;
  }

  /** Re-render when the earliest group's update epoch ends (the 4-hourly forced re-run). */
  private scheduleEpoch(rendered: RenderedGroup[]): void {
    clearTimeout(this.epochTimer);
    // Only groups that rendered now: a failing group's stale epoch would spin this timer.
    if (this.stopped || !rendered.length) return;
    const next = Math.min(...rendered.map((r) => r.nextEpochChangeMs));
    const delay = Math.max(1000, Math.min(next - this.now() + 50, 2 ** 31 - 1));
    this.epochTimer = setTimeout(() => void this.runOnce(), delay);
    this.epochTimer.unref();
  }

  stop(): void {
    this.stopped = true;
    clearTimeout(this.epochTimer);
    clearTimeout(this.debounce);
  }
}

export { RenderError };
