// Adoption end to end (issue 25): a node Deckhouse's bashible runs, with a real kubelet and
// containerd and a pod on it, joined to a real control plane, is taken over by `bashible adopt`
// in place: the pod keeps running in the same container, the Node is never re-registered, the
// node then follows a NodeGroup edit, a second adopt changes nothing, and going back hands the
// node to Deckhouse's timer again, the pod still running.
//
// How the machine becomes Deckhouse's: Deckhouse's bashible and its images cannot run here, so a
// bare machine joins through this project's bootstrap.sh (real containerd, kubelet, credentials,
// pod network) and is then laid out as Deckhouse v1.66 leaves a worker
// (test/fixtures/deckhouse-node.ts, overJoinedNode): this agent's units and state removed,
// Deckhouse's bashible.timer and oneshot bashible.service, bashible.sh and bundle_steps, the
// kubelet started by the package's unit and 10-deckhouse.conf through d8-kubelet-forker,
// containerd's deckhouse.toml, the sysctl tuner and d8-* units, the `deckhouse` user, and the API
// proxy as the static pod the kubelet runs. What both projects write alike stays as the join
// wrote it: the kubelet's configuration (Deckhouse's setting by setting, docs/steps.md), its
// kubeconfig and certificates, containerd's configuration and unit name. The API proxy pod runs
// the machine's nginx (Deckhouse's image is not here) on the same address. The group has no
// fencing: while the machine is Deckhouse's nothing of this agent pets its watchdog, and
// Deckhouse's fencing agent (a DaemonSet) is not part of it.
import t, { type Test } from "tap";
import { readFile } from "node:fs/promises";
import { DECKHOUSE, ADOPTION } from "../../bundles/deckhouse-node.ts";
import { NODE_KEYS } from "../../bundles/names.ts";
import { PATHS } from "../../bundles/paths.ts";
import { UNITS } from "../../bundles/steps/index.ts";
import { GROUP, nodeGroup } from "../../scripts/lib/e2e/cluster.ts";
import { newChecksum } from "../../scripts/lib/e2e/fleet.ts";
import { BUSYBOX_IMAGE } from "../../scripts/lib/e2e/images.ts";
import { getNode, isReady, joinMachine, startWorld, type World, worldSkip } from "../../scripts/lib/e2e/world.ts";
import { until } from "../../scripts/lib/until.ts";
import { DECKHOUSE_CHECKSUM, layDeckhouseWorker, RUNS_LOG } from "../fixtures/deckhouse-node.ts";

const skip = worldSkip();
t.setTimeout(30 * 60_000);

/** Without fencing (see the top of the file); everything else as the other e2e scenarios have it. */
const GROUP_WITHOUT_FENCING = (kubelet: Record<string, unknown> = {}) => nodeGroup(kubelet, { fencing: undefined });
const APP = "adopted-app";
const PROXY_POD = (node: string) => `kubernetes-api-proxy-${node}`;

interface Pod {
  metadata: { uid: string };
  status?: {
    phase?: string;
    containerStatuses?: { containerID?: string; restartCount: number; state?: { running?: { startedAt: string } } }[];
  };
}

