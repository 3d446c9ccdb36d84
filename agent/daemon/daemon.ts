// The resident agent (`bashible run`). It stays small: it watches the bundle and its own Node,
// checks the gate every minute, and starts a converge as a child process (`bashible once`)
// only when one is due. The converge machinery (steps, diffs, package fetching) lives in the
// child and leaves with it, so the daemon's memory stays close to a bare Node process.
import { spawn, type ChildProcess } from "node:child_process";
import { watch as fsWatch, type FSWatcher } from "node:fs";
import { mkdir, readFile, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import type { Logger } from "../../lib/log/log.ts";
import { sleep } from "../../lib/sleep.ts";
import type { KubeClient, WatchEvent } from "../../lib/kube/client.ts";
import type { KubeObject } from "../../lib/kube/api.ts";
import { isForbidden, isGone, isUnauthorized, KubeTLSError } from "../../lib/kube/errors.ts";
import { API_VERSION } from "../../bundles/types.ts";
import { readBootId } from "../facts.ts";
import { decide } from "../converge/gate.ts";
import { NODE_KEYS } from "../../bundles/names.ts";
import { PATHS } from "../../bundles/paths.ts";
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
  /** Resolves the credentials again (bootstrap token → kubelet.conf, rotated certificates). */
  reconnect?: () => Promise<KubeClient[]>;
}

