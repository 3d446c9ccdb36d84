// Three agents of one group, each a real `bashible run` with a FIFO for its watchdog, against a
// real kube-apiserver. Through relays the test controls, it stops the API server for everyone or
// cuts one node off, and checks who keeps petting. Timings are shortened through
// --fencing-timings (pet 0.2 s, check 0.5 s, API 1.5 s, peers 1 s, 3 bad rounds); every wait is
// for an event (a byte on a FIFO, a log line, a counter in the agent's metrics file).
import t from "tap";
import { withControlPlane } from "../../scripts/lib/control-plane-fixture.ts";
import { type FencingCluster, type FencingNode, startFencingCluster } from "../../scripts/lib/fencing.ts";
import { waitFor } from "../../scripts/lib/cli.ts";
import { uptime } from "node:os";
import { getNode, microTime } from "../../lib/kube/api.ts";
import { NODE_KEYS } from "../../bundles/names.ts";

const cp = await withControlPlane(t);
const cluster: FencingCluster = await startFencingCluster(cp, {
  nodes: [{ name: "fence-a" }, { name: "fence-b" }, { name: "fence-c" }],
});
t.teardown(() => cluster.stop());
const [a, b, c] = cluster.nodes as [FencingNode, FencingNode, FencingNode];
const BAD_ROUNDS = 3;

const labelled = async (n: FencingNode) =>
  (await getNode(cp.admin, n.name)).metadata.labels?.[NODE_KEYS.fencingEnabled] !== undefined;

/** Waits until `n` has made `count` more verdicts of `kind` than now (from its metrics file). */
async function moreVerdicts(n: FencingNode, kind: string, count: number): Promise<void> {
  const base = await n.metric("bashible_fencing_verdicts_total", `kind="${kind}"`);
  await waitFor(
    `${n.name}: ${count} more '${kind}' verdicts`,
    async () => (await n.metric("bashible_fencing_verdicts_total", `kind="${kind}"`)) >= base + count,
    60_000,
  );
}

/** This node's kubelet Lease, last renewed at `ms`, created by the test (a kubelet would). */
async function kubeletLease(n: FencingNode, ms: number): Promise<void> {
  await cp.admin.request("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", {
    body: {
      apiVersion: "coordination.k8s.io/v1",
      kind: "Lease",
      metadata: { name: n.name, namespace: "kube-node-lease" },
      spec: {
        holderIdentity: n.name,
        leaseDurationSeconds: 40,
        renewTime: microTime(ms),
      },
    },
  });
}
const renewLease = (n: FencingNode) =>
  cp.admin.request("PATCH", `/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/${n.name}`, {
    body: { spec: { renewTime: microTime(Date.now()) } },
  });
const deleteLease = (n: FencingNode) =>
  cp.admin.request("DELETE", `/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/${n.name}`);

/** A kubelet renewing `n`'s Lease every 300 ms until stopped. */
function renewing(n: FencingNode): { stop(): Promise<void> } {
  let on = true;
  const loop = (async () => {
    while (on) {
      await renewLease(n);
      await new Promise((r) => setTimeout(r, 300));
    }
  })();
  return {
    async stop() {
      on = false;
      await loop;
    },
  };
}

t.test("each agent arms its watchdog, pets it and labels its Node", async (t) => {
  for (const n of cluster.nodes) n.agent.start();
  await Promise.all(cluster.nodes.map((n) => n.watchdog.nextPets(3)));
  for (const n of cluster.nodes) {
    await waitFor(`${n.name} labelled`, () => labelled(n));
    const node = await getNode(cp.admin, n.name);
    t.equal(node.metadata.labels?.[NODE_KEYS.fencingMode], "Watchdog", `${n.name}: mode label`);
    t.match(node.metadata.annotations?.[NODE_KEYS.fencingTimings], /^watchdog=60s,detection=\d+s,kubelet=\d+s$/);
  }
  // every agent sees the other two as peers before the failures start
  for (const n of cluster.nodes)
    await waitFor(`${n.name} knows 2 peers`, async () => (await n.status())?.peersKnown === 2);
});

t.test("a Lease last renewed before this boot does not count: the kubelet has not started yet", async (t) => {
  await kubeletLease(c, Date.now() - uptime() * 1000 - 60_000);
  const seen = await waitFor("c reads the old Lease", async () => {
    const s = await c.status();
    return (s?.lastCheck?.kubeletLeaseAgeSeconds ?? 0) > 60 ? s : undefined;
  });
  t.equal(seen.kubeletSeenAlive, false);
  await moreVerdicts(c, "api", BAD_ROUNDS + 1);
  const s = await c.status();
  t.equal(s?.fencing, false, "c keeps petting");
  t.equal(s?.verdict?.kind, "api", String(s?.verdict?.reason));
  await c.watchdog.nextPets(3);
  await deleteLease(c);
});

