// npm run bench -- fleet [--nodes 3] [--outage-seconds S]
//
// The fleet's figures, on the parts test/e2e/fleet.test.ts runs (scripts/lib/e2e/fleet.ts: bare
// Debian machines joined concurrently with bootstrap.sh, kube-scheduler, the fencing timings in
// seconds, the FIFO watchdog stand-in, a 3-replica Deployment under a PodDisruptionBudget of 2):
// 1. rollout: a disruptive NodeGroupConfiguration change under Automatic + drainBeforeApproval,
//    maxConcurrent 1: total (change → every node settled at the new checksum) and per node
//    (approved → settled), from a watch of the Nodes;
// 2. self-update: the agent's next release (this checkout stamped `<version>-next`) published in
//    the registry and the cluster's context: publish → every node's resident agent says the new
//    version, the longest time each watchdog was armed without a pet, NodeFenced events (goal 0);
// 3. outage: kube-apiserver stopped for --outage-seconds (default: the controller's threshold +
//    15 s, so the fencing controller's own view of Lease ages is tested too), then started:
//    false fences (agents that stopped petting, watchdog gaps >= 60 s, NodeFenced events, pods
//    freed), goal 0;
// 4. partition: one node's veth down: cut-off → last pet → pods deleted → replacements Ready
//    (goal: within the controller's threshold + 30 s);
// 5. rss: every process of bashible.service on each node after all of it, beside a bare Node 24
//    (the agent's own runtime) started on the first node.
import os from "node:os";
import { parseArgs } from "node:util";
import { EVENTS, NODE_KEYS } from "../../bundles/names.ts";
import { nodeGroup } from "../lib/e2e/cluster.ts";
import {
  agentMetrics,
  AUTOMATIC_WITH_DRAIN,
  disruptiveConfiguration,
  fencingStatus,
  FLEET_CLUSTER,
  fencedEvents,
  FLEET_FENCING,
  type FleetNode,
  fleetNames,
  fleetSettled,
  hasAnnotation,
  isReady,
  joinFleet,
  newChecksum,
  nextAgentRelease,
  nodeRecorder,
  ONE_AT_A_TIME,
  partition,
  podReady,
  podRecorder,
  settled,
  workload,
} from "../lib/e2e/fleet.ts";
import { type KubeNode, startWorld, type World } from "../lib/e2e/world.ts";
import { until } from "../lib/until.ts";
import { loadAverage } from "../lib/proc-stats.ts";
import { hrNow } from "../lib/watchdog.ts";
import { sleep } from "../../lib/sleep.ts";

const { values } = parseArgs({
  options: {
    nodes: { type: "string", default: "3" },
    "outage-seconds": { type: "string" },
  },
});
const N = Math.max(2, Number(values.nodes));
const OUTAGE_S = Number(values["outage-seconds"] ?? FLEET_FENCING.thresholdSeconds + 15);
const s1 = (ms: number) => `${(ms / 1000).toFixed(1)} s`;
const mb = (kb: number) => `${(kb / 1024).toFixed(1)} MB`;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? 0;

