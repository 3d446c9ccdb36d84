// A fleet: several bare machines of group `worker` joined with bootstrap.sh (scripts/lib/e2e/world.ts),
// booted and joined concurrently, with what a fleet needs beyond one node:
//   - the machines reach each other (fencing peers ask each other on <InternalIP>:4227): the
//     host forwards between the fleet's veths only (net.ipv4.conf.<veth>.forwarding; the host's
//     own ip_forward stays off, so nothing reaches anything else);
//   - fencing timings short enough for a test (FLEET_FENCING: seconds, not minutes), given to
//     each agent by a systemd drop-in as an operator tunes a flag, and the matching numbers to
//     the fencing controller (FLEET_SERVER_ARGS);
//   - the stand-in watchdog (a FIFO at /dev/watchdog, scripts/lib/watchdog.ts) on every machine;
//   - the workload images imported into each node's containerd;
//   - recorders: a watch of the group's Nodes and of one app's Pods keeping every state they
//     passed through, so a test asserts on what happened between two moments, not only at them;
//   - a disruptive NodeGroupConfiguration (Deckhouse's way for a custom step to ask:
//     bb-deckhouse-get-disruptive-update-approval), and a Deployment + PodDisruptionBudget.
import { execFile } from "node:child_process";
import { readFile, writeFile } from "node:fs/promises";
import { promisify } from "node:util";
import path from "node:path";
import { pino } from "pino";
import { EVENTS, NODE_KEYS } from "../../../bundles/names.ts";
import {
  DEFAULT_AGENT_TIMINGS,
  DEFAULT_WATCHDOG_TIMEOUT_SECONDS,
  detectionWindowMs,
  kubeletWindowMs,
} from "../../../bundles/fencing.ts";
import { parseTimings } from "../../../agent/fencing/options.ts";
import { type FencingStatus, readSavedStatus } from "../../../agent/fencing/status-file.ts";
import { Informer, type InformerEvent } from "../../../lib/informer.ts";
import type { KubeObject } from "../../../lib/kube/api.ts";
import type { NspawnNode } from "../nspawn-node.ts";
import { until } from "../until.ts";
import { FakeWatchdog } from "../watchdog.ts";
import { buildDist } from "../../build.ts";
import { agentPackage, type BuiltPackage } from "../../package.ts";
import { type E2eCluster, GROUP } from "./cluster.ts";
import { BUSYBOX_IMAGE } from "./images.ts";
import { importImages, isReady, type Join, joinMachine, type KubeNode, type World } from "./world.ts";

const execFileP = promisify(execFile);

/**
 * The agents' fencing timings (`bashible run --fencing-timings`): a check a second, three bad
 * rounds, the kubelet rule at 15 s (the kubelet renews its Lease every 10 s). Detection window
 * 1 + 3 × max(1, 2 + 1) = 10 s, kubelet window 15 + 3 × 2 = 21 s.
 */
export const FLEET_AGENT_TIMINGS = "pet=0.5,check=1,api=2,peer=1,rounds=3,kubelet=15";
const agentTimings = { ...DEFAULT_AGENT_TIMINGS, ...parseTimings(FLEET_AGENT_TIMINGS) };

export const FLEET_FENCING = (() => {
  const detectionSeconds = Math.ceil(detectionWindowMs(agentTimings) / 1000);
  const kubeletSeconds = Math.ceil((kubeletWindowMs(agentTimings) ?? 0) / 1000);
  const marginSeconds = 5;
  // The nodes' watchdog timeout stays softdog's 60 s (what the agent states on its Node): the
  // smallest threshold the controller accepts is 60 + the longer window + the margin, plus one.
  const thresholdSeconds =
    DEFAULT_WATCHDOG_TIMEOUT_SECONDS + Math.max(detectionSeconds, kubeletSeconds) + marginSeconds + 1;
  return {
    detectionSeconds,
    kubeletSeconds,
    marginSeconds,
    thresholdSeconds,
    petIntervalMs: agentTimings.petIntervalMs,
  };
})();

/** `bashible server` flags matching the agents' timings. */
export const FLEET_SERVER_ARGS = [
  "--fencing-threshold",
  String(FLEET_FENCING.thresholdSeconds),
  "--fencing-detection-window",
  String(FLEET_FENCING.detectionSeconds),
  "--fencing-kubelet-window",
  String(FLEET_FENCING.kubeletSeconds),
  "--fencing-margin",
  String(FLEET_FENCING.marginSeconds),
];

/** What startWorld needs for a fleet: kube-scheduler (Deployments) and the fencing flags. */
export const FLEET_CLUSTER = { scheduler: true, serverArgs: FLEET_SERVER_ARGS };

