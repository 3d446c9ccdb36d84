// The resident agent (`bashible run`). It stays small: it watches the bundle and its own Node,
// checks the gate every minute, and starts a converge as a child process (`bashible once`)
// only when one is due. The converge machinery (steps, diffs, package fetching) lives in the
// child and leaves with it, so the daemon's memory stays close to a bare Node process.
//
// One check at a time: the minute timer, the bundle file watch and the watches can all ask for
// a check; a request during a check is folded into one more check after it.
import { spawn, type ChildProcess } from "node:child_process";
import { watch as fsWatch, type FSWatcher } from "node:fs";
import { mkdir, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import type { Logger } from "../../lib/log/log.ts";
import type { KubeClient } from "../../lib/kube/client.ts";
import type { KubeObject } from "../../lib/kube/api.ts";
import { isForbidden, isUnauthorized, KubeTLSError } from "../../lib/kube/errors.ts";
import { Informer } from "../../lib/informer.ts";
import { API_VERSION } from "../../bundles/types.ts";
import { NODE_KEYS } from "../../bundles/names.ts";
import { PATHS } from "../../bundles/paths.ts";
import type { Host } from "../../host/host.ts";
import { decide } from "../converge/gate.ts";
import { gateInput, readGateState, rebootRequested } from "../converge/gate-inputs.ts";
import { stateHost } from "../converge/state.ts";
import { ApiBundleSource, FileBundleSource, type BundleSource } from "../converge/source.ts";
import { agentArgv } from "../self.ts";
import { EXIT } from "../../lib/cli.ts";

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
  /** Starts a converge child; tests pass a fake. */
  spawnChild?: (argv: string[]) => ChildProcess;
  /** Called with the Node as the watch sees it (fencing and early OOM read it too). */
  onNode?: (node: KubeObject | undefined) => void;
  /** Called when a converge child ended (the applied bundle may have changed). */
  onConvergeEnd?: () => void;
}

/** Files whose change means the node's credentials changed. */
const CREDENTIAL_FILES = [PATHS.kubeletKubeconfig, PATHS.kubeletClientPem, PATHS.bootstrapToken];

const rootPath = (root: string, p: string) => path.join(root, p);

export class Daemon {
  private readonly o: DaemonOptions;
  private readonly log: Logger;
  /** The state files the gate reads, through the same reader as the converge child. */
  private readonly host: Host;
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
  private informers: Informer[] = [];
  private credentialStamp = "";
  private needReconnect = false;
  private ticking: Promise<void> | undefined;
  /** A check asked for while one ran: its reason, and whether it wanted a fetch. */
  private again: { reason: string; fetch: boolean } | undefined;
  /** Completes when the daemon stopped and no child runs. */
  readonly done: Promise<void>;
  private resolveDone!: () => void;

  constructor(o: DaemonOptions) {
    this.o = o;
    this.log = o.log;
    this.host = stateHost(o.root);
    this.group = o.nodeGroup;
    this.clients = o.clients;
    this.done = new Promise((r) => (this.resolveDone = r));
  }

  /** The clients in use now (they are replaced when credentials change). */
  get kube(): KubeClient | undefined {
    return this.clients[0];
  }

  async start(): Promise<void> {
    this.credentialStamp = await this.stampCredentials();
    if (this.o.bundleFile) {
      this.source = new FileBundleSource(this.o.bundleFile);
      this.watchFile(this.o.bundleFile);
    }
    if (!this.o.bundleFile && this.group) this.source = new ApiBundleSource(this.clients, this.group);
    this.startWatches();
    this.log.info(
      {
        node: this.o.nodeName,
        group: this.group,
        source: this.source?.description ?? "(waiting for the Node's group)",
      },
      "bashible agent started",
    );
    this.check("start", true);
    await this.ticking;
  }

  stop(): void {
    if (this.abort.signal.aborted) return;
    this.abort.abort();
    clearTimeout(this.timer);
    this.fileWatcher?.close();
    this.stopWatches();
    for (const c of this.clients) c.close();
    if (this.child) this.child.kill("SIGTERM");
    else void (this.ticking ?? Promise.resolve()).then(() => this.resolveDone());
  }

  private stopWatches(): void {
    for (const i of this.informers) i.stop();
    this.informers = [];
  }

