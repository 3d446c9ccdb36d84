// The resident agent (`bashible run`). It stays small: it watches the bundle and its own Node,
// checks the gate every minute, and starts a converge as a child process (`bashible once`)
// only when one is due. The converge machinery (steps, diffs, package fetching) lives in the
// child and leaves with it, so the daemon's memory stays close to a bare Node process.
import { spawn, type ChildProcess } from "node:child_process";
import { watch as fsWatch, type FSWatcher } from "node:fs";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import type { Logger } from "../log.ts";
import { sleep } from "../sleep.ts";
import type { KubeClient } from "../kube/client.ts";
import type { KubeObject } from "../kube/api.ts";
import { isGone } from "../kube/errors.ts";
import { API_VERSION } from "../../bundles/types.ts";
import { KERNEL_PATHS } from "../facts.ts";
import { decide } from "../converge/gate.ts";
import { NODE_KEYS, PATHS } from "../converge/paths.ts";
import { ApiBundleSource, FileBundleSource, type BundleSource } from "../converge/source.ts";

export interface DaemonOptions {
  root: string;
  log: Logger;
  /** Arguments for the converge child after `once`. */
  childArgs: string[];
  tickMs: number;
  nodeName: string;
  nodeGroup?: string;
  /** Local mode: the bundle file to follow. */
  bundleFile?: string;
  /** API mode (or local mode with --kubeconfig): clients in preference order. */
  clients: KubeClient[];
}

const rootPath = (root: string, p: string) => path.join(root, p);

/** Arguments to run `bashible <args>` as a child on this runtime, without the daemon's memory flags. */
export function agentArgv(args: string[]): string[] {
  const execArgv = process.execArgv.filter((a) => a !== "--lite-mode" && a !== "--use-openssl-ca");
  return [...execArgv, process.argv[1] ?? "", ...args];
}

function jitter(ms: number): number {
  return Math.round(ms * (0.5 + Math.random()));
}

export class Daemon {
  private readonly o: DaemonOptions;
  private readonly log: Logger;
  private readonly abort = new AbortController();
  private child: ChildProcess | undefined;
  private rerun: string | undefined;
  private bundleChecksum: string | undefined;
  private etag: string | undefined;
  private node: KubeObject | undefined;
  private group: string | undefined;
  private source: BundleSource | undefined;
  private timer: NodeJS.Timeout | undefined;
  private fileWatcher: FSWatcher | undefined;
  private bundleWatchRestart: (() => void) | undefined;
  /** Completes when the daemon stopped and no child runs. */
  readonly done: Promise<void>;
  private resolveDone!: () => void;

  constructor(o: DaemonOptions) {
    this.o = o;
    this.log = o.log;
    this.group = o.nodeGroup;
    this.done = new Promise((r) => (this.resolveDone = r));
  }

  async start(): Promise<void> {
    const kube = this.o.clients[0];
    if (this.o.bundleFile) {
      this.source = new FileBundleSource(this.o.bundleFile);
      this.watchFile(this.o.bundleFile);
    }
    if (kube) void this.watchNode(kube);
    if (!this.o.bundleFile && this.group) this.useGroup(this.group);
    this.log.info(
      {
        node: this.o.nodeName,
        group: this.group,
        source: this.source?.description ?? "(waiting for the Node's group)",
      },
      "bashible agent started",
    );
    await this.tick("start");
  }

  stop(): void {
    if (this.abort.signal.aborted) return;
    this.abort.abort();
    clearTimeout(this.timer);
    this.fileWatcher?.close();
    for (const c of this.o.clients) c.close();
    if (this.child) this.child.kill("SIGTERM");
    else this.resolveDone();
  }

  private useGroup(group: string): void {
    this.group = group;
    this.source = new ApiBundleSource(this.o.clients, group);
    this.etag = undefined;
    this.bundleWatchRestart?.();
    const kube = this.o.clients[0];
    if (kube) void this.watchBundle(kube, group);
  }

  private schedule(): void {
    clearTimeout(this.timer);
    if (this.abort.signal.aborted) return;
    this.timer = setTimeout(() => void this.tick("minute tick"), this.o.tickMs);
    const state = {
      pid: process.pid,
      nextTickAt: new Date(Date.now() + this.o.tickMs).toISOString(),
      group: this.group,
    };
    const file = rootPath(this.o.root, PATHS.daemon);
    void mkdir(path.dirname(file), { recursive: true })
      .then(() => writeFile(file, `${JSON.stringify(state)}\n`))
      .catch(() => undefined);
  }

  /** The safety net: one conditional request, then the gate. */
  private async tick(reason: string): Promise<void> {
    try {
      if (this.source) {
        const got = await this.source.fetch(this.etag);
        if (!("notModified" in got)) {
          this.etag = got.etag;
          this.bundleChecksum = checksumOf(got.raw);
        }
      }
      await this.check(reason);
    } catch (err) {
      this.log.warn(`tick: ${(err as Error).message}`);
      // A converge still runs on the last good bundle after a reboot; the child decides.
      if (this.bundleChecksum === undefined) await this.check(`${reason} (fetch failed)`, true);
    } finally {
      this.schedule();
    }
  }