const DROP_IN_DIR = "/etc/systemd/system/bashible.service.d";
/**
 * The operator's drop-in: the agent unit's ExecStart with the fleet's fencing timings, and
 * peers counted from the start (the fleet's Nodes are minutes old; by default a Node counts as
 * a peer once it is 10 minutes old, so a freshly made member cannot vouch for anyone).
 */
export const FENCING_DROP_IN = `# e2e fleet: fencing in seconds rather than minutes (docs/testing.md)
[Service]
ExecStart=
ExecStart=/opt/deckhouse/lib/bashible/bashible run --fencing-timings ${FLEET_AGENT_TIMINGS} --fencing-peer-min-age 0
`;

export interface FleetNode {
  machine: NspawnNode;
  /** The FIFO at the machine's /dev/watchdog: every pet the agent writes. */
  watchdog: FakeWatchdog;
  join: Join;
}

/** The rollout both the test and the bench start with: one node at a time, drained first. */
export const AUTOMATIC_WITH_DRAIN = { approvalMode: "Automatic", automatic: { drainBeforeApproval: true } };
export const ONE_AT_A_TIME = { maxConcurrent: 1 };

/** The agent's /run/bashible/fencing.json on the machine (undefined before its first write). */
export const fencingStatus = async (f: FleetNode): Promise<FencingStatus | undefined> =>
  (await readSavedStatus(`/proc/${f.machine.pid}/root`)).status;

/** The Events of `reason` on the Node. */
export async function nodeEvents(
  cluster: E2eCluster,
  node: string,
  reason: string,
): Promise<{ message: string; metadata: { creationTimestamp: string } }[]> {
  const selector = encodeURIComponent(`involvedObject.name=${node},reason=${reason}`);
  return (
    await cluster.cp.admin.request<{ items: { message: string; metadata: { creationTimestamp: string } }[] }>(
      "GET",
      `/api/v1/events?fieldSelector=${selector}`,
    )
  ).items;
}

/** How many NodeFenced Events the nodes have: a false fence shows as this count growing. */
export async function fencedEvents(cluster: E2eCluster, nodes: string[]): Promise<number> {
  const each = await Promise.all(nodes.map((n) => nodeEvents(cluster, n, EVENTS.nodeFenced)));
  return each.reduce((sum, e) => sum + e.length, 0);
}

/**
 * The next release of the agent, as a new version in the registry would be: this checkout built
 * again with `version` stamped (what `bashible version` and `bashible_agent_info` say), packaged.
 */
export async function nextAgentRelease(world: World, version: string): Promise<BuiltPackage> {
  const dist = path.join(world.work, `dist-${version}`);
  await buildDist(dist, { version });
  return agentPackage(dist, path.join(world.work, `packages-${version}`), version);
}

/** What the machine's resident agent says right now: its version, and its pressure samples so far. */
export async function agentMetrics(
  f: FleetNode,
): Promise<{ version: string | undefined; samples: number | undefined; pid: number }> {
  const r = await f.machine.mustExec([
    "sh",
    "-c",
    "systemctl show -p MainPID --value bashible.service; curl -sf --max-time 5 http://127.0.0.1:9650/metrics",
  ]);
  const [pid = "0", ...rest] = r.stdout.split("\n");
  const text = rest.join("\n");
  const samples = /^bashible_early_oom_samples_total (\d+)$/m.exec(text)?.[1];
  return {
    pid: Number(pid),
    version: /^bashible_agent_info\{version="([^"]+)"\} 1$/m.exec(text)?.[1],
    samples: samples === undefined ? undefined : Number(samples),
  };
}

/** The group's checksum, once it is no longer `before` (after a change to what it renders). */
export const newChecksum = (cluster: E2eCluster, before: string | undefined): Promise<string> =>
  until(
    "the new checksum",
    async () => {
      const c = await cluster.groupChecksum();
      return c !== before && c;
    },
    60_000,
  );

/** Every one of the `size` nodes Ready at the group's checksum with nothing pending; resolves with that checksum. */
export const fleetSettled = (
  cluster: E2eCluster,
  nodes: NodeRecorder,
  size: number,
  what: string,
  timeoutMs: number,
): Promise<string> =>
  until(
    what,
    async () => {
      const c = await cluster.groupChecksum();
      const ns = nodes.current;
      return c && ns.length === size && ns.every((n) => isReady(n) && settled(n, c)) && c;
    },
    timeoutMs,
    250,
  );

/** The fleet's machine names: unique per run (network namespaces and machines are host-wide). */
export function fleetNames(n: number, prefix = "fleet"): string[] {
  const tag = Math.random().toString(16).slice(2, 6);
  return Array.from({ length: n }, (_, i) => `${prefix}-${tag}-${i + 1}`);
}

/**
 * Boots the machines and joins them, all at once: each gets the fencing drop-in and its
 * watchdog stand-in before bootstrap.sh runs, then the workload images. Throws naming the
 * machine whose join failed, with the end of its bootstrap output.
 */
