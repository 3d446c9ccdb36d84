// A fleet on real parts (issue 26): three bare Debian machines of one Static group join a real
// control plane through bootstrap.sh, concurrently (scripts/lib/e2e/world.ts, as join.test.ts
// joins one), and carry a three-replica Deployment under a PodDisruptionBudget of two, placed by
// a real kube-scheduler. Then what a platform team checks before it trusts the agent:
//   1. a disruptive update under Automatic with drainBeforeApproval: one node at a time, only
//      while the whole group is Ready, each drained through the Eviction API with the budget
//      held (seen from watches of the Nodes, the Pods and the Deployment, every state they went
//      through); then under Manual: nothing moves until the approval annotation, and only the
//      node that got it; in the middle of the Automatic rollout the agent's next release is
//      published (a new package in the registry, pinned by the cluster's context): every node
//      updates itself and restarts into it, fencing never goes a watchdog timeout without a pet,
//      early OOM samples on in the new process, nothing is fenced;
//   2. a control-plane outage (kube-apiserver stopped, etcd running) with fencing in Watchdog
//      mode on every node: no node stops petting, no pod is freed, everything resumes;
//   3. one node cut off (its veth down): its pets stop, the fencing controller frees its pods,
//      the Deployment's replacements run on the others, which keep petting throughout.
// Fencing runs with timings in seconds (FLEET_FENCING, scripts/lib/e2e/fleet.ts: the agents by a
// systemd drop-in, the controller by its flags); the watchdog is the FIFO stand-in join.test.ts
// uses. What the containers cannot show is in docs/testing.md.
import t from "tap";
import { readFile } from "node:fs/promises";
import { EVENTS, NODE_KEYS } from "../../bundles/names.ts";
import { nodeGroup } from "../../scripts/lib/e2e/cluster.ts";
import {
  agentMetrics,
  fencedEvents,
  APP,
  AUTOMATIC_WITH_DRAIN,
  checksumOf,
  DISRUPTIVE_MARKER,
  disrupted,
  disruptiveConfiguration,
  FLEET_CLUSTER,
  FLEET_FENCING,
  type FleetNode,
  fencingStatus,
  fleetNames,
  fleetSettled as settledAt,
  hasAnnotation,
  isReady,
  joinFleet,
  newChecksum,
  nextAgentRelease,
  nodeEvents as eventsOf,
  nodeRecorder,
  ONE_AT_A_TIME as UPDATE,
  partition,
  podReady,
  podRecorder,
  Recorder,
  settled,
  workload,
} from "../../scripts/lib/e2e/fleet.ts";
import type { KubeObject } from "../../lib/kube/api.ts";
import { startWorld, type World, worldSkip } from "../../scripts/lib/e2e/world.ts";
import { hrNow } from "../../scripts/lib/watchdog.ts";
import { until } from "../../scripts/lib/until.ts";

const skip = worldSkip();

// Every wait below is bounded by its own \`until\`; the file's timeout is only the net under them:
// three bare machines joining at once take 2–5 minutes on a loaded 2-core CI machine.
t.setTimeout(30 * 60_000);

interface DeploymentObject extends KubeObject {
  status?: { availableReplicas?: number; readyReplicas?: number };
}