t.test("the API server stops answering: every node keeps petting (a control-plane outage)", async (t) => {
  // Kubelets renew their Leases until the API goes away; afterwards every Lease is old.
  for (const n of cluster.nodes) await kubeletLease(n, Date.now());
  const kubelets = cluster.nodes.map((n) => renewing(n));
  for (const n of cluster.nodes)
    await waitFor(`${n.name} sees its kubelet renew`, async () => (await n.status())?.kubeletSeenAlive === true);
  for (const k of kubelets) await k.stop();
  await cluster.pauseApiServer();
  try {
    // More outage verdicts than it takes to stop petting, on every node…
    await Promise.all(cluster.nodes.map((n) => moreVerdicts(n, "outage", BAD_ROUNDS + 2)));
    // …and the pets go on after them.
    await Promise.all(cluster.nodes.map((n) => n.watchdog.nextPets(5)));
    for (const n of cluster.nodes) {
      const s = await n.status();
      t.equal(s?.fencing, false, `${n.name} is not fencing`);
      t.equal(s?.verdict?.kind, "outage", `${n.name}: ${s?.verdict?.reason}`);
      t.equal(n.watchdog.count("V"), 0, `${n.name} stayed armed`);
    }
  } finally {
    await cluster.resumeApiServer();
  }
  // The kubelets come back a little after the API (their own retry): meanwhile every Lease is
  // older than the agents' kubelet limit, but its age counts from when the API came back.
  // (Judged by the Lease's age alone, every check from here on would find the kubelet stale.)
  await Promise.all(cluster.nodes.map((n) => moreVerdicts(n, "api", 1)));
  const back = cluster.nodes.map((n) => renewing(n));
  await Promise.all(cluster.nodes.map((n) => moreVerdicts(n, "api", 2)));
  for (const n of cluster.nodes) {
    t.equal((await n.status())?.fencing, false, `${n.name}: no fence after the outage`);
    t.notOk(
      n.agent.lines.some((l) => l.verdict === "kubelet-stale"),
      `${n.name}: never judged its kubelet stale`,
    );
  }
  for (const k of back) await k.stop();
  for (const n of cluster.nodes) await deleteLease(n);
});

t.test("one node cut off from the API and its peers stops petting; the others keep petting", async (t) => {
  const firstBad = a.agent.waitLog("a first bad verdict", (r) => r.healthy === false && r.badRounds === 1);
  const stopped = a.agent.waitMsg(/stopped petting/);
  a.cut();
  try {
    await firstBad;
    const petsAtFirstBad = a.watchdog.pets;
    const line = await stopped;
    t.ok(a.watchdog.pets > petsAtFirstBad, "one bad round does not stop the pets; the third does");
    t.match(line.verdict, /isolated|cut-off/, `a: ${line.reason}`);
    const petsAtStop = a.watchdog.pets;
    // the others go on petting well past a's decision, on their API verdicts
    await Promise.all([b.watchdog.nextPets(15), c.watchdog.nextPets(15)]);
    t.equal(a.watchdog.pets, petsAtStop, "a wrote no pet after it decided");
    t.equal(a.watchdog.count("V"), 0, "a did not disarm: its watchdog fires");
    await waitFor("a's status says fencing", async () => (await a.status())?.fencing === true);
    for (const n of [b, c]) {
      const s = await n.status();
      t.equal(s?.fencing, false, `${n.name} is not fencing`);
      t.equal(s?.verdict?.kind, "api", `${n.name} reaches the API`);
    }
  } finally {
    a.heal();
  }
  // back in the cluster before the (simulated) watchdog fired: pets resume
  await a.agent.waitMsg(/healthy again/);
  await a.watchdog.nextPets(3);
  await waitFor("a's status says not fencing", async () => (await a.status())?.fencing === false);
});

t.test("a fence in progress survives stopping and restarting the agent", async (t) => {
  const stopped = a.agent.waitMsg(/stopped petting/);
  a.cut();
  try {
    await stopped;
    const released = a.agent.waitMsg(/released without disarming/);
    t.equal(await a.agent.signal("SIGTERM"), 0);
    await released;
    // Restarted while still cut off: the new agent does not re-open the device (an open is a pet).
    const held = a.agent.waitMsg(/previous agent was fencing/);
    a.agent.start();
    await held;
    const petsHeld = a.watchdog.pets;
    await a.agent.waitLog("a bad verdict after the restart", (r) => r.healthy === false);
    t.equal(a.watchdog.pets, petsHeld, "no pet after the restart while cut off");
    t.equal(a.watchdog.count("V"), 0, "never disarmed: the watchdog would have fired");
  } finally {
    a.heal();
  }
  await a.agent.waitMsg(/healthy again/);
  await a.watchdog.nextPets(3);
});