  /** (Re)opens the Node and bundle watches with the current clients and group. */
  private startWatches(): void {
    this.stopWatches();
    const kube = this.clients[0];
    if (!kube || this.abort.signal.aborted) return;
    const nodeInformer: Informer = new Informer({
      client: kube,
      path: "/api/v1/nodes",
      fieldSelector: `metadata.name=${this.o.nodeName}`,
      log: this.log,
      // Only what the daemon and the resident loops read: the Node's status stays out of memory.
      trim: (n) => {
        const taints = (n.spec as { taints?: unknown[] } | undefined)?.taints;
        return {
          metadata: { name: n.metadata.name, labels: n.metadata.labels, annotations: n.metadata.annotations },
          ...(taints ? { spec: { taints } } : {}),
        };
      },
      onEvent: () => this.onNode(nodeInformer.objects.get(this.o.nodeName)),
    });
    nodeInformer.run();
    this.informers.push(nodeInformer);
    if (!this.o.bundleFile && this.group) {
      const group = this.group;
      const bundles: Informer = new Informer({
        client: kube,
        path: `/apis/${API_VERSION}/nodegroupbundles`,
        fieldSelector: `metadata.name=${group}`,
        log: this.log,
        trim: (b) => ({ metadata: { name: b.metadata.name }, checksum: (b as { checksum?: string }).checksum }),
        onEvent: () => {
          const sum = (bundles.objects.get(group) as { checksum?: string } | undefined)?.checksum;
          if (sum && sum !== this.bundleChecksum) {
            this.bundleChecksum = sum;
            this.etag = undefined;
            this.check("bundle changed");
          }
        },
      });
      bundles.run();
      this.informers.push(bundles);
    }
  }

  private onNode(node: KubeObject | undefined): void {
    const before = this.node;
    this.node = node;
    this.o.onNode?.(node);
    if (!node) return;
    const group = node.metadata.labels?.[NODE_KEYS.group];
    if (!this.o.bundleFile && group && group !== this.group && !this.o.nodeGroup) {
      this.log.info({ group }, "node group from the Node's label");
      this.group = group;
      this.source = new ApiBundleSource(this.clients, group);
      this.etag = undefined;
      this.startWatches();
      this.check("node group known", true);
    }
    if (rebootRequested(node) && !rebootRequested(before)) this.check("reboot requested");
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
    let fresh: KubeClient[];
    try {
      fresh = await this.o.reconnect();
    } catch (err) {
      this.log.warn(`cannot reload cluster credentials: ${(err as Error).message}`);
      return;
    }
    if (this.abort.signal.aborted) {
      for (const c of fresh) c.close();
      return;
    }
    const old = this.clients;
    this.clients = fresh;
    this.credentialStamp = stamp;
    this.needReconnect = false;
    if (this.group && !this.o.bundleFile) this.source = new ApiBundleSource(fresh, this.group);
    this.startWatches();
    for (const c of old) c.close();
    this.log.info({ via: fresh.map((c) => c.connection.source) }, "cluster credentials reloaded");
  }

  private schedule(): void {
    clearTimeout(this.timer);
    if (this.abort.signal.aborted) return;
    this.timer = setTimeout(() => this.check("minute tick", true), this.o.tickMs);
    const state = {
      pid: process.pid,
      nextTickAt: new Date(Date.now() + this.o.tickMs).toISOString(),
      group: this.group,
    };
    const file = rootPath(this.o.root, PATHS.daemon);
    void mkdir(path.dirname(file), { recursive: true })
      .then(() => writeFile(file, `${JSON.stringify(state)}\n`))
      .catch((err) => this.log.warn(`cannot write ${PATHS.daemon}: ${(err as Error).message}`));
  }

  /**
   * Asks for a check: the gate, after a conditional fetch when `fetch`. Never two at once; a
   * request during a check runs once after it.
   */
  private check(reason: string, fetch = false): void {
    if (this.abort.signal.aborted) return;
    if (this.ticking) {
      this.again = { reason, fetch: fetch || (this.again?.fetch ?? false) };
      return;
    }
    this.ticking = this.tick(reason, fetch).finally(() => {
      this.ticking = undefined;
      const again = this.again;
      this.again = undefined;
      if (again && !this.abort.signal.aborted) this.check(again.reason, again.fetch);
      else if (this.abort.signal.aborted && !this.child) this.resolveDone();
    });
  }