/** Files whose change means the node's credentials changed. */
const CREDENTIAL_FILES = [PATHS.kubeletKubeconfig, PATHS.kubeletClientPem, PATHS.bootstrapToken];

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
  private clients: KubeClient[];
  /** Aborted when the clients are replaced, so watches re-open with the new ones. */
  private connection = new AbortController();
  private credentialStamp = "";
  private needReconnect = false;
  private bundleWatching = false;
  /** Completes when the daemon stopped and no child runs. */
  readonly done: Promise<void>;
  private resolveDone!: () => void;

  constructor(o: DaemonOptions) {
    this.o = o;
    this.log = o.log;
    this.group = o.nodeGroup;
    this.clients = o.clients;
    this.done = new Promise((r) => (this.resolveDone = r));
  }

  async start(): Promise<void> {
    this.credentialStamp = await this.stampCredentials();
    if (this.o.bundleFile) {
      this.source = new FileBundleSource(this.o.bundleFile);
      this.watchFile(this.o.bundleFile);
    }
    if (this.clients.length) void this.watchNode();
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
    for (const c of this.clients) c.close();
    if (this.child) this.child.kill("SIGTERM");
    else this.resolveDone();
  }

  private useGroup(group: string): void {
    const moved = this.group !== undefined && this.group !== group;
    this.group = group;
    this.source = new ApiBundleSource(this.clients, group);
    this.etag = undefined;
    if (moved) this.restartWatches();
    if (!this.bundleWatching && this.clients.length) void this.watchBundle();
  }

  private restartWatches(): void {
    this.connection.abort();
    this.connection = new AbortController();
  }

  /** mtimes of the credential files: a change (kubelet.conf appeared, certificate rotated) means reconnect. */
  private async stampCredentials(): Promise<string> {
    const times = await Promise.all(
      CREDENTIAL_FILES.map((f) =>
        stat(rootPath(this.o.root, f)).then(
          (s) => s.mtimeMs,
          () => 0,
        ),
      ),
    );
    return times.join(",");
  }

  /** Replaces the clients when the credentials changed or were refused; watches re-open. */
  private async maybeReconnect(): Promise<void> {
    if (!this.o.reconnect) return;
    const stamp = await this.stampCredentials();
    if (stamp === this.credentialStamp && !this.needReconnect) return;
    try {
      const fresh = await this.o.reconnect();
      for (const c of this.clients) c.close();
      this.clients = fresh;
      this.credentialStamp = stamp;
      this.needReconnect = false;
      if (this.group && !this.o.bundleFile) this.source = new ApiBundleSource(fresh, this.group);
      this.restartWatches();
      this.log.info({ via: fresh.map((c) => c.connection.source) }, "cluster credentials reloaded");
    } catch (err) {
      this.log.warn(`cannot reload cluster credentials: ${(err as Error).message}`);
    }
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
      await this.maybeReconnect();
      if (this.source) {
        const got = await this.source.fetch(this.etag);
        if (!("notModified" in got)) {
          this.etag = got.etag;
          this.bundleChecksum = checksumOf(got.raw);
        }
      }
    } catch (err) {
      // Refused credentials (expired bootstrap token, rotated certificate) are re-read next tick.
      if (err instanceof KubeTLSError || isUnauthorized(err) || isForbidden(err)) this.needReconnect = true;
      this.log.warn(`tick: ${(err as Error).message}`);
    }
    try {
      // Without a fresh bundle the gate still sees a reboot or a removed checksum file.
      await this.check(reason);
    } finally {
      this.schedule();
    }
  }

  private async check(reason: string): Promise<void> {
    try {
      await this.checkGate(reason);
    } catch (err) {
      this.log.warn(`check: ${(err as Error).message}`);
    }
  }

  private async checkGate(reason: string): Promise<void> {
    const [applied, appliedBootId, bootId] = await Promise.all([
      readFile(rootPath(this.o.root, PATHS.configurationChecksum), "utf8").then(
        (s) => s.trim() || undefined,
        () => undefined,
      ),
      // A missing or torn status.json means "no applied boot": the gate then runs a converge,
      // which rewrites it.
      readFile(rootPath(this.o.root, PATHS.status), "utf8")
        .then((s) => (JSON.parse(s) as { appliedBootId?: string }).appliedBootId)
        .catch(() => undefined),
      readBootId(),
    ]);
    const gate = decide({
      bundleChecksum: this.bundleChecksum ?? applied ?? "",
      bootId,
      appliedChecksum: applied,
      appliedBootId,
      rebootRequested: this.node?.metadata.annotations?.[NODE_KEYS.reboot] !== undefined,
    });
    if (gate.run) {
      this.trigger(`${reason}: ${gate.reason}`);
      return;
    }
    const kube = this.clients[0];
    if (kube && this.node && applied && this.node.metadata.annotations?.[NODE_KEYS.checksum] !== applied) {
      const { patchNode } = await import("../../lib/kube/api.ts");
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

  /**
   * Keeps a watch open with the current clients: re-opens it when the server ends it, after a
   * failure (jittered backoff), and at once when the clients are replaced.
   */
  private async follow<T>(
    what: string,
    target: () => { path: string; fieldSelector: string } | undefined,
    onEvent: (ev: WatchEvent<T>) => void,
  ): Promise<void> {
    let backoff = 1000;
    let resourceVersion: string | undefined;
    while (!this.abort.signal.aborted) {
      const kube = this.clients[0];
      const t = target();
      if (!kube || !t) return;
      const signal = AbortSignal.any([this.abort.signal, this.connection.signal]);
      try {
        for await (const ev of kube.watch<T>(t.path, { ...t, resourceVersion, timeoutSeconds: 300, signal })) {
          backoff = 1000;
          resourceVersion = (ev.object as { metadata?: { resourceVersion?: string } }).metadata?.resourceVersion;
          onEvent(ev);
        }
      } catch (err) {
        if (isGone(err)) resourceVersion = undefined;
        if (signal.aborted) continue;
        this.log.warn(`${what} watch: ${(err as Error).message}; retrying`);
        await sleep(jitter(backoff), signal);
        backoff = Math.min(backoff * 2, 30_000);
      }
      if (this.connection.signal.aborted || signal.aborted) resourceVersion = undefined;
    }
  }

  /** Follows own Node: the group label and the reboot annotation. */
  private watchNode(): Promise<void> {
    return this.follow<KubeObject>(
      "Node",
      () => ({ path: "/api/v1/nodes", fieldSelector: `metadata.name=${this.o.nodeName}` }),
      (ev) => {
        if (ev.type === "BOOKMARK" || ev.type === "DELETED") return;
        const before = this.node;
        // Only what the daemon reads: the Node's status (images, conditions) stays out of memory.
        this.node = {
          metadata: {
            name: ev.object.metadata.name,
            labels: ev.object.metadata.labels,
            annotations: ev.object.metadata.annotations,
          },
        };
        const group = ev.object.metadata.labels?.[NODE_KEYS.group];
        if (!this.o.bundleFile && group && group !== this.group && !this.o.nodeGroup) {
          this.log.info({ group }, "node group from the Node's label");
          this.useGroup(group);
          void this.tick("node group known");
        }
        const rebootNow = ev.object.metadata.annotations?.[NODE_KEYS.reboot] !== undefined;
        const rebootBefore = before?.metadata.annotations?.[NODE_KEYS.reboot] !== undefined;
        if (rebootNow && !rebootBefore) void this.check("reboot requested");
      },
    );
  }

  /** Follows the bundle: a new checksum starts a converge within moments. */
  private watchBundle(): Promise<void> {
    this.bundleWatching = true;
    return this.follow<{ checksum?: string }>(
      "bundle",
      () =>
        this.group
          ? { path: `/apis/${API_VERSION}/nodegroupbundles`, fieldSelector: `metadata.name=${this.group}` }
          : undefined,
      (ev) => {
        if (ev.type !== "ADDED" && ev.type !== "MODIFIED") return;
        const sum = ev.object.checksum;
        if (sum && sum !== this.bundleChecksum) {
          this.bundleChecksum = sum;
          this.etag = undefined;
          void this.check("bundle changed");
        }
      },
    ).finally(() => {
      this.bundleWatching = false;
    });
  }
}

function checksumOf(raw: Buffer): string | undefined {
  try {
    return (JSON.parse(raw.toString("utf8")) as { checksum?: string }).checksum;
  } catch {
    return undefined; // not JSON: the converge child rejects it and says why
  }
}