t.test("maintenance annotations disarm (magic close) and re-arm afterwards", async (t) => {
  for (const key of [NODE_KEYS.fencingDisable, NODE_KEYS.disruptionApproved]) {
    const v = b.watchdog.nextMagicClose();
    await cp.admin.request("PATCH", `/api/v1/nodes/${b.name}`, { body: { metadata: { annotations: { [key]: "" } } } });
    await v;
    await waitFor(`${key}: label removed`, async () => !(await labelled(b)));
    await waitFor(`${key}: status says maintenance`, async () => (await b.status())?.maintenance === key);
    const petsInMaintenance = b.watchdog.pets;
    await c.watchdog.nextPets(5); // time passes on another node
    t.equal(b.watchdog.pets, petsInMaintenance, "no pets while disarmed");
    const rearmed = b.watchdog.nextPets(3);
    await cp.admin.request("PATCH", `/api/v1/nodes/${b.name}`, {
      body: { metadata: { annotations: { [key]: null } } },
    });
    await rearmed;
    await waitFor(`${key}: label back`, () => labelled(b));
  }
});

t.test("SIGTERM with the API server down still disarms with 'V'", async (t) => {
  await cluster.pauseApiServer();
  try {
    await moreVerdicts(c, "outage", 1);
    const v = c.watchdog.nextMagicClose();
    const code = await c.agent.signal("SIGTERM");
    await v;
    t.equal(code, 0, "the agent exits cleanly");
    t.equal(c.watchdog.bytes.at(-1)?.b, "V", "'V' is the last byte written");
  } finally {
    await cluster.resumeApiServer();
  }
  t.ok(await labelled(c), "the label stays: the API was down when the agent stopped");
  const back = c.watchdog.nextPets(3);
  c.agent.start();
  await back;
});

t.test("SIGKILL leaves the device armed; the restarted agent resumes petting", async (t) => {
  const vBefore = b.watchdog.count("V");
  await b.watchdog.nextPets(2);
  await b.agent.signal("SIGKILL");
  const resumed = b.watchdog.nextPets(3);
  b.agent.start();
  await resumed;
  t.equal(b.watchdog.count("V"), vBefore, "no magic close: a crash leaves the watchdog armed");
  const s = await waitFor("the new agent's status", async () => {
    const st = await b.status();
    return st?.pid === b.agent.proc?.pid ? st : undefined;
  });
  t.equal(s.armed, true);
});

t.test(
  "a kubelet that stops renewing its Lease: the node stops petting before the cluster frees its pods",
  async (t) => {
    // The fixture's agents run with kubelet=4: a Lease older than 4 s is a bad check.
    await kubeletLease(b, Date.now());
    const kubelet = renewing(b);
    await waitFor("b sees its kubelet renew", async () => (await b.status())?.kubeletSeenAlive === true);
    await moreVerdicts(b, "api", BAD_ROUNDS + 1);
    t.equal((await b.status())?.fencing, false, "a renewing kubelet keeps the pets going");

    const vBefore = b.watchdog.count("V");
    const stopped = b.agent.waitMsg(/stopped petting: the kubelet stopped renewing its Lease/);
    await kubelet.stop();
    const line = await stopped;
    t.equal(line.verdict, "kubelet-stale", String(line.reason));
    const petsAtStop = b.watchdog.pets;
    await c.watchdog.nextPets(10); // time passes on another node
    t.equal(b.watchdog.pets, petsAtStop, "b wrote no pet after it decided");
    t.equal(b.watchdog.count("V"), vBefore, "b did not disarm: its watchdog fires");

    // The kubelet comes back before the (simulated) watchdog fired: pets resume.
    const healthy = b.agent.waitMsg(/healthy again/);
    await renewLease(b);
    await healthy;
    await b.watchdog.nextPets(3);
    await deleteLease(b);
  },
);

t.test("Notify mode labels the Node and reports, and never opens the device", async (t) => {
  const notify = await startFencingCluster(cp, { group: "notify", nodes: [{ name: "notify-a" }], mode: "Notify" });
  t.teardown(() => notify.stop());
  const n = notify.nodes[0] as FencingNode;
  n.agent.start();
  await waitFor(
    "notify-a labelled",
    async () => (await getNode(cp.admin, n.name)).metadata.labels?.[NODE_KEYS.fencingMode] === "Notify",
  );
  t.ok(await labelled(n));
  const s = await waitFor("a Notify status", async () => {
    const st = await n.status();
    return st?.verdict ? st : undefined;
  });
  t.equal(s.mode, "Notify");
  t.equal(s.armed, false);
  t.equal(n.watchdog.bytes.length, 0, "nothing was written to the device");
});

t.test("bashible fencing status shows the device, the last pet and the decision", async (t) => {
  const { bashible } = await import("../../scripts/lib/cli.ts");
  const r = await bashible(["fencing", "status", "--root", a.root]);
  t.equal(r.status, 0, r.stderr);
  t.match(r.stdout, /device: .*ARMED, petting/);
  t.match(r.stdout, /last decision:\s+healthy \(api\)/);
  t.match(r.stdout, /detection window 8 s/);
  t.match(r.stdout, /kubelet Lease limit 4 s \(watching\)/);
  const m = await bashible(["fencing", "status", "--metrics", "--root", a.root]);
  t.match(m.stdout, /bashible_fencing_pets_total \d+/);
});
