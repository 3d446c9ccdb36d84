// How an apply ends, as the tag the converge branches on (never its message): completed,
// failed, aborted, and not-approved, the last one end to end: a disruptive change a
// RollingUpdate group never approves leaves the node waiting, its file untouched.
import t, { type Test } from "tap";
import { chmod, mkdir, readFile, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { applySteps, type BaseContext } from "../../agent/converge/engine.ts";
import { stateHost } from "../../agent/converge/state.ts";
import { hostFlags } from "../../host/flags.ts";
import type { Host } from "../../host/host.ts";
import { createLogger } from "../../lib/log/log.ts";
import { PATHS } from "../../bundles/paths.ts";
import type { BundleStep, NodeGroupBundle } from "../../bundles/types.ts";
import { bashible } from "../../scripts/lib/cli.ts";
import { makeBundle, sandbox, script, writeBundle } from "../../scripts/lib/bundle.ts";
import { requireRoot } from "../fixtures/root.ts";

await requireRoot("the agent sets root ownership on what it writes");

const log = createLogger({ level: "silent" });
const once = { retry: { intervalMs: 0, maxAttempts: 1 } };

function base(host: Host, bundle: NodeGroupBundle, signal?: AbortSignal): BaseContext {
  return {
    nodeName: "node-1",
    nodeGroup: bundle.nodeGroup,
    bundle,
    firstRun: false,
    forced: false,
    bootId: "test-boot",
    log,
    flags: hostFlags(host),
    agentArgv: ["true"],
    cluster: "local",
    signal,
  };
}

async function tree(t: Test) {
  const root = await sandbox();
  t.teardown(() => rm(root, { recursive: true, force: true }));
  return { root, host: stateHost(root) };
}

const CONFIG_V2 = "# containerd major version: 2\n# written for containerd 2\n";

/**
 * A node whose containerd configuration was written for containerd 2 while the binary is 1.7:
 * the Containerd step's new configuration is then a disruptive change.
 */
async function downgradedContainerd(root: string): Promise<BundleStep> {
  const bin = path.join(root, PATHS.binDir, "containerd");
  await mkdir(path.dirname(bin), { recursive: true });
  await writeFile(bin, "#!/bin/sh\necho 'containerd github.com/containerd/containerd v1.7.24 0123abc'\n");
  await chmod(bin, 0o755);
  await mkdir(path.join(root, PATHS.packageStore, "containerd"), { recursive: true });
  await writeFile(path.join(root, PATHS.packageStore, "containerd/digest"), `sha256:${"a".repeat(64)}\n`);
  await mkdir(path.join(root, PATHS.containerdConfig, ".."), { recursive: true });
  await writeFile(path.join(root, PATHS.containerdConfig), CONFIG_V2);
  return {
    name: "032_configure_containerd",
    kind: "Containerd",
    spec: {
      cgroupDriver: "systemd",
      sandboxImage: "registry.example.test/pause:3.10",
      snapshotter: "overlayfs",
      maxConcurrentDownloads: 3,
      registries: [],
      package: "containerd",
    },
  };
}

t.test("every step ran: completed", async (t) => {
  const { host } = await tree(t);
  const bundle = makeBundle([script("050_ok", "true")]);
  const r = await applySteps(host, bundle, base(host, bundle), once);
  t.equal(r.stop, "completed");
  t.equal(r.ok, true);
});

t.test("a step that still fails: failed, naming the step and the error", async (t) => {
  const { host } = await tree(t);
  const bundle = makeBundle([script("050_bad", "echo broken >&2; exit 3"), script("060_after", "true")]);
  const r = await applySteps(host, bundle, base(host, bundle), once);
  t.equal(r.stop, "failed");
  t.match(!r.ok && r.failed, { name: "050_bad" });
  t.same(
    r.steps.map((s) => s.outcome),
    ["failed", "not-run"],
    "the run stops at the failing step",
  );
});

t.test("a stopped run: aborted, and no step runs", async (t) => {
  const { root, host } = await tree(t);
  const bundle = makeBundle([script("050_mark", `touch "$BASHIBLE_ROOT/ran"`)]);
  const abort = new AbortController();
  abort.abort();
  const r = await applySteps(host, bundle, base(host, bundle, abort.signal), once);
  t.equal(r.stop, "aborted");
  t.match(!r.ok && r.failed, { name: "050_mark", error: /stopped before this step/ });
  await t.rejects(readFile(path.join(root, "ran")), { code: "ENOENT" });
});

t.test("a disruptive change refused by the approval hook: not-approved, nothing applied", async (t) => {
  const { root, host } = await tree(t);
  const bundle = makeBundle([await downgradedContainerd(root)]);
  const asked: string[][] = [];
  const r = await applySteps(host, bundle, base(host, bundle), {
    ...once,
    hooks: {
      approveDisruption: async (_step, reasons) => {
        asked.push(reasons);
        return false;
      },
    },
  });
  t.equal(r.stop, "not-approved");
  t.match(asked, [[/containerd major version 2 → 1/]], "the hook was asked with the reason");
  t.match(!r.ok && r.failed, { name: "032_configure_containerd", error: /containerd major version 2 → 1/ });
  t.equal(await readFile(path.join(root, PATHS.containerdConfig), "utf8"), CONFIG_V2, "the configuration stays");
});

t.test("a RollingUpdate group never approves a disruptive change: the run waits and changes nothing", async (t) => {
  const { root } = await tree(t);
  const step = await downgradedContainerd(root);
  const b = makeBundle([step], {
    context: {
      nodeGroup: {
        name: "worker",
        nodeType: "Static",
        disruptions: { approvalMode: "RollingUpdate" },
        updateEpoch: "0",
      },
    },
  });
  const file = await writeBundle(root, b, `../b-${path.basename(root)}.json`);
  const r = await bashible(["once", "--root", root, "--bundle", file]);
  t.equal(r.status, 1, "waiting is not success");
  const st = JSON.parse((await bashible(["status", "--root", root, "--json"])).stdout);
  t.equal(st.lastRun.outcome, "waiting-disruption-approval");
  t.match(st.lastRun.reason, /containerd major version 2 → 1/);
  t.notOk(st.failedChecksum, "not counted as a failure");
  t.equal(await readFile(path.join(root, PATHS.containerdConfig), "utf8"), CONFIG_V2, "the configuration stays");
});