export async function joinFleet(world: World, names: string[]): Promise<FleetNode[]> {
  const script = await world.cluster.bootstrapScript();
  const watchdogs: FakeWatchdog[] = [];
  try {
    return await Promise.all(
      names.map(async (name) => {
        const machine = await world.machine(name);
        await writeFile(`/proc/sys/net/ipv4/conf/${machine.hostInterface}/forwarding`, "1");
        await machine.mustExec(["mkdir", "-p", DROP_IN_DIR]);
        await machine.writeFile(`${DROP_IN_DIR}/50-e2e-fencing-timings.conf`, FENCING_DROP_IN, 0o644);
        const watchdog = new FakeWatchdog(`/proc/${machine.pid}/root/dev/watchdog`);
        watchdogs.push(watchdog);
        // Three bootstraps at once on a loaded 2-core machine take minutes, not seconds.
        const join = await joinMachine(world.cluster, machine, script, { readyTimeoutMs: 15 * 60_000 });
        if (join.run.exitCode !== 0 || !join.node)
          throw new Error(
            `${name}: bootstrap.sh ${join.run.exitCode === 0 ? "succeeded but the Node never became Ready" : `exited ${join.run.exitCode}`}:\n${join.run.output.slice(-3000)}\n${await aggregatorState(world)}`,
          );
        await importImages(world, machine);
        return { machine, watchdog, join };
      }),
    );
  } catch (err) {
    for (const w of watchdogs) w.close();
    throw err;
  }
}

/** The bundle server's APIService as the aggregator sees it, and what kube-apiserver logged about it. */
async function aggregatorState(world: World): Promise<string> {
  const svc = await world.cluster.cp.kubectl(["get", "apiservices", "-o", "wide"]).catch((e) => String(e));
  const log = await readFile(path.join(world.cluster.cp.dir, "kube-apiserver.log"), "utf8").catch(() => "");
  const lines = log.split("\n").filter((l) => /bashible|aggregat|503/i.test(l));
  return `APIServices:\n${svc}\nkube-apiserver on the aggregated API:\n${lines.slice(-30).join("\n")}`;
}

/** Cuts the machine off (its veth's host side down): no API, no peers, both ways. */
export async function partition(node: NspawnNode): Promise<void> {
  await execFileP("ip", ["link", "set", node.hostInterface, "down"]);
}

/** Ends the partition (the address and its route come back with the link). */
export async function heal(node: NspawnNode): Promise<void> {
  await execFileP("ip", ["link", "set", node.hostInterface, "up"]);
  await writeFile(`/proc/sys/net/ipv4/conf/${node.hostInterface}/forwarding`, "1");
}

// ---- recorders ------------------------------------------------------------------------------

export interface Snapshot<T> {
  /** Date.now() when the watch delivered it. */
  at: number;
  objects: Map<string, T>;
}

/** A watch that keeps every state of its collection it saw, in order. */
export class Recorder<T extends KubeObject> {
  readonly history: Snapshot<T>[] = [];
  private readonly informer: Informer<T>;
  private readonly listeners = new Set<() => void>();

  constructor(world: World, collection: string, labelSelector?: string) {
    this.informer = new Informer<T>({
      client: world.cluster.cp.admin,
      path: collection,
      ...(labelSelector ? { labelSelector } : {}),
      log: pino({ level: "silent" }),
      onEvent: (ev: InformerEvent<T>) => this.record(ev),
    });
  }

  async start(): Promise<this> {
    await this.informer.start();
    this.record({ type: "SYNC" });
    return this;
  }

  private record(_ev: InformerEvent<T>): void {
    this.history.push({ at: Date.now(), objects: new Map(this.informer.objects) });
    for (const l of [...this.listeners]) l();
  }

  get current(): T[] {
    return [...this.informer.objects.values()];
  }

  /** The states from `since` on (the one current at `since` first). */
  since(since: number): Snapshot<T>[] {
    const i = this.history.findLastIndex((s) => s.at <= since);
    return this.history.slice(Math.max(0, i));
  }

  /** Resolves with the first state, from now on, that satisfies `pred` (the current one included). */
  waitFor<R>(what: string, pred: (objects: T[]) => R | undefined | false, timeoutMs: number): Promise<R> {
    return new Promise((resolve, reject) => {
      const check = () => {
        let r: R | undefined | false;
        try {
          r = pred(this.current);
        } catch (err) {
          done();
          reject(err);
          return;
        }
        if (r !== undefined && r !== false) {
          done();
          resolve(r);
        }
      };
      const timer = setTimeout(() => {
        done();
        reject(new Error(`timed out after ${timeoutMs / 1000} s waiting for ${what}`));
      }, timeoutMs);
      const done = () => {
        clearTimeout(timer);
        this.listeners.delete(check);
      };
      this.listeners.add(check);
      check();
    });
  }