  private async check(reason: string, force = false): Promise<void> {
    const [applied, status, bootId] = await Promise.all([
      readFile(rootPath(this.o.root, PATHS.configurationChecksum), "utf8").then(
        (s) => s.trim() || undefined,
        () => undefined,
      ),
      readFile(rootPath(this.o.root, PATHS.status), "utf8").then(
        (s) => JSON.parse(s) as { appliedBootId?: string },
        () => ({}) as { appliedBootId?: string },
      ),
      readFile(KERNEL_PATHS.bootId, "utf8").then(
        (s) => s.trim(),
        () => "",
      ),
    ]);
    const gate = decide({
      bundleChecksum: this.bundleChecksum ?? applied ?? "",
      bootId,
      appliedChecksum: applied,
      appliedBootId: status.appliedBootId,
      rebootRequested: this.node?.metadata.annotations?.[NODE_KEYS.reboot] !== undefined,
    });
    if (gate.run || force) {
      this.trigger(`${reason}: ${gate.reason}`);
      return;
    }
    const kube = this.o.clients[0];
    if (kube && this.node && applied && this.node.metadata.annotations?.[NODE_KEYS.checksum] !== applied) {
      const { patchNode } = await import("../kube/api.ts");
      await patchNode(kube, this.o.nodeName, { metadata: { annotations: { [NODE_KEYS.checksum]: applied } } }).catch(
        (err) => this.log.warn(`could not re-assert the checksum annotation: ${(err as Error).message}`),
      );
    }
  }

  private trigger(reason: string): void {
    if (this.abort.signal.aborted) return;
    if (this.child) {
      this.rerun = reason;
      return;
    }
    this.log.info({ reason }, "converge due");
    const child = spawn(process.execPath, agentArgv(["once", ...this.o.childArgs]), { stdio: "inherit" });
    this.child = child;
    child.once("exit", (code, signal) => {
      this.child = undefined;
      if (code !== 0) this.log.warn({ code, signal }, "converge did not finish cleanly; the next tick retries");
      if (this.abort.signal.aborted) return this.resolveDone();
      const again = this.rerun;
      this.rerun = undefined;
      if (again) void this.check(again);
    });
  }

  private watchFile(file: string): void {
    // Watch the directory: editors and atomic writers replace the file (new inode).
    let debounce: NodeJS.Timeout | undefined;
    this.fileWatcher = fsWatch(path.dirname(file), (_ev, name) => {
      if (name !== path.basename(file)) return;
      clearTimeout(debounce);
      debounce = setTimeout(() => void this.tick("bundle file changed"), 100);
    });
  }

  /** Follows own Node: the group label, the reboot annotation, the checksum annotation. */
  private async watchNode(kube: KubeClient): Promise<void> {
    let backoff = 1000;
    while (!this.abort.signal.aborted) {
      try {
        for await (const ev of kube.watch<KubeObject>("/api/v1/nodes", {
          fieldSelector: `metadata.name=${this.o.nodeName}`,
          timeoutSeconds: 300,
          signal: this.abort.signal,
        })) {
          backoff = 1000;
          if (ev.type === "BOOKMARK" || ev.type === "DELETED") continue;
          const before = this.node;
          this.node = ev.object;
          const group = ev.object.metadata.labels?.[NODE_KEYS.group];
          if (!this.o.bundleFile && group && group !== this.group && !this.o.nodeGroup) {
            this.log.info({ group }, "node group from the Node's label");
            this.useGroup(group);
            void this.tick("node group known");
          }
          const rebootNow = ev.object.metadata.annotations?.[NODE_KEYS.reboot] !== undefined;
          const rebootBefore = before?.metadata.annotations?.[NODE_KEYS.reboot] !== undefined;
          if (rebootNow && !rebootBefore) void this.check("reboot requested");
        }
      } catch (err) {
        if (this.abort.signal.aborted) return;
        this.log.warn(`Node watch: ${(err as Error).message}; retrying`);
        await sleep(jitter(backoff), this.abort.signal);
        backoff = Math.min(backoff * 2, 30_000);
      }
    }
  }

  /** Follows the bundle: a new checksum starts a converge within moments. */
  private async watchBundle(kube: KubeClient, group: string): Promise<void> {
    const local = new AbortController();
    this.bundleWatchRestart = () => local.abort();
    const signal = AbortSignal.any([this.abort.signal, local.signal]);
    let backoff = 1000;
    let resourceVersion: string | undefined;
    while (!signal.aborted) {
      try {
        for await (const ev of kube.watch<{ checksum?: string; metadata: { resourceVersion?: string } }>(
          `/apis/${API_VERSION}/nodegroupbundles`,
          { fieldSelector: `metadata.name=${group}`, resourceVersion, timeoutSeconds: 300, signal },
        )) {
          backoff = 1000;
          resourceVersion = ev.object.metadata?.resourceVersion ?? resourceVersion;
          if (ev.type !== "ADDED" && ev.type !== "MODIFIED") continue;
          const sum = ev.object.checksum;
          if (sum && sum !== this.bundleChecksum) {
            this.bundleChecksum = sum;
            this.etag = undefined;
            void this.check("bundle changed");
          }
        }
      } catch (err) {
        if (signal.aborted) return;
        if (isGone(err)) resourceVersion = undefined;
        this.log.warn(`bundle watch: ${(err as Error).message}; retrying`);
        await sleep(jitter(backoff), signal);
        backoff = Math.min(backoff * 2, 30_000);
      }
    }
  }
}

function checksumOf(raw: Buffer): string | undefined {
  try {
    return (JSON.parse(raw.toString("utf8")) as { checksum?: string }).checksum;
  } catch {
    return undefined; // not JSON: the converge child rejects it and says why
  }
}