t.test(
  "a fleet of three nodes: rolling disruptive update, outage, partition",
  { skip, timeout: 20 * 60_000 },
  async (t) => {
    const world: World = await startWorld({
      log: (l) => t.comment(l),
      keepWork: () => process.env.BASHIBLE_E2E_KEEP === "1" || !t.passing(),
      cluster: FLEET_CLUSTER,
    });
    t.teardown(() => world.stop());
    const { cluster } = world;
    const { cp } = cluster;
    const admin = cp.admin;

    // The group as the scenario needs it, and the disruptive step at version 1 before anyone
    // joins: a node's first run applies it without asking (as Deckhouse's bootstrap does).
    await cluster.apply(nodeGroup({}, { disruptions: AUTOMATIC_WITH_DRAIN, update: UPDATE }));
    await cluster.apply(disruptiveConfiguration("v1"));

    const joinStarted = Date.now();
    const fleet: FleetNode[] = await joinFleet(world, fleetNames(3));
    t.teardown(() => {
      for (const f of fleet) f.watchdog.close();
    });
    const names = fleet.map((f) => f.machine.name);
    t.comment(
      `joined concurrently in ${((Date.now() - joinStarted) / 1000).toFixed(1)} s: ${fleet.map((f) => `${f.machine.name} Ready ${(f.join.readyMs / 1000).toFixed(1)} s`).join(", ")}`,
    );
    t.teardown(async () => {
      if (t.passing()) return;
      const tail = async (f: string, n = 6000) => (await readFile(f, "utf8").catch(() => "")).slice(-n);
      t.comment(`work dir kept: ${world.work}`);
      t.comment(`bashible-server log:\n${await tail(cluster.serverLog)}`);
      for (const f of fleet) {
        const j = await f.machine.exec(["journalctl", "-q", "--no-pager", "-n", "60", "-u", "bashible"]);
        t.comment(`${f.machine.name} journal:\n${j.stdout.slice(-5000)}`);
      }
    });

    const nodes = await nodeRecorder(world);
    t.teardown(() => nodes.stop());
    const pods = await podRecorder(world);
    t.teardown(() => pods.stop());
    const deployments = await new Recorder<DeploymentObject>(
      world,
      "/apis/apps/v1/namespaces/default/deployments",
    ).start();
    t.teardown(() => deployments.stop());
    const nodeEvents = (node: string, reason: string) => eventsOf(cluster, node, reason);
    /** Every node at the group's checksum with nothing pending; returns that checksum. */
    const fleetSettled = (what: string, timeoutMs = 300_000) =>
      settledAt(cluster, nodes, names.length, what, timeoutMs);

    await t.test("three nodes join, initialized, fenced by watchdog, running the workload", async (t) => {
      const c = await fleetSettled("the three nodes Ready at the group's checksum");
      t.pass(`all three at ${c.slice(0, 12)}`);
      await nodes.waitFor(
        "the uninitialized taint gone and the fencing label on every node",
        (ns) =>
          ns.every(
            (n) =>
              !n.spec?.taints?.some((x) => x.key === NODE_KEYS.uninitializedTaint) &&
              n.metadata.labels?.[NODE_KEYS.fencingEnabled] !== undefined,
          ),
        120_000,
      );
      t.pass("initialized and labelled for fencing");
      await Promise.all(fleet.map((f) => f.watchdog.nextPets(4, 60_000)));
      t.pass("every agent pets its watchdog");
      for (const f of fleet) {
        const s = await until(`${f.machine.name}'s fencing status`, () => fencingStatus(f), 30_000);
        t.equal(
          s.detectionWindowMs,
          FLEET_FENCING.detectionSeconds * 1000,
          `${f.machine.name} runs the fleet's timings`,
        );
        t.ok(s.peersKnown >= 2, `${f.machine.name} knows its two peers`);
      }
      for (const obj of workload()) await cluster.apply(obj);
      const ready = await pods.waitFor(
        "three app pods Ready",
        (ps) => {
          const r = ps.filter(podReady);
          return r.length === 3 && r;
        },
        180_000,
      );
      t.equal(new Set(ready.map((p) => p.spec.nodeName)).size, 3, "kube-scheduler spread them over the three nodes");
      await deployments.waitFor(
        "the Deployment available",
        (ds) => ds.find((d) => d.metadata.name === APP)?.status?.availableReplicas === 3,
        60_000,
      );
      t.pass("the Deployment has 3 available replicas");
    });

    const perNode: Record<string, number> = {};
    await t.test("Automatic with drainBeforeApproval: one node at a time, the budget held", async (t) => {
      // The agent's next release, published once the rollout is under way (scenario 6): the
      // nodes update themselves in the middle of it.
      const running = await Promise.all(fleet.map(agentMetrics));
      const nextVersion = `${running[0]?.version}-next`;
      const next = await nextAgentRelease(world, nextVersion);
      const before = await fleetSettled("the fleet settled");
      const startedAt = Date.now();
      const from = hrNow();
      const fencedBefore = await fencedEvents(cluster, names);
      await cluster.apply(disruptiveConfiguration("v2"));
      const disruptive = await newChecksum(cluster, before);
      const first = await nodes.waitFor(
        "the rollout under way: a node approved",
        (ns) => ns.find((n) => hasAnnotation(n, NODE_KEYS.approved)),
        180_000,
      );
      const digest = await cluster.publishAgent(next);
      const target = await newChecksum(cluster, disruptive);
      t.comment(
        `${nextVersion} (${digest.slice(0, 19)}) published while ${first.metadata.name} was approved; the group's checksum moved on to ${target.slice(0, 12)}`,
      );
      await nodes.waitFor(
        "every node settled at the new checksum",
        (ns) => ns.every((n) => settled(n, target)),
        600_000,
      );
      const total = Date.now() - startedAt;
      const history = nodes.since(startedAt);
      const maxDisrupted = Math.max(...history.map((s) => [...s.objects.values()].filter(disrupted).length));
      t.equal(maxDisrupted, 1, "at most one node cordoned, draining or disrupted at any moment");
      const maxApproved = Math.max(
        ...history.map((s) => [...s.objects.values()].filter((n) => hasAnnotation(n, NODE_KEYS.approved)).length),
      );
      t.equal(maxApproved, 1, "at most one node approved to update at any moment (maxConcurrent 1)");
      for (const name of names) {
        t.ok(
          history.some((s) => s.objects.get(name)?.spec?.unschedulable === true),
          `${name} was cordoned for its drain`,
        );
      }
      // Each time a node was approved or cordoned, every node of the group was Ready.
      const gated = history.filter((s, i) => {
        const prev = history[i - 1];
        if (!prev) return false;
        return [...s.objects.values()].some((n) => {
          const p = prev.objects.get(n.metadata.name);
          return (
            (hasAnnotation(n, NODE_KEYS.approved) && !(p && hasAnnotation(p, NODE_KEYS.approved))) ||
            (n.spec?.unschedulable === true && p?.spec?.unschedulable !== true)
          );
        });
      });
      t.ok(gated.length >= names.length, `${gated.length} approvals and cordons seen`);
      t.ok(
        gated.every((s) => [...s.objects.values()].every(isReady)),
        "every approval and every cordon happened while all three nodes were Ready",
      );
      // The budget: the Deployment never had fewer than two available replicas, the pods never
      // fewer than two Ready (the PodDisruptionBudget's view: terminating pods do not count).
      const minAvailable = Math.min(
        ...deployments.since(startedAt).map((s) => s.objects.get(`default/${APP}`)?.status?.availableReplicas ?? 0),
      );
      t.ok(minAvailable >= 2, `the Deployment's available replicas never below 2 (lowest ${minAvailable})`);
      const minReady = Math.min(...pods.since(startedAt).map((s) => [...s.objects.values()].filter(podReady).length));
      t.ok(minReady >= 2, `never fewer than 2 Ready pods (lowest ${minReady})`);
      for (const name of names) {
        t.ok((await nodeEvents(name, EVENTS.drained)).length > 0, `${name} drained (${EVENTS.drained})`);
        const f = fleet.find((x) => x.machine.name === name) as FleetNode;
        t.equal((await f.machine.mustExec(["cat", DISRUPTIVE_MARKER])).stdout.trim(), "v2", `${name} made the change`);
        // Per node: approved → settled at the new checksum.
        const approvedAt = history.find((s) => {
          const n = s.objects.get(name);
          return n && hasAnnotation(n, NODE_KEYS.approved);
        })?.at;
        const doneAt = history.find((s) => {
          const n = s.objects.get(name);
          return n && settled(n, target);
        })?.at;
        if (approvedAt && doneAt) perNode[name] = doneAt - approvedAt;
      }
      t.comment(
        `rollout of 3 nodes ${(total / 1000).toFixed(1)} s; per node (approved → done): ${Object.entries(perNode)
          .map(([n, ms]) => `${n} ${(ms / 1000).toFixed(1)} s`)
          .join(", ")}`,
      );
      await pods.waitFor("three app pods Ready again", (ps) => ps.filter(podReady).length === 3, 120_000);

      // The self-update: every node runs the new release now, restarted into it, and early OOM
      // samples in the new process; fencing never went a watchdog timeout without a pet.
      const hex = digest.replace(/^sha256:/, "");
      for (const [i, f] of fleet.entries()) {
        const name = f.machine.name;
        const link = (await f.machine.mustExec(["readlink", "/opt/deckhouse/lib/bashible"])).stdout.trim();
        t.match(link, new RegExp(`bashible-releases/${hex}/`), `${name} links the new release`);
        const now = await until(
          `${name}'s agent to serve the new version's metrics`,
          async () => {
            const m = await agentMetrics(f);
            return m.version === nextVersion && m.samples !== undefined && m;
          },
          60_000,
        );
        t.not(now.pid, running[i]?.pid, `${name}'s agent was restarted (pid ${running[i]?.pid} → ${now.pid})`);
        t.match(
          (await f.machine.mustExec(["/opt/deckhouse/bin/bashible", "version"])).stdout,
          nextVersion,
          `${name}: bashible version says ${nextVersion}`,
        );
        await until(
          `${name}'s early OOM to go on sampling`,
          async () => ((await agentMetrics(f)).samples ?? 0) > (now.samples ?? 0),
          30_000,
        );
        t.pass(`${name}: early OOM samples in the new agent`);
      }
      await Promise.all(fleet.map((f) => f.watchdog.nextPets(4, 60_000)));
      const to = hrNow();
      for (const f of fleet) {
        // Fencing stands down (magic close) while its node is approved for the update and when
        // the old agent stops; what a real watchdog counts is the time armed without a pet.
        const { gapMs, disarms } = f.watchdog.longestArmedGap(from, to);
        t.ok(
          gapMs < 60_000,
          `${f.machine.name}: never armed for a watchdog timeout without a pet through the rollout and its own restart (longest ${(gapMs / 1000).toFixed(1)} s; disarmed ${disarms} time(s), longest pause between pets ${(f.watchdog.longestPetGap(from, to) / 1000).toFixed(1)} s)`,
        );
        t.ok(
          disarms >= 1,
          `${f.machine.name}: its watchdog was disarmed cleanly (magic close: the stand-down, the old agent's stop), never left to fire`,
        );
      }
      const fencedAfter = await fencedEvents(cluster, names);
      t.equal(fencedAfter, fencedBefore, `no ${EVENTS.nodeFenced} event: no false fence`);
    });

    await t.test("Manual: nothing moves until the approval annotation, then only that node", async (t) => {
      const automatic = await cluster.groupChecksum();
      await cluster.apply(nodeGroup({}, { disruptions: { approvalMode: "Manual" }, update: UPDATE }));
      await until(
        "the group's checksum to change with the mode",
        async () => (await cluster.groupChecksum()) !== automatic,
        60_000,
      );
      const before = await fleetSettled("the fleet settled under Manual (a change without a disruption)");
      const startedAt = Date.now();
      await cluster.apply(disruptiveConfiguration("v3"));
      const target = await newChecksum(cluster, before);
      const approvedAt: Record<string, number> = {};
      for (let round = 0; round < names.length; round++) {
        const asking = await nodes.waitFor(
          "a node asking for disruption approval",
          (ns) =>
            ns.find((n) => hasAnnotation(n, NODE_KEYS.disruptionRequired) && approvedAt[n.metadata.name] === undefined),
          180_000,
        );
        const name = asking.metadata.name;
        await until(
          `${EVENTS.disruptionWaiting} on ${name}`,
          async () => (await nodeEvents(name, EVENTS.disruptionWaiting)).length > 0,
          60_000,
        );
        // Until now, nothing moved: no node at the new checksum, no node cordoned or approved to disrupt.
        const sofar = nodes.since(startedAt);
        t.notOk(
          sofar.some((s) =>
            [...s.objects.values()].some(
              (n) => approvedAt[n.metadata.name] === undefined && (checksumOf(n) === target || disrupted(n)),
            ),
          ),
          `round ${round + 1}: ${name} waits; no node without the annotation moved`,
        );
        approvedAt[name] = Date.now();
        await admin.request("PATCH", `/api/v1/nodes/${name}`, {
          contentType: "application/merge-patch+json",
          body: { metadata: { annotations: { [NODE_KEYS.disruptionApproved]: "" } } },
        });
        await nodes.waitFor(
          `${name} at the new checksum`,
          (ns) => ns.find((n) => n.metadata.name === name && settled(n, target)),
          180_000,
        );
        const others = nodes.current.filter(
          (n) => n.metadata.name !== name && approvedAt[n.metadata.name] === undefined,
        );
        t.ok(
          others.every((n) => checksumOf(n) !== target),
          `${name} moved after its approval; ${others.map((n) => n.metadata.name).join(", ") || "no other"} still waits`,
        );
      }
      const history = nodes.since(startedAt);
      t.notOk(
        history.some((s) => [...s.objects.values()].some((n) => n.spec?.unschedulable === true)),
        "Manual: the controller cordoned and drained nothing",
      );
      for (const name of names) {
        const first = history.find((s) => {
          const n = s.objects.get(name);
          return n && checksumOf(n) === target;
        })?.at;
        t.ok(
          first !== undefined && first > (approvedAt[name] ?? Number.POSITIVE_INFINITY),
          `${name} reached the new checksum only after its approval`,
        );
      }
      await fleetSettled("the fleet settled at v3");
    });

    await t.test("control-plane outage: no node stops petting, no pod is freed", async (t) => {
      await pods.waitFor("three app pods Ready", (ps) => ps.filter(podReady).length === 3, 120_000);
      const podsBefore = new Set(pods.current.map((p) => p.metadata.uid));
      const fencedBefore = await fencedEvents(cluster, names);
      const from = hrNow();
      const stoppedAt = Date.now();
      await cp.stopApiServer();
      t.comment("kube-apiserver stopped (etcd, kube-controller-manager, kube-scheduler and the bundle server run on)");
      // The outage lasts until every agent has judged it an outage for twice its detection window:
      // long past the point where a node trusting the API alone would have stopped petting.
      const span = 2 * FLEET_FENCING.detectionSeconds * 1000;
      const seen: Record<string, Set<string>> = {};
      await until(
        "every agent to hold the outage for twice its detection window",
        async () => {
          const all = await Promise.all(fleet.map(fencingStatus));
          all.forEach((s, i) => {
            const name = names[i] as string;
            seen[name] ??= new Set();
            if (s?.verdict) seen[name].add(s.verdict.kind);
            if (s?.fencing) throw new Error(`${name} stopped petting during the outage: ${s.verdict?.reason}`);
          });
          return all.every((s) => s?.verdict?.kind === "outage" && Date.parse(s.verdict.at) - stoppedAt > span);
        },
        span + 120_000,
        250,
      ).catch((err) => {
        throw new Error(
          `${(err as Error).message}\nverdicts seen: ${JSON.stringify(Object.fromEntries(Object.entries(seen).map(([k, v]) => [k, [...v]])))}`,
        );
      });
      t.pass(`every agent judged it an outage (peers agree) for > ${span / 1000} s`);
      await cp.startApiServer();
      const restartedAt = Date.now();
      t.comment(`kube-apiserver back after ${((restartedAt - stoppedAt) / 1000).toFixed(1)} s`);
      await until(
        "every kubelet to renew its Lease again",
        async () => {
          const leases = await admin.request<{ items: { metadata: { name: string }; spec: { renewTime?: string } }[] }>(
            "GET",
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
          );
          return names.every((n) => {
            const l = leases.items.find((x) => x.metadata.name === n);
            return l?.spec.renewTime && Date.parse(l.spec.renewTime) > restartedAt;
          });
        },
        120_000,
        500,
      );
      await fleetSettled("every node Ready again", 180_000);
      t.pass("every node Ready again");
      await Promise.all(fleet.map((f) => f.watchdog.nextPets(4, 60_000)));
      const to = hrNow();
      for (const f of fleet) {
        const gap = f.watchdog.longestPetGap(from, to);
        t.ok(
          gap < 60_000,
          `${f.machine.name} never went a watchdog timeout without a pet (longest gap ${(gap / 1000).toFixed(1)} s)`,
        );
        const s = await fencingStatus(f);
        t.equal(s?.fencing, false, `${f.machine.name} is not fencing`);
      }
      t.same(
        new Set(pods.current.filter(podReady).map((p) => p.metadata.uid)),
        podsBefore,
        "the same three pods run: none was freed",
      );
      const fencedAfter = await fencedEvents(cluster, names);
      t.equal(fencedAfter, fencedBefore, `no ${EVENTS.nodeFenced} event`);
    });

    await t.test("partition: the cut-off node stops petting, its pods run elsewhere, the others pet on", async (t) => {
      await pods.waitFor("three app pods Ready", (ps) => ps.filter(podReady).length === 3, 120_000);
      const victim = fleet.find((f) => pods.current.some((p) => p.spec.nodeName === f.machine.name)) as FleetNode;
      const name = victim.machine.name;
      const others = fleet.filter((f) => f !== victim);
      const victimPods = new Set(pods.current.filter((p) => p.spec.nodeName === name).map((p) => p.metadata.uid));
      const otherPods = new Set(pods.current.filter((p) => p.spec.nodeName !== name).map((p) => p.metadata.uid));
      const from = hrNow();
      const cutAt = Date.now();
      await partition(victim.machine);
      t.comment(`${name} cut off (its veth down), with ${victimPods.size} app pod(s)`);
      // Pets stop: the agent says so (its verdict), or its pets stopped without it saying so (a
      // check loop that hangs stops them too); either way a real watchdog would fire.
      const lastPet = () => victim.watchdog.lastPetAt(from);
      const stopped = await until(
        `${name}'s pets to stop`,
        async () => {
          const s = await fencingStatus(victim);
          if (s?.fencing) return { s, said: true };
          return hrNow() - lastPet() > 2 * FLEET_FENCING.detectionSeconds * 1000 && { s, said: false };
        },
        120_000,
        250,
      ).catch(async (err) => {
        const j = await victim.machine.exec([
          "journalctl",
          "-q",
          "--no-pager",
          "-n",
          "40",
          "-u",
          "bashible",
          "-o",
          "cat",
        ]);
        const last = victim.watchdog.lastPetAt(0);
        throw new Error(
          `${(err as Error).message}\nlast pet ${((hrNow() - last) / 1000).toFixed(1)} s ago; status: ${JSON.stringify(await fencingStatus(victim))}\njournal:\n${j.stdout.slice(-6000)}`,
        );
      });
      t.ok(
        stopped.said,
        `${name}'s agent says it stopped petting (status: fencing, verdict ${stopped.s?.verdict?.kind}: ${stopped.s?.verdict?.reason})`,
      );
      t.match(stopped.s?.verdict?.kind ?? "", /^(isolated|cut-off)$/, "it judged itself cut off");
      const lastPetAt = lastPet();
      const petsAtFence = victim.watchdog.pets;
      await pods.waitFor(
        `${name}'s pods deleted by the fencing controller`,
        (ps) => !ps.some((p) => victimPods.has(p.metadata.uid ?? "")),
        FLEET_FENCING.thresholdSeconds * 1000 + 120_000,
      );
      const deletedAt = Date.now();
      const fencedEvents = await until(
        `${EVENTS.nodeFenced} on ${name}`,
        async () => {
          const e = await nodeEvents(name, EVENTS.nodeFenced);
          return e.length > 0 && e;
        },
        60_000,
      );
      t.match(fencedEvents[0]?.message ?? "", /Deleted \d+ pod/, `${EVENTS.nodeFenced}: ${fencedEvents[0]?.message}`);
      const replaced = await pods.waitFor(
        "three app pods Ready on the other nodes",
        (ps) => {
          const r = ps.filter(podReady);
          return r.length === 3 && r.every((p) => p.spec.nodeName !== name) && r;
        },
        180_000,
      );
      const replacedAt = Date.now();
      t.ok(replaced.length === 3, "the Deployment's replacements run on the two other nodes");
      t.equal(victim.watchdog.pets, petsAtFence, `no pet reached ${name}'s watchdog after it stopped`);
      t.ok(
        [...otherPods].every((uid) => replaced.some((p) => p.metadata.uid === uid)),
        "the other nodes' pods were left alone",
      );
      const to = hrNow();
      for (const f of others) {
        const gap = f.watchdog.longestPetGap(from, to);
        t.ok(gap < 60_000, `${f.machine.name} pet on throughout (longest gap ${(gap / 1000).toFixed(1)} s)`);
        t.equal((await fencingStatus(f))?.fencing, false, `${f.machine.name} is not fencing`);
      }
      t.comment(
        `partition: cut-off → last pet ${((lastPetAt - from) / 1000).toFixed(1)} s, → pods deleted ${((deletedAt - cutAt) / 1000).toFixed(1)} s, → replacements Ready ${((replacedAt - cutAt) / 1000).toFixed(1)} s (threshold ${FLEET_FENCING.thresholdSeconds} s)`,
      );
    });
  },
);