  stop(): void {
    this.informer.stop();
  }
}

export type NodeRecorder = Recorder<KubeNode & KubeObject>;

export const nodeRecorder = (world: World): Promise<NodeRecorder> =>
  new Recorder<KubeNode & KubeObject>(world, "/api/v1/nodes", `${NODE_KEYS.group}=${GROUP}`).start();

/** The node is out of service for its update: cordoned or draining, or its disruption approved. */
export function disrupted(n: KubeNode): boolean {
  const a = n.metadata.annotations ?? {};
  return (
    n.spec?.unschedulable === true ||
    NODE_KEYS.draining in a ||
    NODE_KEYS.drained in a ||
    NODE_KEYS.disruptionApproved in a
  );
}

export const checksumOf = (n: KubeNode) => n.metadata.annotations?.[NODE_KEYS.checksum];
export const hasAnnotation = (n: KubeNode, key: string) => key in (n.metadata.annotations ?? {});
/** At the new checksum with no update annotation left: the controller is done with it. */
export const settled = (n: KubeNode, checksum: string) =>
  checksumOf(n) === checksum &&
  n.spec?.unschedulable !== true &&
  ![
    NODE_KEYS.waitingForApproval,
    NODE_KEYS.approved,
    NODE_KEYS.disruptionRequired,
    NODE_KEYS.disruptionApproved,
    NODE_KEYS.draining,
    NODE_KEYS.drained,
  ].some((k) => hasAnnotation(n, k));

export { isReady };

// ---- the workload ---------------------------------------------------------------------------

export const APP = "fleet-app";

export interface PodObject extends KubeObject {
  spec: { nodeName?: string };
  status?: { phase?: string; conditions?: { type: string; status: string }[] };
}

export const podReady = (p: PodObject) =>
  !p.metadata.deletionTimestamp &&
  p.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True") === true;

export const podRecorder = (world: World): Promise<Recorder<PodObject>> =>
  new Recorder<PodObject>(world, "/api/v1/namespaces/default/pods", `app=${APP}`).start();

/**
 * Three busybox replicas spread over the nodes when they can be (preferred anti-affinity: a
 * drained node's pod may share a node until the drained one is back), and a budget of two.
 */
export function workload(replicas = 3, minAvailable = 2): unknown[] {
  return [
    {
      apiVersion: "apps/v1",
      kind: "Deployment",
      metadata: { name: APP, namespace: "default" },
      spec: {
        replicas,
        selector: { matchLabels: { app: APP } },
        template: {
          metadata: { labels: { app: APP } },
          spec: {
            terminationGracePeriodSeconds: 1,
            affinity: {
              podAntiAffinity: {
                preferredDuringSchedulingIgnoredDuringExecution: [
                  {
                    weight: 100,
                    podAffinityTerm: {
                      labelSelector: { matchLabels: { app: APP } },
                      topologyKey: "kubernetes.io/hostname",
                    },
                  },
                ],
              },
            },
            containers: [
              {
                name: "app",
                image: BUSYBOX_IMAGE,
                imagePullPolicy: "Never",
                command: ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"],
                readinessProbe: { exec: { command: ["true"] }, periodSeconds: 2 },
              },
            ],
          },
        },
      },
    },
    {
      apiVersion: "policy/v1",
      kind: "PodDisruptionBudget",
      metadata: { name: APP, namespace: "default" },
      spec: { minAvailable, selector: { matchLabels: { app: APP } } },
    },
  ];
}

/** The marker file the disruptive step writes once it was allowed to. */
export const DISRUPTIVE_MARKER = "/var/lib/e2e-fleet/disruptive-version";

/**
 * A NodeGroupConfiguration that needs a disruption whenever its version changes: it asks with
 * bb-deckhouse-get-disruptive-update-approval (skipped on a node's first run, as in Deckhouse)
 * and only then "disrupts" (records the version). A run with the version already in place asks
 * nothing, as a well-written step does.
 */
export function disruptiveConfiguration(version: string): unknown {
  return {
    apiVersion: "deckhouse.io/v1alpha1",
    kind: "NodeGroupConfiguration",
    metadata: { name: "e2e-fleet-disruptive" },
    spec: {
      weight: 50,
      nodeGroups: [GROUP],
      bundles: ["*"],
      content: `# A disruptive change (a kernel or runtime upgrade, in a real cluster): version ${version}.
if [ "$(cat ${DISRUPTIVE_MARKER} 2>/dev/null)" != "${version}" ]; then
  bb-deckhouse-get-disruptive-update-approval
  mkdir -p ${path.dirname(DISRUPTIVE_MARKER)}
  echo "${version}" >${DISRUPTIVE_MARKER}
fi
`,
    },
  };
}
