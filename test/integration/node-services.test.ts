// The node software steps on a booted Debian node (systemd-nspawn), where the units really run:
// the agent converges the API proxy (nginx), containerd and its own service from scratch; the
// units start; a second converge restarts nothing; a changed upstream list reloads nginx (same
// main process, new upstream served) and touches nothing else; a new sandbox image restarts
// containerd and nothing else; a converge run by the daemon that rewrites the agent's own unit
// finishes, and only then is the daemon restarted.
//
// The node is the cached node root; nginx and its stream module, containerd, runc and crictl are
// this machine's Debian binaries copied in (the same bookworm libraries), the agent is a build of
// this checkout installed where bootstrap puts it.
import t from "tap";
import { cp, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { existsSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { buildDist } from "../../scripts/build.ts";
import { startUpstreams } from "../../scripts/lib/api-proxy.ts";
import { makeBundle } from "../../scripts/lib/bundle.ts";
import { CRICTL } from "../fixtures/containerd.ts";
import { LAUNCHER_CONTENT } from "../../steps/bashible-service.ts";
import { type NspawnNode, nodeForTest } from "../../scripts/lib/nspawn-node.ts";
import { PATHS } from "../../bundles/paths.ts";
import type { BundleStep, NodeGroupBundle } from "../../bundles/types.ts";

const HOST_BINARIES = {
  "/usr/sbin/nginx": "/usr/sbin/nginx",
  "/usr/lib/nginx/modules/ngx_stream_module.so": "/usr/lib/nginx/modules/ngx_stream_module.so",
  "/usr/bin/containerd": `${PATHS.binDir}/containerd`,
  "/usr/bin/containerd-shim-runc-v2": `${PATHS.binDir}/containerd-shim-runc-v2`,
  "/usr/sbin/runc": `${PATHS.binDir}/runc`,
  [CRICTL]: `${PATHS.binDir}/crictl`,
};
const missing = Object.keys(HOST_BINARIES).filter((p) => !existsSync(p));
const skip =
  process.getuid?.() !== 0
    ? "needs root (boots a systemd-nspawn node)"
    : missing.length
      ? `needs ${missing.join(", ")} (apt-get install nginx-light libnginx-mod-stream containerd runc; npm run package crictl)`
      : !existsSync("/usr/bin/systemd-nspawn")
        ? "needs systemd-nspawn (apt-get install systemd-container debootstrap)"
        : false;

const AGENT = { name: "bashible", digest: `sha256:${"a".repeat(64)}`, repository: "deckhouse/packages" };
const NODE = "worker-1";

function bundle(o: { upstreams: string[]; sandboxImage: string }): NodeGroupBundle {
  const steps: BundleStep[] = [
    {
      name: "000_configure_kubernetes_api_proxy",
      kind: "KubernetesApiProxy",
      spec: { listen: "127.0.0.1:6445", upstreams: o.upstreams },
    },
    {
      name: "032_configure_containerd",
      kind: "Containerd",
      spec: {
        cgroupDriver: "systemd",
        sandboxImage: o.sandboxImage,
        snapshotter: "overlayfs",
        maxConcurrentDownloads: 3,
        registries: [],
        package: "containerd",
      },
    },
    {
      name: "080_setup_bashible_service",
      kind: "BashibleService",
      spec: { agent: AGENT, cleanupScript: "#!/bin/bash\necho cleanup\n" },
    },
  ];
  return makeBundle(steps);
}

const show = async (node: NspawnNode, unit: string, props: string[]) => {
  const out = (await node.mustExec(["systemctl", "show", `--property=${props.join(",")}`, unit])).stdout;
  return Object.fromEntries(
    out
      .trim()
      .split("\n")
      .map((l) => [l.slice(0, l.indexOf("=")), l.slice(l.indexOf("=") + 1)]),
  );
};
const mainPid = async (node: NspawnNode, unit: string) => (await show(node, unit, ["MainPID"])).MainPID;

async function status(
  node: NspawnNode,
): Promise<{ appliedChecksum?: string; lastRun?: { outcome: string; finishedAt: string; checksum: string } }> {
  const r = await node.exec(["cat", PATHS.status]);
  return r.exitCode === 0 ? JSON.parse(r.stdout) : {};
}

/** Polls until `check` holds (the event the test waits for), at most `ms`. */
async function until<T>(what: string, ms: number, check: () => Promise<T | undefined | false>): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await check();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

t.test(
  "node services: converge from scratch, no-op re-run, reload and restart only what changed",
  { skip },
  async (t) => {
    const work = await mkdtemp(path.join(os.tmpdir(), "node-services-"));
    t.teardown(() => rm(work, { recursive: true, force: true }));
    const dist = path.join(work, "dist");
    await buildDist(dist);
    const node = await nodeForTest(t, {
      name: "bn-svc",
      async beforeBoot(rootfs) {
        for (const [src, dest] of Object.entries(HOST_BINARIES)) {
          await mkdir(path.dirname(path.join(rootfs, dest)), { recursive: true });
          await cp(src, path.join(rootfs, dest));
        }
        await cp(dist, path.join(rootfs, PATHS.agentDir), { recursive: true });
        await writeFile(path.join(rootfs, PATHS.agentLauncher), LAUNCHER_CONTENT, { mode: 0o755 });
        for (const [pkg, digest] of [
          ["bashible", AGENT.digest],
          ["containerd", `sha256:${"c".repeat(64)}`],
        ]) {
          await mkdir(path.join(rootfs, PATHS.packageStore, pkg as string), { recursive: true });
          await writeFile(path.join(rootfs, PATHS.packageStore, pkg as string, "digest"), `${digest}\n`);
        }
        // The daemon in local mode, on the bundle file the test writes (a drop-in, as an admin would).
        await mkdir(path.join(rootfs, "etc/systemd/system/bashible.service.d"), { recursive: true });
        await writeFile(
          path.join(rootfs, "etc/systemd/system/bashible.service.d/local.conf"),
          `[Service]\nExecStart=\nExecStart=${PATHS.agentDir}/bashible run --bundle /root/bundle.json --node-name ${NODE} --tick 3600\n`,
        );
      },
    });
    const ups = await startUpstreams(work, ["a", "b"], node.hostAddress);
    t.teardown(() => ups.close());
    await node.writeFile("/root/upstreams-ca.crt", ups.ca);
    const [a, b] = ups.list as [(typeof ups.list)[0], (typeof ups.list)[0]];
    const agent = (args: string[]) =>
      node.exec([PATHS.agentLauncher, ...args, "--bundle", "/root/bundle.json", "--node-name", NODE], {
        timeoutMs: 300_000,
      });
    const throughProxy = async () =>
      (
        await node.mustExec([
          "curl",
          "-sS",
          "--max-time",
          "10",
          "--cacert",
          "/root/upstreams-ca.crt",
          "https://127.0.0.1:6445/id",
        ])
      ).stdout;

    // From scratch, as bootstrap's first converge.
    const v1 = bundle({ upstreams: [a.endpoint], sandboxImage: "registry.example.test/pause:3.10" });
    await node.writeFile("/root/bundle.json", JSON.stringify(v1));
    const first = await agent(["once"]);
    t.equal(first.exitCode, 0, first.stderr.slice(-3000));
    for (const unit of ["kubernetes-api-proxy.service", "containerd-deckhouse.service", "bashible.service"]) {
      t.match(
        await show(node, unit, ["ActiveState", "UnitFileState"]),
        { ActiveState: "active", UnitFileState: "enabled" },
        `${unit} runs and is enabled`,
      );
    }
    t.equal(await throughProxy(), "a", "the proxy on 127.0.0.1:6445 reaches the API server");
    const info = JSON.parse(
      (
        await node.mustExec([
          `${PATHS.binDir}/crictl`,
          "--runtime-endpoint",
          `unix://${PATHS.containerdSocket}`,
          "info",
        ])
      ).stdout,
    );
    t.equal(
      info.config.sandboxImage,
      "registry.example.test/pause:3.10",
      "containerd serves CRI with the bundle's settings",
    );
    // 080 reloaded the agent it had just started: bashible-restart restarts it once the converge ended.
    const firstDone = Date.parse((await status(node)).lastRun?.finishedAt ?? "");
    await until("bashible-restart.service to finish", 60_000, async () => {
      const s = await show(node, "bashible-restart.service", ["ActiveState", "Result"]);
      const finished = await node.exec(["journalctl", "-q", "-u", "bashible-restart.service", "-g", "^Finished"]);
      return s.ActiveState === "inactive" && s.Result === "success" && finished.stdout.trim() !== "";
    });
    const restartedAt = (await show(node, "bashible.service", ["ActiveEnterTimestamp"])).ActiveEnterTimestamp;
    t.ok(
      Date.parse(restartedAt ?? "") >= Math.floor(firstDone / 1000) * 1000,
      `the daemon was restarted after the converge finished (${restartedAt})`,
    );
    await until(
      "the daemon to be running",
      30_000,
      async () => (await show(node, "bashible.service", ["ActiveState"])).ActiveState === "active",
    );

    // Nothing to do: a plan says so, a forced run changes and restarts nothing.
    t.equal((await agent(["plan"])).exitCode, 0, "in sync");
    const pids = async () => ({
      nginx: await mainPid(node, "kubernetes-api-proxy.service"),
      containerd: await mainPid(node, "containerd-deckhouse.service"),
      agent: await mainPid(node, "bashible.service"),
    });
    const before = await pids();

    // The daemon converges each new bundle (it watches the file); the test waits for the run that
    // started after the write to finish.
    const converge = async (b: NodeGroupBundle) => {
      const since = Date.now();
      await node.writeFile("/root/bundle.json", JSON.stringify(b));
      return until(`the daemon to apply ${b.checksum.slice(0, 12)}`, 120_000, async () => {
        const s = await status(node);
        const run = s.lastRun;
        if (!run || run.checksum !== b.checksum || Date.parse(run.finishedAt) < since) return false;
        if (run.outcome !== "applied" && run.outcome !== "in-sync") throw new Error(JSON.stringify(run));
        return s;
      });
    };
    const nginxReloads = async () =>
      (await node.exec(["journalctl", "-q", "-u", "kubernetes-api-proxy.service", "-g", "Reload"])).stdout
        .split("\n")
        .filter(Boolean).length;

    // A forced run (configuration_checksum removed) finds nothing to do: nothing restarts or reloads.
    const reloadsAtStart = await nginxReloads();
    await node.mustExec(["rm", "-f", PATHS.configurationChecksum]);
    t.equal((await converge(v1)).lastRun?.outcome, "applied", "the forced run went through");
    t.same(await pids(), before, "and restarted nothing");
    t.equal(await nginxReloads(), reloadsAtStart, "and reloaded nothing");

    // New upstreams: nginx reloads (same main process) and serves b; nothing else moves.
    const reloadsBefore = await nginxReloads();
    const v2 = bundle({ upstreams: [b.endpoint], sandboxImage: "registry.example.test/pause:3.10" });
    await converge(v2);
    t.same(await pids(), before, "reloaded, not restarted: nginx, containerd and the agent keep their processes");
    t.ok((await nginxReloads()) > reloadsBefore, "nginx was reloaded");
    t.equal(
      await until("the new upstream through the proxy", 30_000, async () => (await throughProxy()) === "b" && "b"),
      "b",
    );

    // A new sandbox image: containerd restarts, nginx and the agent do not.
    const v3 = bundle({ upstreams: [b.endpoint], sandboxImage: "registry.example.test/pause:3.11" });
    await converge(v3);
    const after = await pids();
    t.not(after.containerd, before.containerd, "containerd restarted");
    t.equal(after.nginx, before.nginx, "nginx untouched");
    t.equal(after.agent, before.agent, "the agent untouched");
    const info3 = JSON.parse(
      (
        await node.mustExec([
          `${PATHS.binDir}/crictl`,
          "--runtime-endpoint",
          `unix://${PATHS.containerdSocket}`,
          "info",
        ])
      ).stdout,
    );
    t.equal(info3.config.sandboxImage, "registry.example.test/pause:3.11");

    // The agent's own unit drifted: the daemon's converge puts it back and reloads the service;
    // the converge finishes ("applied") and only then is the daemon restarted.
    await node.mustExec([
      "sh",
      "-c",
      "echo '# edited by hand' >> /etc/systemd/system/bashible.service && rm -f /var/lib/bashible/configuration_checksum",
    ]);
    const agentBefore = await mainPid(node, "bashible.service");
    const s = await converge(v3);
    t.equal(s.lastRun?.outcome, "applied", "the converge that reloaded its own service finished");
    const newPid = await until("the daemon's restart", 60_000, async () => {
      const p = await mainPid(node, "bashible.service");
      return p !== agentBefore && p !== "0" && p;
    });
    t.ok(newPid, "the daemon was restarted afterwards");
    t.notMatch((await node.mustExec(["cat", "/etc/systemd/system/bashible.service"])).stdout, /edited by hand/);
  },
);
