// `bashible adopt` on a booted Debian node (systemd-nspawn) laid out as Deckhouse v1.66 leaves a
// worker (test/fixtures/deckhouse-node.ts), where Deckhouse's bashible.timer really runs: --plan
// shows the diff and changes nothing; without --yes it refuses; --yes stops and disables the
// timer, starts this agent's daemon under the same unit name and records the way back; a second
// adopt changes nothing; --revert puts Deckhouse's unit back and its timer runs bashible.sh
// again. Then cleanup_static_node.sh on an adopted node removes what Deckhouse left (the sysctl
// tuner, d8-shutdown-inhibitor, the deckhouse user, upmeter) and wipes the kubelet's separately
// mounted volume, leaving a volume mounted below it untouched.
//
// Not here (see docs/operating.md, "Moving a node from Deckhouse"): a real kubelet and containerd
// running a pod through the adoption against a control plane. The agent is a build of this
// checkout, in local mode (a bundle file); its daemon, started by the converge, runs in API mode
// and finds no API server (the fixture's kubeconfig points at 127.0.0.1:6445): it keeps retrying.
import t, { type Test } from "tap";
import { cp, mkdir, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { existsSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { buildDist } from "../../scripts/build.ts";
import { makeBundle } from "../../scripts/lib/bundle.ts";
import { type NspawnNode, nodeForTest } from "../../scripts/lib/nspawn-node.ts";
import { runScript } from "../../scripts/lib/e2e/world.ts";
import { until } from "../../scripts/lib/until.ts";
import { sysctlTuner } from "../../bundles/steps/sysctl-tuner.ts";
import { ADOPTION, DECKHOUSE } from "../../bundles/deckhouse-node.ts";
import { PATHS } from "../../bundles/paths.ts";
import { loadConfigDir } from "../../cluster/sources/directory.ts";
import { renderGroup } from "../../cluster/render/render.ts";
import type { NodeGroupObject, RenderInputs } from "../../cluster/render/inputs.ts";
import { layDeckhouseWorker, RUNS_LOG, SERVICE } from "../fixtures/deckhouse-node.ts";

const skip =
  process.getuid?.() !== 0
    ? "needs root (boots a systemd-nspawn node)"
    : !existsSync("/usr/bin/systemd-nspawn")
      ? "needs systemd-nspawn (apt-get install systemd-container debootstrap)"
      : false;

const NODE = "worker-1";
const AGENT = { name: "bashible", digest: `sha256:${"a".repeat(64)}`, repository: "deckhouse/packages" };
const CLEANUP_FLAG = "--yes-i-am-sane-and-i-understand-what-i-am-doing";
const EXAMPLE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../examples/cluster");

/** cleanup_static_node.sh as the bundle server renders it for the example's worker group. */
async function cleanupScript(): Promise<string> {
  const base = (await loadConfigDir(EXAMPLE)).snapshot.inputs as RenderInputs;
  const ng = structuredClone(base.nodeGroups.find((g) => g.metadata.name === "worker")!) as NodeGroupObject;
  const r = renderGroup(ng, { ...structuredClone(base), nodeGroups: [ng] }, Date.now());
  return (r.bashible.data as Record<string, string>)["cleanup_static_node.sh"]!;
}

const bundle = (cleanup: string) =>
  makeBundle([
    { name: "004_add_deckhouse_paths", kind: "DeckhousePath", spec: {} },
    {
      name: "041_configure_sysctl_tuner",
      kind: "SysctlTuner",
      spec: { settings: sysctlTuner.defaults, conntrack: sysctlTuner.conntrack },
    },
    { name: "080_setup_bashible_service", kind: "BashibleService", spec: { agent: AGENT, cleanupScript: cleanup } },
  ] as never);

const prop = async (node: NspawnNode, unit: string, name: string) =>
  (await node.mustExec(["systemctl", "show", `--property=${name}`, "--value", unit])).stdout.trim();
const enabled = async (node: NspawnNode, unit: string) =>
  (await node.exec(["systemctl", "is-enabled", unit])).stdout.trim();

/** A node laid out as Deckhouse's worker, with this checkout's agent installed where bootstrap puts it. */
async function deckhouseNode(
  t: Test,
  name: string,
  o: { dist: string; nspawnArgs?: string[]; restartOnReboot?: boolean; kubeletOnVolume?: boolean },
): Promise<NspawnNode> {
  return nodeForTest(t, {
    name,
    ...(o.nspawnArgs ? { nspawnArgs: o.nspawnArgs } : {}),
    ...(o.restartOnReboot ? { restartOnReboot: true } : {}),
    async beforeBoot(rootfs) {
      await layDeckhouseWorker(rootfs);
      await writeFile(path.join(rootfs, "etc/hostname"), `${NODE}\n`);
      await cp(o.dist, path.join(rootfs, PATHS.agentDir), { recursive: true });
      await mkdir(path.join(rootfs, PATHS.packageStore, "bashible"), { recursive: true });
      await writeFile(path.join(rootfs, PATHS.packageStore, "bashible/digest"), `${AGENT.digest}\n`);
    },
  });
}

t.test("adopt on a node Deckhouse's bashible runs: plan, refuse, adopt, no-op, revert", { skip }, async (t) => {
  const work = await mkdtemp(path.join(os.tmpdir(), "adopt-node-"));
  t.teardown(() => rm(work, { recursive: true, force: true }));
  const dist = path.join(work, "dist");
  await buildDist(dist);
  const node = await deckhouseNode(t, "bn-adopt", { dist });
  await node.writeFile("/root/bundle.json", JSON.stringify(bundle("#!/bin/bash\necho cleanup\n")));
  const adopt = (args: string[]) =>
    node.exec([`${PATHS.agentDir}/bashible`, "adopt", ...args, "--bundle", "/root/bundle.json", "--node-name", NODE], {
      timeoutMs: 300_000,
    });

  t.equal(await enabled(node, DECKHOUSE.timer), "enabled", "Deckhouse's timer is enabled");
  t.equal(await prop(node, DECKHOUSE.timer, "ActiveState"), "active", "and running");
  t.match(await prop(node, DECKHOUSE.service, "ExecStart"), DECKHOUSE.entry, "its service runs bashible.sh");

  const snapshot = async () =>
    (
      await node.mustExec([
        "sh",
        "-c",
        "find /etc/systemd /var/lib/bashible /opt/deckhouse/bin -path /var/lib/bashible/deckhouse-runs.log -prune -o -print0 | sort -z | xargs -0 ls -ld --time-style=+%s.%N",
      ])
    ).stdout;
  const before = await snapshot();
  const planned = await adopt(["--plan"]);
  t.equal(planned.exitCode, 2, planned.stderr.slice(-2000));
  t.match(planned.stdout, "-ExecStart=/bin/bash --noprofile --norc");
  t.match(planned.stdout, `+ExecStart=${PATHS.agentDir}/bashible run`);
  t.match(planned.stdout, "stop and disable bashible.timer");
  t.equal(await snapshot(), before, "--plan changed nothing");
  t.equal(await enabled(node, DECKHOUSE.timer), "enabled");

  const refused = await adopt([]);
  t.equal(refused.exitCode, 1);
  t.match(refused.stderr, "'bashible adopt --yes'");
  t.equal(await snapshot(), before, "refused: nothing changed");

  const adopted = await adopt(["--yes"]);
  t.equal(adopted.exitCode, 0, adopted.stderr.slice(-3000));
  t.match(adopted.stdout, "adopted: bashible.timer stopped and disabled");
  t.equal(await enabled(node, DECKHOUSE.timer), "disabled", "Deckhouse's timer is disabled");
  t.equal(await prop(node, DECKHOUSE.timer, "ActiveState"), "inactive", "and stopped");
  t.match(await prop(node, DECKHOUSE.service, "ExecStart"), `${PATHS.agentDir}/bashible run`);
  await until(
    "this agent's daemon to run",
    async () => (await prop(node, DECKHOUSE.service, "ActiveState")) === "active",
    60_000,
  );
  t.equal(await enabled(node, DECKHOUSE.service), "enabled", "this agent's daemon is enabled");
  const record = JSON.parse((await node.mustExec(["cat", ADOPTION.record])).stdout);
  t.match(record, { state: "adopted", stopped: [DECKHOUSE.timer], converge: { outcome: "applied" } });
  const savedService = record.saved.find((s: { path: string }) => s.path === DECKHOUSE.serviceFile);
  t.equal(
    (await node.mustExec(["cat", savedService.copy])).stdout,
    SERVICE,
    "Deckhouse's unit is kept for the way back",
  );

  // bashible-restart restarts the daemon once the converge it reloaded has finished: wait for it
  // to settle, so the second adopt's no-op is measured against a quiet node.
  await until(
    "bashible-restart.service to finish",
    async () => {
      const finished = await node.exec(["journalctl", "-q", "-u", "bashible-restart.service", "-g", "^Finished"]);
      return (
        (await prop(node, "bashible-restart.service", "ActiveState")) === "inactive" && finished.stdout.trim() !== ""
      );
    },
    60_000,
  );
  const recordBefore = (await node.mustExec(["cat", ADOPTION.record])).stdout;
  const unitBefore = (await node.mustExec(["cat", DECKHOUSE.serviceFile])).stdout;
  const again = await adopt(["--yes"]);
  t.equal(again.exitCode, 0, again.stderr.slice(-2000));
  t.match(again.stdout, "already adopted");
  t.equal((await node.mustExec(["cat", ADOPTION.record])).stdout, recordBefore, "the record is as it was");
  t.equal((await node.mustExec(["cat", DECKHOUSE.serviceFile])).stdout, unitBefore, "the unit too");
  t.equal(await enabled(node, DECKHOUSE.timer), "disabled", "the timer stays off");

  const runsBefore = (await node.exec(["cat", RUNS_LOG])).stdout;
  const back = await node.exec([`${PATHS.agentDir}/bashible`, "adopt", "--revert"], { timeoutMs: 120_000 });
  t.equal(back.exitCode, 0, back.stderr.slice(-2000));
  t.equal(await enabled(node, DECKHOUSE.timer), "enabled", "Deckhouse's timer is enabled again");
  t.equal(await prop(node, DECKHOUSE.timer, "ActiveState"), "active");
  t.match(await prop(node, DECKHOUSE.service, "ExecStart"), DECKHOUSE.entry, "Deckhouse's bashible.service is back");
  // The event the revert exists for: Deckhouse's bashible runs again, from its timer.
  await until(
    "Deckhouse's bashible.sh to run from its timer",
    async () => (await node.exec(["cat", RUNS_LOG])).stdout.length > runsBefore.length,
    150_000,
  );
  t.pass("Deckhouse's timer ran bashible.sh");
});

t.test(
  "cleanup_static_node.sh on an adopted node removes what Deckhouse left and wipes the kubelet's own volume",
  { skip },
  async (t) => {
    const work = await mkdtemp(path.join(os.tmpdir(), "adopt-cleanup-"));
    t.teardown(() => rm(work, { recursive: true, force: true }));
    const dist = path.join(work, "dist");
    await buildDist(dist);
    // /var/lib/kubelet on a volume of its own (a host directory bound in), and a pod's CSI volume
    // mounted below it: the first is the node's data, the second is not.
    const kubeletVolume = path.join(work, "kubelet-volume");
    const csiVolume = path.join(work, "csi-volume");
    const csiMount = "/var/lib/kubelet/pods/0d6c/volumes/kubernetes.io~csi/pv-1/mount";
    await mkdir(path.join(kubeletVolume, "pki"), { recursive: true });
    await mkdir(path.join(kubeletVolume, csiMount.slice("/var/lib/kubelet/".length)), { recursive: true });
    await writeFile(path.join(kubeletVolume, "pki/kubelet-client-current.pem"), "node data\n");
    await mkdir(csiVolume, { recursive: true });
    await writeFile(path.join(csiVolume, "precious"), "a tenant's data\n");
    const script = await cleanupScript();
    const node = await deckhouseNode(t, "bn-adopt-clean", {
      dist,
      restartOnReboot: true,
      nspawnArgs: [`--bind=${kubeletVolume}:/var/lib/kubelet`, `--bind=${csiVolume}:${csiMount}`],
    });
    await node.writeFile("/root/bundle.json", JSON.stringify(bundle(script)));
    const adopted = await node.exec(
      [`${PATHS.agentDir}/bashible`, "adopt", "--yes", "--bundle", "/root/bundle.json", "--node-name", NODE],
      { timeoutMs: 300_000 },
    );
    t.equal(adopted.exitCode, 0, adopted.stderr.slice(-3000));
    t.equal(
      (await node.mustExec(["cat", PATHS.cleanupScript])).stdout,
      script,
      "the adopted node carries this agent's cleanup",
    );
    t.equal((await node.exec(["id", "-u", DECKHOUSE.user.name])).stdout.trim(), String(DECKHOUSE.user.id));

    const bootsBefore = node.boots;
    const run = await runScript(node, "cleanup_static_node.sh", script, [CLEANUP_FLAG]);
    t.equal(run.exitCode, 0, run.output.slice(-3000));
    // Before the reboot: nspawn makes the CSI volume's mount point again when it boots the node.
    t.same(await readdir(kubeletVolume), [], "the kubelet's own volume is wiped");
    t.equal(
      await readFile(path.join(csiVolume, "precious"), "utf8"),
      "a tenant's data\n",
      "the volume below it is not",
    );
    await node.waitBoot(bootsBefore + 1, 120_000);
    t.pass("the node rebooted");
    for (const p of [
      "/lib/systemd/system/d8-shutdown-inhibitor.service",
      "/etc/systemd/logind.conf.d/99-node-d8-shutdown-inhibitor.conf",
      "/etc/systemd/system/sysctl-tuner.timer",
      "/etc/systemd/system/sysctl-tuner.service",
      DECKHOUSE.timerFile,
      DECKHOUSE.kubeletDropIn,
      DECKHOUSE.kubeletPackageUnit,
      "/var/lib/upmeter",
      "/opt/deckhouse",
      PATHS.stateDir,
    ]) {
      t.equal((await node.exec(["test", "-e", p])).exitCode, 1, `${p} is gone`);
    }
    t.equal((await node.exec(["id", DECKHOUSE.user.name])).exitCode, 1, "the deckhouse user is gone");
    t.equal((await node.exec(["getent", "group", DECKHOUSE.user.name])).exitCode, 2, "and its group");
  },
);