t.test(
  "a node Deckhouse set up is adopted with its pod running, follows its group, and goes back",
  { skip, timeout: 30 * 60_000 },
  async (t) => {
    const world: World = await startWorld({
      log: (l) => t.comment(l),
      keepWork: () => process.env.BASHIBLE_E2E_KEEP === "1" || !t.passing(),
    });
    t.teardown(() => world.stop());
    const { cluster } = world;
    const { cp } = cluster;
    await cluster.apply(GROUP_WITHOUT_FENCING());
    const machine = await world.machine("e2e-adopt-1");
    const name = machine.name;
    const sh = (script: string) => machine.mustExec(["sh", "-ec", script]).then((r) => r.stdout);
    const agent = `${PATHS.agentDir}/bashible`;
    const outputs: Record<string, string> = {};
    t.teardown(async () => {
      if (t.passing()) return;
      t.comment(`work dir kept: ${world.work}`);
      for (const [k, v] of Object.entries(outputs)) t.comment(`${k}:\n${v.slice(-6000)}`);
      const j = await machine.exec(["journalctl", "-q", "--no-pager", "-n", "200", "-u", "bashible", "-u", "kubelet"]);
      t.comment(`journal:\n${j.stdout.slice(-10000)}`);
      t.comment(`bashible-server log:\n${(await readFile(cluster.serverLog, "utf8").catch(() => "")).slice(-3000)}`);
    });
    const pod = (ns: string, n: string) =>
      cp.admin.request<Pod>("GET", `/api/v1/namespaces/${ns}/pods/${n}`).catch(() => undefined);
    const running = async (ns: string, n: string) => {
      const p = await pod(ns, n);
      return p?.status?.phase === "Running" && p.status.containerStatuses?.[0]?.state?.running !== undefined && p;
    };
    const prop = async (unit: string, p: string) => (await sh(`systemctl show -p ${p} --value ${unit}`)).trim();
    const adopt = (args: string[]) => machine.exec([agent, "adopt", ...args], { timeoutMs: 600_000 });

    const join = await joinMachine(cluster, machine, await cluster.bootstrapScript(), {
      readyTimeoutMs: 15 * 60_000,
    });
    outputs["bootstrap.sh"] = join.run.output;
    t.equal(join.run.exitCode, 0, "the machine joined");
    t.ok(isReady(join.node), "its Node is Ready");
    const nodeUid = join.node?.metadata.uid;
    t.match(nodeUid, /^[0-9a-f-]{36}$/, "the Node object's uid, kept to compare");
    const sameNode = async (t: Test, when: string) =>
      t.equal((await getNode(cluster, name))?.metadata.uid, nodeUid, `${when}: the same Node object`);
    // The kubelet's process itself: systemd may not know a main PID for Deckhouse's forking unit.
    const kubeletPid = async () => Number((await sh("pgrep -o -x kubelet")).trim());
    for (const [i, img] of Object.values(world.images).entries()) {
      await machine.copyIn(img.file, `/tmp/image-${i}.tar`);
      await machine.mustExec(["/opt/deckhouse/bin/ctr", "-n", "k8s.io", "images", "import", `/tmp/image-${i}.tar`]);
    }

    await t.test("laid out as Deckhouse leaves a worker, its kubelet runs the API proxy pod", async (t) => {
      await sh(`systemctl stop ${UNITS.agent} ${UNITS.agentRestart} ${UNITS.apiProxy} ${UNITS.kubelet}
systemctl disable ${UNITS.agent} ${UNITS.apiProxy} ${UNITS.kubelet}
cd ${PATHS.unitDir} && rm -f ${UNITS.agent} ${UNITS.agentRestart} ${UNITS.apiProxy} ${UNITS.kubelet}
find ${PATHS.stateDir} -mindepth 1 -maxdepth 1 ! -name discovered-node-ip -exec rm -rf {} +`);
      const ip = (await sh(`cat ${PATHS.discoveredNodeIP}`)).trim();
      await layDeckhouseWorker(`/proc/${machine.pid}/root`, { group: GROUP, nodeIp: ip, overJoinedNode: true });
      await sh(`systemctl daemon-reload
systemctl enable --now ${DECKHOUSE.timer} sysctl-tuner.timer
systemctl start ${UNITS.kubelet}`);
      t.match(await prop(UNITS.kubelet, "ExecStart"), "d8-kubelet-forker", "the kubelet runs from Deckhouse's drop-in");
      const proxy = await until(
        "the API proxy's static pod to run",
        () => running("kube-system", PROXY_POD(name)),
        300_000,
      );
      t.ok(proxy, "the kubelet runs the API proxy pod and reaches the API through it (its mirror pod)");
      await until("the Node to be Ready", async () => isReady(await getNode(cluster, name)), 120_000);
      // Deckhouse's bashible annotates the Node with the checksum it applied last.
      await cp.kubectl(["annotate", "--overwrite", "node", name, `${NODE_KEYS.checksum}=${DECKHOUSE_CHECKSUM}`]);
      t.equal(
        (await sh(`cat ${DECKHOUSE.checksum}`)).trim(),
        DECKHOUSE_CHECKSUM,
        "Deckhouse's checksum is on the node",
      );
    });

    let before: Pod | undefined;
    await t.test("a pod runs on it", async (t) => {
      await cluster.apply({
        apiVersion: "v1",
        kind: "Pod",
        metadata: { name: APP, namespace: "default" },
        spec: {
          nodeName: name,
          terminationGracePeriodSeconds: 1,
          containers: [
            {
              name: "app",
              image: BUSYBOX_IMAGE,
              imagePullPolicy: "Never",
              command: ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"],
            },
          ],
        },
      });
      before = await until("the pod to run", () => running("default", APP), 180_000);
      t.match(before.status?.containerStatuses?.[0]?.containerID, /^containerd:\/\/[0-9a-f]{64}$/);
    });
    const samePod = async (t: Test, when: string) => {
      const now = await pod("default", APP);
      t.equal(now?.metadata.uid, before?.metadata.uid, `${when}: the same pod`);
      t.equal(
        now?.status?.containerStatuses?.[0]?.containerID,
        before?.status?.containerStatuses?.[0]?.containerID,
        `${when}: the same container`,
      );
      t.equal(now?.status?.containerStatuses?.[0]?.restartCount, 0, `${when}: never restarted`);
      t.equal(now?.status?.phase, "Running", `${when}: running`);
    };

    await t.test("adopt --plan shows the change and changes nothing", async (t) => {
      const timerBefore = await prop(DECKHOUSE.timer, "ActiveState");
      const plan = await adopt(["--plan"]);
      outputs["adopt --plan"] = plan.stdout + plan.stderr;
      t.equal(plan.exitCode, 2, plan.stderr.slice(-3000));
      // What an operator reads first: adoption's own part of the plan.
      t.comment(plan.stdout.slice(plan.stdout.indexOf("adoption:"), plan.stdout.indexOf("the converge over")));
      t.match(plan.stdout, "node: Deckhouse's bashible manages this node");
      t.match(plan.stdout, `stop and disable ${DECKHOUSE.timer}`);
      t.match(plan.stdout, `move ${DECKHOUSE.apiProxyManifest}`, "the proxy pod makes way for the unit");
      t.match(plan.stdout, "-ExecStart=/opt/deckhouse/bin/d8-kubelet-forker", "the drop-in's removal, as a diff");
      t.equal(await prop(DECKHOUSE.timer, "ActiveState"), timerBefore, "Deckhouse's timer as it was");
      t.ok(await running("kube-system", PROXY_POD(name)), "the proxy pod still runs");
    });

    let adoptedChecksum = "";
    await t.test("adopt --yes takes the node over; the pod keeps its container", async (t) => {
      const kubeletBefore = await kubeletPid();
      const containerdBefore = await prop(UNITS.containerd, "MainPID");
      const started = Date.now();
      const adopted = await adopt(["--yes"]);
      t.comment(`adopt --yes: ${((Date.now() - started) / 1000).toFixed(1)} s`);
      outputs["adopt --yes"] = adopted.stdout + adopted.stderr;
      t.equal(adopted.exitCode, 0, adopted.stderr.slice(-4000));
      t.ok(kubeletBefore > 0, "the kubelet ran before");
      t.not(await kubeletPid(), kubeletBefore, "the kubelet restarted (its drop-in removed)");
      t.equal(
        await prop(UNITS.containerd, "MainPID"),
        containerdBefore,
        "containerd did not restart (its configuration is Deckhouse's)",
      );
      t.match(adopted.stdout, `adopted: ${DECKHOUSE.timer} stopped and disabled`);
      t.equal((await machine.exec(["systemctl", "is-enabled", DECKHOUSE.timer])).stdout.trim(), "disabled");
      t.match(await prop(DECKHOUSE.service, "ExecStart"), `${agent} run`, "this agent's daemon is bashible.service");
      t.notMatch(
        await prop(UNITS.kubelet, "ExecStart"),
        "d8-kubelet-forker",
        "the kubelet runs from this agent's unit",
      );
      t.equal(await prop(UNITS.apiProxy, "ActiveState"), "active", "the API proxy is this agent's unit");
      await until(
        "the proxy's mirror pod to go",
        async () => (await pod("kube-system", PROXY_POD(name))) === undefined,
        180_000,
      );
      const record = JSON.parse(await sh(`cat ${ADOPTION.record}`));
      t.match(record, {
        state: "adopted",
        converge: { outcome: "applied" },
        movedManifest: { path: DECKHOUSE.apiProxyManifest },
      });
      adoptedChecksum = (await cluster.groupChecksum()) ?? "";
      const node = await until(
        "the Node to be Ready at the group's checksum",
        async () => {
          const n = await getNode(cluster, name);
          return isReady(n) && n?.metadata.annotations?.[NODE_KEYS.checksum] === adoptedChecksum && n;
        },
        180_000,
      );
      t.ok(node, "the Node reports this agent's converge of the group's bundle");
      await samePod(t, "after adoption");
      await sameNode(t, "after adoption");
    });

    await t.test("the adopted node follows a NodeGroup edit", async (t) => {
      const kubeletBefore = await kubeletPid();
      await cluster.apply(GROUP_WITHOUT_FENCING({ maxPods: 61 }));
      const edited = await newChecksum(cluster, adoptedChecksum);
      await until(
        "the node to converge to the edit",
        async () => (await getNode(cluster, name))?.metadata.annotations?.[NODE_KEYS.checksum] === edited,
        300_000,
      );
      t.match(await sh(`cat ${PATHS.kubeletConfig}`), /^maxPods: 61$/m, "the kubelet has the group's new maxPods");
      const capacity = await until(
        "the Node's pod capacity",
        async () => (await getNode(cluster, name))?.status?.capacity?.pods === "61",
        120_000,
      );
      t.ok(capacity, "and the Node says so");
      t.not(await kubeletPid(), kubeletBefore, "the kubelet restarted on its new configuration");
      await samePod(t, "after the edit");
    });

    await t.test("a second adopt changes nothing", async (t) => {
      const recordBefore = await sh(`cat ${ADOPTION.record}`);
      const again = await adopt(["--yes"]);
      t.equal(again.exitCode, 0, again.stderr.slice(-2000));
      t.match(again.stdout, "already adopted");
      t.equal(await sh(`cat ${ADOPTION.record}`), recordBefore, "the record is as it was");
    });

    await t.test("adopt --revert hands the node back to Deckhouse's timer, the pod still running", async (t) => {
      const runsBefore = (await machine.exec(["cat", RUNS_LOG])).stdout;
      const back = await machine.exec([agent, "adopt", "--revert"], { timeoutMs: 300_000 });
      outputs["adopt --revert"] = back.stdout + back.stderr;
      t.equal(back.exitCode, 0, back.stderr.slice(-3000));
      t.equal((await machine.exec(["systemctl", "is-enabled", DECKHOUSE.timer])).stdout.trim(), "enabled");
      t.match(await prop(DECKHOUSE.service, "ExecStart"), DECKHOUSE.entry, "Deckhouse's bashible.service is back");
      const proxy = await until(
        "the API proxy's static pod to run again",
        () => running("kube-system", PROXY_POD(name)),
        300_000,
      );
      t.ok(proxy, "the kubelet runs Deckhouse's proxy pod again");
      await until(
        "Deckhouse's bashible.sh to run from its timer",
        async () => (await machine.exec(["cat", RUNS_LOG])).stdout.length > runsBefore.length,
        180_000,
      );
      t.pass("Deckhouse's timer ran bashible.sh");
      await until("the Node to be Ready", async () => isReady(await getNode(cluster, name)), 180_000);
      await samePod(t, "after going back");
      await sameNode(t, "after going back");
    });
  },
);
