// `bashible adopt` through its CLI on a sandbox root laid out as Deckhouse v1.66 leaves a Debian
// worker (test/fixtures/deckhouse-node.ts), in local mode (a bundle file): --plan shows the diffs
// against Deckhouse's files and changes nothing; without a flag it refuses; --yes disables
// Deckhouse's timer, saves its files, records the way back and converges; a second run changes
// nothing; --revert puts Deckhouse's files and timer back. Under --root the units are not run:
// enablement is real (systemctl --root), starts and stops land in sandbox-actions.log.
import t, { type Test } from "tap";
import { copyFile, lstat, mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import { existsSync } from "node:fs";
import path from "node:path";
import { bashible } from "../../scripts/lib/cli.ts";
import { makeBundle, sandbox, script, treeHash, writeBundle } from "../../scripts/lib/bundle.ts";
import { sysctlTuner } from "../../bundles/steps/sysctl-tuner.ts";
import { ADOPTION, DECKHOUSE } from "../../bundles/deckhouse-node.ts";
import { PATHS } from "../../bundles/paths.ts";
import type { AdoptionRecord } from "../../agent/adopt/record.ts";
import { requireRoot } from "../fixtures/root.ts";
import { createCA } from "../../scripts/lib/pki.ts";
import { NGINX } from "../../steps/kubernetes-api-proxy.ts";
import { layDeckhouseWorker, SERVICE, TIMER } from "../fixtures/deckhouse-node.ts";

await requireRoot("the agent sets root ownership on what it writes");

const AGENT = { name: "bashible", digest: `sha256:${"a".repeat(64)}`, repository: "deckhouse/packages" };
const NODE = "worker-1";
const WANTS = "etc/systemd/system/multi-user.target.wants";

/** A Deckhouse worker with this agent installed where bootstrap puts it, and a bundle for it. */
async function worker(t: Test): Promise<{ root: string; bundle: string; args: string[] }> {
  const root = await sandbox('ID=debian\nVERSION_ID=12\nPRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n', NODE);
  t.teardown(() => rm(root, { recursive: true, force: true }));
  await writeFile(path.join(root, "etc/passwd"), "root:x:0:0:root:/root:/bin/bash\n");
  await writeFile(path.join(root, "etc/group"), "root:x:0:\n");
  await writeFile(path.join(root, "etc/shadow"), "root:*:20000:0:99999:7:::\n");
  await layDeckhouseWorker(root);
  // The agent as the operator installed it before adopting (its package's digest recorded).
  await mkdir(path.join(root, PATHS.agentDir), { recursive: true });
  await writeFile(path.join(root, PATHS.agentDir, "bashible"), "#!/bin/sh\nexit 0\n", { mode: 0o755 });
  await mkdir(path.join(root, PATHS.packageStore, "bashible"), { recursive: true });
  await writeFile(path.join(root, PATHS.packageStore, "bashible/digest"), `${AGENT.digest}\n`);
  const b = makeBundle([
    { name: "004_add_deckhouse_paths", kind: "DeckhousePath", spec: {} },
    {
      name: "041_configure_sysctl_tuner",
      kind: "SysctlTuner",
      spec: { settings: sysctlTuner.defaults, conntrack: sysctlTuner.conntrack },
    },
    {
      name: "080_setup_bashible_service",
      kind: "BashibleService",
      spec: { agent: AGENT, cleanupScript: "#!/bin/bash\necho cleanup\n" },
    },
  ] as never);
  const bundle = await writeBundle(path.dirname(root), b, `${path.basename(root)}-bundle.json`);
  t.teardown(() => rm(bundle, { force: true }));
  return { root, bundle, args: ["--root", root, "--bundle", bundle, "--node-name", NODE] };
}

const actions = async (root: string) =>
  (await readFile(path.join(root, PATHS.sandboxActions), "utf8").catch(() => ""))
    .split("\n")
    .filter(Boolean)
    .map((l) => l.slice(l.indexOf(" ") + 1));
const record = async (root: string) =>
  JSON.parse(await readFile(path.join(root, ADOPTION.record), "utf8")) as AdoptionRecord;
const linked = (root: string, unit: string) =>
  lstat(path.join(root, WANTS, unit)).then(
    () => true,
    () => false,
  );

t.test(
  "--plan shows what adopting changes, diffs against Deckhouse's files included, and changes nothing",
  async (t) => {
    const { root, args } = await worker(t);
    const before = await treeHash(root);
    const r = await bashible(["adopt", "--plan", ...args]);
    t.equal(r.status, 2, `exit 2: adopting would change the node\n${r.stderr}`);
    t.match(r.stdout, "node: Deckhouse's bashible manages this node");
    t.match(r.stdout, `${DECKHOUSE.kubeletDropIn}  (the kubelet's Deckhouse drop-in)`, "what it found, by path");
    t.match(r.stdout, "stop and disable bashible.timer");
    t.match(r.stdout, "replace bashible.service");
    t.match(r.stdout, `    ${DECKHOUSE.serviceFile}\n`, "Deckhouse's unit saved first");
    // The converge's own plan: Deckhouse's oneshot against this agent's daemon, line by line.
    t.match(r.stdout, '-ExecStart=/bin/bash --noprofile --norc -c "/var/lib/bashible/bashible.sh --max-retries 10"');
    t.match(r.stdout, `+ExecStart=${PATHS.agentDir}/bashible run`);
    t.match(r.stdout, "-ExecStart=/opt/deckhouse/bin/sysctl-tuner", "Deckhouse's sysctl tuner unit, diffed");
    t.match(r.stdout, /services that would restart: .*sysctl-tuner\.timer \(restart/);
    t.notMatch(r.stdout, "move /etc/kubernetes/manifests", "the bundle runs no API proxy: the static pod stays");
    t.equal(await treeHash(root), before, "nothing changed, not even state files");
  },
);

t.test("without --yes it refuses, naming the flag, and changes nothing", async (t) => {
  const { root, args } = await worker(t);
  const before = await treeHash(root);
  const r = await bashible(["adopt", ...args]);
  t.equal(r.status, 1);
  t.match(r.stderr, "bashible adopt --yes");
  t.match(r.stderr, "bashible adopt --plan");
  t.equal(await treeHash(root), before);
  const both = await bashible(["adopt", "--yes", "--revert", ...args]);
  t.equal(both.status, 1);
  t.match(both.stderr, "--yes and --revert do not go together");
});

t.test("a machine neither Deckhouse nor this agent set up is refused", async (t) => {
  const root = await sandbox();
  t.teardown(() => rm(root, { recursive: true, force: true }));
  const before = await treeHash(root);
  const r = await bashible(["adopt", "--yes", "--root", root, "--bundle", "/nonexistent.json"]);
  t.equal(r.status, 1);
  t.match(r.stderr, /refusing to adopt: neither Deckhouse's bashible nor this agent manages this node/);
  t.equal(await treeHash(root), before);
});

t.test(
  "--yes stops Deckhouse's timer, saves its files, records the way back; again is a no-op; --revert goes back",
  async (t) => {
    const { root, args } = await worker(t);
    t.ok(await linked(root, DECKHOUSE.timer), "Deckhouse's timer is enabled before");
    const r = await bashible(["adopt", "--yes", ...args]);
    t.equal(r.status, 0, r.stderr);
    t.match(r.stdout, /^adopted: bashible\.timer stopped and disabled, \d+ Deckhouse files saved/m);
    t.notOk(await linked(root, DECKHOUSE.timer), "the timer is disabled");
    t.ok(await linked(root, "bashible.service"), "this agent's daemon is enabled");
    const done = await actions(root);
    t.ok(done.indexOf("systemctl stop bashible.timer") >= 0, "the timer was stopped");
    t.ok(
      done.indexOf("systemctl stop bashible.timer") < done.indexOf("systemctl start bashible.service"),
      "before this agent's daemon started",
    );
    t.match(await readFile(path.join(root, DECKHOUSE.serviceFile), "utf8"), `ExecStart=${PATHS.agentDir}/bashible run`);
    const rec = await record(root);
    t.match(rec, { version: 1, state: "adopted", nodeName: NODE, nodeGroup: "worker", stopped: ["bashible.timer"] });
    t.equal(rec.converge?.outcome, "applied");
    const saved = Object.fromEntries(rec.saved.map((s) => [s.path, s.copy]));
    t.equal(
      await readFile(path.join(root, saved[DECKHOUSE.serviceFile]!), "utf8"),
      SERVICE,
      "Deckhouse's unit, as it was",
    );
    t.equal(await readFile(path.join(root, saved[DECKHOUSE.timerFile]!), "utf8"), TIMER);
    t.ok(rec.created.includes(PATHS.agentLauncher), "what adoption created is listed");
    t.match(rec.revertByHand.at(-1), "systemctl enable --now bashible.timer", "the way back, by hand");

    const afterAdopt = await treeHash(root);
    const again = await bashible(["adopt", "--yes", ...args]);
    t.equal(again.status, 0, again.stderr);
    t.match(again.stdout, /^already adopted: adopted from Deckhouse at /);
    t.equal(await treeHash(root), afterAdopt, "a second adopt changes nothing");
    const plan = await bashible(["adopt", "--plan", ...args]);
    t.equal(plan.status, 0);
    t.match(plan.stdout, "already adopted");

    const back = await bashible(["adopt", "--revert", "--root", root]);
    t.equal(back.status, 0, back.stderr);
    t.match(back.stdout, "reverted: bashible.service stopped and disabled, bashible.timer enabled and started");
    t.ok(await linked(root, DECKHOUSE.timer), "Deckhouse's timer is enabled again");
    t.notOk(await linked(root, "bashible.service"), "this agent's daemon is not");
    const reverted = (await actions(root)).slice(done.length);
    t.ok(reverted.includes("systemctl stop bashible.service"), "this agent's daemon was stopped");
    t.equal(reverted.at(-1), "systemctl start bashible.timer", "and Deckhouse's timer started, last");
    t.equal(await readFile(path.join(root, DECKHOUSE.serviceFile), "utf8"), SERVICE, "Deckhouse's unit is back");
    t.notOk(existsSync(path.join(root, PATHS.agentLauncher)), "what adoption created is gone");
    t.equal((await record(root)).state, "reverted");
    const twice = await bashible(["adopt", "--revert", "--root", root]);
    t.equal(twice.status, 0);
    t.match(twice.stdout, "already reverted");

    // Given back, the node is Deckhouse's again: it can be adopted anew.
    const replan = await bashible(["adopt", "--plan", ...args]);
    t.equal(replan.status, 2, replan.stderr);
  },
);

const KUBELET = path.join(process.env.BASHIBLE_TEST_CACHE ?? "/var/cache/bashible-test", "k8s-v1.34.4/kubelet");

t.test(
  "the kubelet over Deckhouse's: its drop-in removed in the plan, one restart, its certificates and kubeconfig kept",
  { skip: !existsSync(KUBELET) && `needs ${KUBELET} (scripts/test-binaries.sh)` },
  async (t) => {
    const { root, bundle } = await worker(t);
    const work = await mkdtemp(path.join(os.tmpdir(), "adopt-kubelet-"));
    t.teardown(() => rm(work, { recursive: true, force: true }));
    const ca = await readFile((await createCA(work, "cluster-ca")).cert, "utf8");
    // Deckhouse's kubelet binary is the real one; its package digest as Deckhouse's packages record it.
    await rm(path.join(root, PATHS.binDir, "kubelet"));
    await copyFile(KUBELET, path.join(root, PATHS.binDir, "kubelet"));
    await mkdir(path.join(root, PATHS.packageStore, "kubelet"), { recursive: true });
    await writeFile(path.join(root, PATHS.packageStore, "kubelet/digest"), `sha256:${"1".repeat(64)}\n`);
    await writeFile(path.join(root, "etc/kubernetes/pki/ca.crt"), ca);
    const kubelet = {
      name: "064_configure_kubelet",
      kind: "Kubelet",
      spec: {
        cgroupDriver: "systemd",
        clusterDNS: ["10.222.0.10"],
        clusterDomain: "cluster.local",
        maxPods: 110,
        containerLogMaxSize: "50Mi",
        containerLogMaxFiles: 4,
        nodeStatusUpdateFrequencySeconds: 10,
        providerID: "static://",
        resourceReservation: { mode: "Off" },
        featureGates: {},
        registerLabels: { "node.deckhouse.io/group": "worker", "node.deckhouse.io/type": "Static" },
        registerTaints: [{ key: "node.deckhouse.io/uninitialized", effect: "NoSchedule" }],
        apiServer: "https://127.0.0.1:6445",
        package: "kubelet",
      },
    };
    const base = JSON.parse(await readFile(bundle, "utf8"));
    const b = makeBundle([...base.steps, kubelet] as never, { context: { clusterCA: ca } });
    await writeFile(bundle, JSON.stringify(b));
    const args = ["--root", root, "--bundle", bundle, "--node-name", NODE];
    const certs = ["/var/lib/kubelet/pki/kubelet-client-2026-11-01-10-00-00.pem", "/etc/kubernetes/kubelet.conf"];
    const before = await Promise.all(certs.map((c) => readFile(path.join(root, c), "utf8")));

    const plan = await bashible(["adopt", "--plan", ...args]);
    t.equal(plan.status, 2, plan.stderr.slice(-3000));
    t.match(plan.stdout, `delete ${DECKHOUSE.kubeletDropIn}`, "Deckhouse's drop-in goes");
    t.match(plan.stdout, "-ExecStart=/opt/deckhouse/bin/d8-kubelet-forker /opt/deckhouse/bin/kubelet \\");
    t.match(
      plan.stdout,
      new RegExp(`services that would restart: .*kubelet\\.service \\(restart: [^)]*${DECKHOUSE.kubeletDropIn}`),
    );
    t.match(plan.stdout, `    ${DECKHOUSE.kubeletDropIn}\n`, "and is saved first");
    for (const c of certs) t.notMatch(plan.stdout, `    ${c}\n`, `${c} is not among what changes`);

    const r = await bashible(["adopt", "--yes", ...args]);
    t.equal(r.status, 0, r.stderr.slice(-3000));
    t.notOk(existsSync(path.join(root, DECKHOUSE.kubeletDropIn)), "the drop-in is gone");
    const rec = await record(root);
    const copy = rec.saved.find((s) => s.path === DECKHOUSE.kubeletDropIn)?.copy;
    t.match(
      await readFile(path.join(root, copy ?? "/nonexistent"), "utf8"),
      "--node-labels=node.deckhouse.io/group=worker",
    );
    t.same(
      await Promise.all(certs.map((c) => readFile(path.join(root, c), "utf8"))),
      before,
      "certificate and kubeconfig as they were",
    );
    t.equal(
      (await actions(root)).filter((a) => a === "systemctl restart kubelet.service").length,
      1,
      "one kubelet restart",
    );

    const back = await bashible(["adopt", "--revert", "--root", root]);
    t.equal(back.status, 0, back.stderr);
    t.match(
      await readFile(path.join(root, DECKHOUSE.kubeletDropIn), "utf8"),
      "d8-kubelet-forker",
      "the drop-in is back",
    );
    t.notOk(
      existsSync(path.join(root, "etc/systemd/system/kubelet.service")),
      "this agent's kubelet unit is gone: the package's serves again",
    );
    t.match(
      back.stdout,
      "still running with this agent's settings until they restart: ",
      "and it says the kubelet runs on",
    );
    t.match(back.stdout, "kubelet.service");
  },
);

const NGINX_FILES = [NGINX.debian.binary, NGINX.debian.streamModule];

t.test(
  "a bundle that runs the API proxy moves Deckhouse's static pod aside; revert puts it back",
  { skip: NGINX_FILES.some((f) => !existsSync(f)) && "needs nginx-light and libnginx-mod-stream" },
  async (t) => {
    const { root, bundle } = await worker(t);
    for (const p of NGINX_FILES) {
      await mkdir(path.dirname(path.join(root, p)), { recursive: true });
      await copyFile(p, path.join(root, p));
    }
    const proxy = {
      name: "000_configure_kubernetes_api_proxy",
      kind: "KubernetesApiProxy",
      spec: { listen: "127.0.0.1:6445", upstreams: ["10.213.0.1:6443"] },
    };
    const base = JSON.parse(await readFile(bundle, "utf8"));
    await writeFile(bundle, JSON.stringify(makeBundle([...base.steps, proxy] as never)));
    const args = ["--root", root, "--bundle", bundle, "--node-name", NODE];
    const manifest = path.join(root, DECKHOUSE.apiProxyManifest);
    const original = await readFile(manifest, "utf8");

    const plan = await bashible(["adopt", "--plan", ...args]);
    t.equal(plan.status, 2, plan.stderr.slice(-2000));
    t.match(plan.stdout, `move ${DECKHOUSE.apiProxyManifest} to ${ADOPTION.saved}${DECKHOUSE.apiProxyManifest}`);
    t.ok(existsSync(manifest), "--plan moved nothing");

    const r = await bashible(["adopt", "--yes", ...args]);
    t.equal(r.status, 0, r.stderr.slice(-2000));
    t.notOk(existsSync(manifest), "the kubelet's manifest is gone: it stops Deckhouse's proxy pod");
    t.equal(await readFile(path.join(root, ADOPTION.saved, DECKHOUSE.apiProxyManifest), "utf8"), original);
    t.match((await record(root)).movedManifest, { path: DECKHOUSE.apiProxyManifest });
    t.ok(await linked(root, "kubernetes-api-proxy.service"), "this agent's proxy unit takes its place");

    const back = await bashible(["adopt", "--revert", "--root", root]);
    t.equal(back.status, 0, back.stderr);
    t.equal(await readFile(manifest, "utf8"), original, "the static pod is back");
    t.notOk(await linked(root, "kubernetes-api-proxy.service"), "and the unit is off");
    const acts = await actions(root);
    t.ok(
      acts.lastIndexOf("systemctl stop kubernetes-api-proxy.service") <
        acts.lastIndexOf("systemctl start bashible.timer"),
      "the unit stops before Deckhouse's timer comes back",
    );
  },
);

t.test(
  "an adoption whose converge fails stays resumable: the timer off, Deckhouse's copies kept as they were",
  async (t) => {
    const { root, bundle } = await worker(t);
    const base = JSON.parse(await readFile(bundle, "utf8"));
    // A script step runs on this machine, not under --root: its switch is a file of the test's own.
    const fixed = `${root}.fixed`;
    t.teardown(() => rm(fixed, { force: true }));
    const failing = script("090_fails_until_fixed", `test -e ${fixed} || { echo 'not yet' >&2; exit 1; }\n`);
    await writeFile(bundle, JSON.stringify(makeBundle([...base.steps, failing] as never)));
    const args = ["--root", root, "--bundle", bundle, "--node-name", NODE, "--max-retries", "1"];

    const r = await bashible(["adopt", "--yes", ...args]);
    t.equal(r.status, 1, "the converge failed");
    t.match(r.stderr, "run 'bashible adopt --yes' again (it resumes), or 'bashible adopt --revert'");
    t.equal((await record(root)).state, "adopting");
    t.notOk(await linked(root, DECKHOUSE.timer), "Deckhouse's timer stays off");
    // 080 ran before the failing step: the live unit is this agent's, the copy is still Deckhouse's.
    t.match(await readFile(path.join(root, DECKHOUSE.serviceFile), "utf8"), `${PATHS.agentDir}/bashible run`);
    const plan = await bashible(["adopt", "--plan", ...args]);
    t.match(plan.stdout, "an adoption started at");

    await writeFile(fixed, "");
    const resumed = await bashible(["adopt", "--yes", ...args]);
    t.equal(resumed.status, 0, resumed.stderr.slice(-2000));
    const rec = await record(root);
    t.equal(rec.state, "adopted");
    const copy = rec.saved.find((s) => s.path === DECKHOUSE.serviceFile)?.copy ?? "/nonexistent";
    t.equal(await readFile(path.join(root, copy), "utf8"), SERVICE, "the copy is Deckhouse's unit, not this agent's");

    const back = await bashible(["adopt", "--revert", "--root", root]);
    t.equal(back.status, 0, back.stderr);
    t.equal(await readFile(path.join(root, DECKHOUSE.serviceFile), "utf8"), SERVICE, "so revert puts Deckhouse's back");
  },
);