  /** The safety net: one conditional request, then the gate. */
  private async tick(reason: string, fetch = true): Promise<void> {
    try {
      if (fetch) {
        await this.maybeReconnect();
        if (this.source) {
          const got = await this.source.fetch(this.etag);
          if (!("notModified" in got)) {
            this.etag = got.etag;
            this.bundleChecksum = checksumOf(got.raw);
          }
        }
      }
    } catch (err) {
      // Refused credentials (expired bootstrap token, rotated certificate) are re-read next tick.
      if (err instanceof KubeTLSError || isUnauthorized(err) || isForbidden(err)) this.needReconnect = true;
      this.log.warn(`tick: ${(err as Error).message}`);
    }
    try {
      // Without a fresh bundle the gate still sees a reboot or a removed checksum file.
      await this.checkGate(reason);
    } catch (err) {
      this.log.warn(`check: ${(err as Error).message}`);
    } finally {
      if (fetch) this.schedule();
    }
  }

  private async checkGate(reason: string): Promise<void> {
    // A torn status.json reads as "no applied boot": the gate runs a converge, which sets it aside.
    const state = await readGateState(this.host, { log: this.log });
    const applied = state.appliedChecksum;
    const gate = decide(gateInput(state, this.bundleChecksum ?? applied ?? "", this.node));
    if (gate.run) {
      this.trigger(`${reason}: ${gate.reason}`);
      return;
    }
    const kube = this.clients[0];
    if (!kube || !this.node || !applied) return;
    const metadata: { annotations?: Record<string, string>; labels?: Record<string, string> } = {};
    if (this.node.metadata.annotations?.[NODE_KEYS.checksum] !== applied) {
      metadata.annotations = { [NODE_KEYS.checksum]: applied };
    }
    // A converged node still carrying the taint the kubelet registered with asks the cluster to
    // remove it. The first run says so itself when it can, but a bootstrap's first run holds only
    // the bootstrap token and ends before the kubelet has registered the Node.
    const taints = (this.node.spec as { taints?: { key: string }[] } | undefined)?.taints ?? [];
    if (
      taints.some((t) => t.key === NODE_KEYS.uninitializedTaint) &&
      this.node.metadata.labels?.[NODE_KEYS.firstRunFinished] === undefined
    ) {
      metadata.labels = { [NODE_KEYS.firstRunFinished]: "true" };
    }
    if (!metadata.annotations && !metadata.labels) return;
    const { patchNode } = await import("../../lib/kube/api.ts");
    await patchNode(kube, this.o.nodeName, { metadata }).catch((err) =>
      this.log.warn(`could not re-assert the checksum annotation or the first run's label: ${(err as Error).message}`),
    );
  }

  private trigger(reason: string): void {
    if (this.abort.signal.aborted) return;
    if (this.child) {
      this.rerun = reason;
      return;
    }
    this.log.info({ reason }, "converge due");
    const argv = agentArgv(["once", ...this.o.childArgs]);
    const child = this.o.spawnChild
      ? this.o.spawnChild(argv)
      : spawn(argv[0] as string, argv.slice(1), {
          stdio: "inherit",
          env: { ...process.env, BASHIBLE_DAEMON_PID: String(process.pid) },
        });
    this.child = child;
    child.once("exit", (code, signal) => {
      this.child = undefined;
      this.o.onConvergeEnd?.();
      if (code === EXIT.problems)
        this.log.warn("converge finished; steps reported problems (bashible status lists them)");
      else if (code !== 0) this.log.warn({ code, signal }, "converge did not finish cleanly; the next tick retries");
      if (this.abort.signal.aborted) return this.resolveDone();
      const again = this.rerun;
      this.rerun = undefined;
      if (again) this.check(again);
    });
  }

  private watchFile(file: string): void {
    // Watch the directory: editors and atomic writers replace the file (new inode).
    let debounce: NodeJS.Timeout | undefined;
    this.fileWatcher = fsWatch(path.dirname(file), (_ev, name) => {
      if (name !== path.basename(file)) return;
      clearTimeout(debounce);
      debounce = setTimeout(() => this.check("bundle file changed", true), 100);
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