let world: World | undefined;
let exitCode = 0;
const load = await loadAverage();
console.log(
  `fleet of ${N}: ${new Date().toISOString()}, ${os.cpus().length} CPUs (${os.cpus()[0]?.model}), load ${load}; fencing threshold ${FLEET_FENCING.thresholdSeconds} s, detection window ${FLEET_FENCING.detectionSeconds} s, kubelet window ${FLEET_FENCING.kubeletSeconds} s`,
);
try {
  world = await startWorld({ log: (l) => console.log(`  ${l}`), cluster: FLEET_CLUSTER });
  const w = world;
  const { cluster } = w;
  await cluster.apply(nodeGroup({}, { disruptions: AUTOMATIC_WITH_DRAIN, update: ONE_AT_A_TIME }));
  await cluster.apply(disruptiveConfiguration("v1"));
  const joinStart = Date.now();
  const fleet = await joinFleet(w, fleetNames(N, "fbench"));
  const names = fleet.map((f) => f.machine.name);
  console.log(
    `\njoin (concurrent): all ${N} Ready ${s1(Date.now() - joinStart)}; bootstrap.sh start → Node Ready ${fleet.map((f) => s1(f.join.readyMs)).join(", ")}`,
  );
  const nodes = await nodeRecorder(w);
  const pods = await podRecorder(w);
  const before = await fleetSettled(cluster, nodes, N, "the fleet settled", 600_000);
  for (const obj of workload()) await cluster.apply(obj);
  await pods.waitFor("3 app pods Ready", (ps) => ps.filter(podReady).length === 3, 300_000);

  // ---------- 1. rollout
  const rollStart = Date.now();
  await cluster.apply(disruptiveConfiguration("v2"));
  const target = await newChecksum(cluster, before);
  await nodes.waitFor("every node settled", (ns) => ns.every((n) => settled(n, target)), 900_000);
  const rollTotal = Date.now() - rollStart;
  const hist = nodes.since(rollStart);
  const per = names.map((name) => {
    const at = (p: (n: KubeNode) => boolean) =>
      hist.find((s) => {
        const n = s.objects.get(name);
        return n !== undefined && p(n);
      })?.at ?? Number.NaN;
    const approved = at((n) => hasAnnotation(n, NODE_KEYS.approved));
    const cordoned = at((n) => n.spec?.unschedulable === true);
    const disruption = at((n) => hasAnnotation(n, NODE_KEYS.disruptionApproved));
    const done = hist.find((s) => {
      const n = s.objects.get(name);
      return n !== undefined && s.at > approved && settled(n, target);
    })?.at;
    return { name, approved, cordoned, disruption, done: done ?? Number.NaN };
  });
  const minReady = Math.min(...pods.since(rollStart).map((s) => [...s.objects.values()].filter(podReady).length));
  console.log(`\nrollout (Automatic, drainBeforeApproval, maxConcurrent 1): ${N} nodes in ${s1(rollTotal)}`);
  for (const p of per.sort((a, b) => a.approved - b.approved))
    console.log(
      `  ${p.name}: approved +${s1(p.approved - rollStart)}, cordoned +${s1(p.cordoned - p.approved)}, drained and disruption approved +${s1(p.disruption - p.approved)}, done +${s1(p.done - p.approved)} (approved → done)`,
    );
  console.log(
    `  per node median ${s1(median(per.map((p) => p.done - p.approved)))}; fewest Ready pods during it ${minReady} (budget 2)`,
  );

  // ---------- 2. self-update
  const running = await Promise.all(fleet.map(agentMetrics));
  const nextVersion = `${running[0]?.version}-next`;
  const next = await nextAgentRelease(w, nextVersion);
  const suFencedBefore = await fencedEvents(cluster, names);
  const suFrom = hrNow();
  const suStart = Date.now();
  await cluster.publishAgent(next);
  const suTarget = await newChecksum(cluster, target);
  await nodes.waitFor("every node at the release", (ns) => ns.every((n) => settled(n, suTarget)), 900_000);
  const suAt = await Promise.all(
    fleet.map(async (f) => {
      await until(
        `${f.machine.name}'s agent on ${nextVersion}`,
        async () => (await agentMetrics(f)).version === nextVersion,
        120_000,
        250,
      );
      return Date.now() - suStart;
    }),
  );
  const suTo = hrNow();
  const suFenced = await fencedEvents(cluster, names);
  console.log(
    `
self-update (the agent's next release published; update approval one node at a time): every node runs ${nextVersion} ${s1(Math.max(...suAt))} after the publish; ${EVENTS.nodeFenced} events ${suFenced - suFencedBefore} (goal 0)`,
  );
  for (const f of fleet) {
    const a = f.watchdog.longestArmedGap(suFrom, suTo);
    console.log(
      `  ${f.machine.name}: armed without a pet at most ${s1(a.gapMs)} (watchdog 60 s); disarmed ${a.disarms} time(s) (maintenance, the old agent's stop); longest pause between pets ${s1(f.watchdog.longestPetGap(suFrom, suTo))}`,
    );
  }

  // ---------- 3. outage
  await pods.waitFor("3 app pods Ready", (ps) => ps.filter(podReady).length === 3, 300_000);
  const podsBefore = new Set(pods.current.map((p) => p.metadata.uid));
  const fencedBefore = await fencedEvents(cluster, names);
  const oFrom = hrNow();
  const stoppedAt = Date.now();
  await cluster.cp.stopApiServer();
  const stoppedPetting = new Set<string>();
  const verdicts = new Map<string, Set<string>>();
  while (Date.now() - stoppedAt < OUTAGE_S * 1000) {
    for (const f of fleet) {
      const s = await fencingStatus(f);
      if (s?.fencing) stoppedPetting.add(f.machine.name);
      if (s?.verdict) verdicts.set(f.machine.name, (verdicts.get(f.machine.name) ?? new Set()).add(s.verdict.kind));
    }
    await sleep(500);
  }
  await cluster.cp.startApiServer();
  const restartedAt = Date.now();
  await until("every node Ready again", () => nodes.current.length === N && nodes.current.every(isReady), 300_000, 250);
  const readyAgain = Date.now();
  // The fencing controller re-lists and would act within a threshold of stale ages: give it that.
  const watchUntil = restartedAt + (FLEET_FENCING.thresholdSeconds + 10) * 1000;
  while (Date.now() < watchUntil) {
    for (const f of fleet) if ((await fencingStatus(f))?.fencing) stoppedPetting.add(f.machine.name);
    await sleep(1000);
  }
  const oTo = hrNow();
  const gaps = fleet.map((f) => f.watchdog.longestPetGap(oFrom, oTo));
  const freed = [...podsBefore].filter((uid) => !pods.current.some((p) => p.metadata.uid === uid)).length;
  const fencedAfter = await fencedEvents(cluster, names);
  const falseFences = stoppedPetting.size + gaps.filter((g) => g >= 60_000).length + (fencedAfter - fencedBefore);
  console.log(
    `\noutage: kube-apiserver down ${s1(restartedAt - stoppedAt)} (etcd up), every node Ready ${s1(readyAgain - restartedAt)} after its restart, watched ${s1(watchUntil - restartedAt)} more`,
  );
  console.log(
    `  false fences ${falseFences} (goal 0): agents that stopped petting ${stoppedPetting.size}, longest pet gaps ${gaps.map(s1).join(", ")} (watchdog 60 s), ${EVENTS.nodeFenced} events ${fencedAfter - fencedBefore}, pods freed ${freed}`,
  );
  console.log(`  verdicts seen: ${[...verdicts].map(([n, v]) => `${n} ${[...v].join("/")}`).join("; ")}`);

  // ---------- 4. partition
  await pods.waitFor("3 app pods Ready", (ps) => ps.filter(podReady).length === 3, 300_000);
  const victim = fleet.find((f) => pods.current.some((p) => p.spec.nodeName === f.machine.name)) as FleetNode;
  const victimPods = new Set(
    pods.current.filter((p) => p.spec.nodeName === victim.machine.name).map((p) => p.metadata.uid),
  );
  const pFrom = hrNow();
  const cutAt = Date.now();
  await partition(victim.machine);
  const lastPetAt = () => victim.watchdog.lastPetAt(pFrom);
  // The agent says it stopped, or its pets stopped without it saying so (a hung check loop).
  const said = await until(
    "the pets to stop",
    async () =>
      ((await fencingStatus(victim))?.fencing && "said so") ||
      (hrNow() - lastPetAt() > 2 * FLEET_FENCING.detectionSeconds * 1000 && "silently"),
    300_000,
    250,
  );
  const lastPet = lastPetAt() - pFrom;
  await pods.waitFor(
    "the cut-off node's pods deleted",
    (ps) => !ps.some((p) => victimPods.has(p.metadata.uid ?? "")),
    (FLEET_FENCING.thresholdSeconds + 180) * 1000,
  );
  const deleted = Date.now() - cutAt;
  await pods.waitFor(
    "3 replacements Ready elsewhere",
    (ps) => {
      const r = ps.filter(podReady);
      return r.length === 3 && r.every((p) => p.spec.nodeName !== victim.machine.name);
    },
    300_000,
  );
  const replaced = Date.now() - cutAt;
  const pTo = hrNow();
  const otherGaps = fleet.filter((f) => f !== victim).map((f) => f.watchdog.longestPetGap(pFrom, pTo));
  console.log(
    `\npartition of ${victim.machine.name} (veth down, ${victimPods.size} app pod(s) on it; the agent stopped petting ${said}):`,
  );
  console.log(
    `  cut-off → last pet ${s1(lastPet)} (detection window ${FLEET_FENCING.detectionSeconds} s) → pods deleted ${s1(deleted)} (threshold ${FLEET_FENCING.thresholdSeconds} s) → replacements Ready ${s1(replaced)} (goal ≤ ${FLEET_FENCING.thresholdSeconds + 30} s)`,
  );
  console.log(`  the other nodes' longest pet gaps ${otherGaps.map(s1).join(", ")}`);

  // ---------- 5. rss
  const first = fleet.find((f) => f !== victim) as FleetNode;
  const bare = first.machine.spawn([
    "/opt/deckhouse/lib/bashible/bashible.d/node",
    "-e",
    "setInterval(() => {}, 1 << 30)",
  ]);
  await sleep(10_000);
  console.log("\nagent RSS after all of it (every process of bashible.service):");
  for (const f of fleet) {
    const r = await f.machine.mustExec([
      "sh",
      "-c",
      `s=0; for p in $(cat /sys/fs/cgroup/systemd/system.slice/bashible.service/cgroup.procs); do
         k=$(awk '/^VmRSS:/ {print $2}' /proc/$p/status); s=$((s + k)); done; echo $s`,
    ]);
    console.log(
      `  ${f.machine.name}${f === victim ? " (cut off, its pets stopped)" : ""}: ${mb(Number(r.stdout.trim()))}`,
    );
  }
  const b = await first.machine.mustExec([
    "sh",
    "-c",
    `awk '/^VmRSS:/ {print $2}' /proc/$(pgrep -f setInterval | head -1)/status`,
  ]);
  console.log(`  bare Node 24 on ${first.machine.name}: ${mb(Number(b.stdout.trim()))}`);
  bare.kill("SIGKILL");
  nodes.stop();
  pods.stop();
  for (const f of fleet) f.watchdog.close();
} catch (err) {
  console.error(`bench fleet: ${(err as Error).stack ?? err}`);
  exitCode = 1;
} finally {
  await world?.stop();
}
process.exit(exitCode);
