// Custom NodeGroupConfiguration steps: bash scripts, run in weight order. A script runs when
// its content changed since its last success, the node rebooted since then, the group's
// 4-hour update epoch moved on (Deckhouse re-runs everything then to repair drift), or a full
// run is forced (configuration_checksum removed); otherwise the plan says "unchanged" and
// nothing runs. Scripts must be idempotent.
//
// Environment: NODE_NAME, NODE_GROUP, BUNDLE (debian|rhel|altlinux), BASHIBLE_ROOT ("/" or the
// sandbox root: scripts prefix their paths with it), BASHIBLE_STATE_DIR, BASHIBLE_STEP,
// BASHIBLE_FIRST_RUN (true|false), KUBERNETES_VERSION, and PATH with /opt/deckhouse/bin first.
import { readBootId } from "../agent/facts.ts";
import { sha256Hex } from "../bundles/checksum.ts";
import type { Host } from "../agent/host/host.ts";
import { CommandError } from "../agent/host/host.ts";
import type { Step, StepContext } from "./types.ts";
import type { ScriptSpec } from "../bundles/types.ts";
import { PATHS } from "../bundles/paths.ts";

const RECORDS = PATHS.scripts;

interface RunRecord {
  sha256: string;
  bootId: string;
  epoch: string;
  at: string;
}

function wantedRecord(spec: ScriptSpec, ctx: StepContext, bootId: string): Omit<RunRecord, "at"> {
  return { sha256: sha256Hex(spec.script), bootId, epoch: ctx.bundle.context.nodeGroup.updateEpoch };
}

async function lastSuccess(host: Host, name: string): Promise<RunRecord | undefined> {
  const text = await host.readText(`${RECORDS}/${name}.json`);
  try {
    return text ? (JSON.parse(text) as RunRecord) : undefined;
  } catch {
    return undefined;
  }
}

const script: Step<"Script"> = {
  kind: "Script",

  async plan(spec, host, ctx) {
    const name = ctx.stepName;
    if (spec.bundles.length && !spec.bundles.includes(host.os.family) && !spec.bundles.includes("*")) return [];
    const want = wantedRecord(spec, ctx, await readBootId());
    const last = await lastSuccess(host, name);
    let why: string;
    if (!last) why = "never ran successfully";
    else if (ctx.forced) why = "full run forced (configuration_checksum absent)";
    else if (last.sha256 !== want.sha256) why = "script changed since its last success";
    else if (last.bootId !== want.bootId) why = "node rebooted since its last success";
    else if (last.epoch !== want.epoch) why = "update epoch moved on (periodic re-run)";
    else return [];
    return [{ kind: "script", name, summary: `run ${spec.source} (${why})` }];
  },

  async apply(_changes, spec, host, ctx) {
    const name = ctx.stepName;
    const env = {
      NODE_NAME: ctx.nodeName,
      NODE_GROUP: ctx.nodeGroup,
      BUNDLE: host.os.family,
      BASHIBLE_ROOT: host.root,
      BASHIBLE_STATE_DIR: host.path("/var/lib/bashible"),
      BASHIBLE_STEP: name,
      BASHIBLE_FIRST_RUN: String(ctx.firstRun),
      KUBERNETES_VERSION: ctx.bundle.context.kubernetesVersion,
      PATH: `${host.path("/opt/deckhouse/bin")}:${process.env.PATH ?? "/usr/sbin:/usr/bin:/sbin:/bin"}`,
    };
    const argv = ["bash", "--noprofile", "--norc", "-eEo", "pipefail", "-s"];
    const r = await host.run(argv, {
      env,
      input: spec.script,
      cwd: "/var/lib/bashible",
      logFile: ctx.logFile,
      signal: ctx.signal,
    });
    if (r.exitCode !== 0) throw new CommandError([`${spec.source}`], r);
    const record: RunRecord = { ...wantedRecord(spec, ctx, await readBootId()), at: new Date().toISOString() };
    await host.writeFile(`${RECORDS}/${name}.json`, `${JSON.stringify(record)}\n`, { mode: 0o644 });
    return undefined;
  },
};

export default script;
