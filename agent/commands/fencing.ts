// `bashible fencing status`: what the resident agent's fencing loop last wrote to
// /run/bashible/fencing.json, for a person on the node.
import { readFile } from "node:fs/promises";
import path from "node:path";
import { EXIT, UsageError, type Command } from "../../lib/cli.ts";
import { PATHS } from "../../bundles/paths.ts";
import { systemClock } from "../fencing/clock.ts";
import type { FencingStatus } from "../fencing/status-file.ts";

const ago = (iso: string | undefined, now: number) =>
  iso ? `${iso} (${((now - Date.parse(iso)) / 1000).toFixed(1)} s ago)` : "never";

export function formatFencingStatus(s: FencingStatus, alive: boolean, now = systemClock()): string {
  const l: string[] = [];
  const t = s.timings;
  l.push(`node:             ${s.node}${s.nodeGroup ? ` (group ${s.nodeGroup})` : ""}`);
  l.push(`mode:             ${s.mode ?? "off (the node group has no spec.fencing)"}`);
  l.push(
    `agent:            ${alive ? `running (pid ${s.pid})` : `not running (last pid ${s.pid}; status from ${s.updatedAt})`}`,
  );
  l.push(
    `device:           ${s.device} ${s.armed ? "ARMED" : "not armed"}${s.petting ? ", petting" : s.armed ? ", NOT petting" : ""}`,
  );
  if (s.fencing)
    l.push(
      "FENCING:          pets stopped: this node is not part of the cluster; the watchdog fires unless it recovers",
    );
  if (s.problem) l.push(`problem:          ${s.problem}`);
  l.push(`last pet:         ${ago(s.lastPetAt, now)}; ${s.pets} pets by this agent`);
  const wd = s.watchdog;
  l.push(
    `watchdog:         ${wd?.timeoutSeconds !== undefined ? `timeout ${wd.timeoutSeconds} s` : "timeout not readable (softdog soft_margin applies)"}${wd?.timeLeftSeconds !== undefined ? `, ${wd.timeLeftSeconds} s left` : ""}${wd?.identity ? `, ${wd.identity}` : ""}${wd ? ` [${wd.source}]` : ""}`,
  );
  l.push(
    `timings:          pet every ${t.petIntervalMs / 1000} s, check every ${t.checkIntervalMs / 1000} s (API deadline ${t.apiTimeoutMs / 1000} s, peers ${t.peerTimeoutMs / 1000} s), ${t.badRounds} bad rounds stop the pets; detection window ${s.detectionWindowMs / 1000} s${t.kubeletStaleMs > 0 ? `; kubelet Lease limit ${t.kubeletStaleMs / 1000} s (${s.kubeletSeenAlive ? "watching" : "not yet renewed since boot"})` : "; kubelet rule off"}`,
  );
  l.push(`maintenance:      ${s.maintenance ? `fencing stands down (${s.maintenance})` : "no"}`);
  l.push(`label:            ${s.labelled ? "node-manager.deckhouse.io/fencing-enabled set" : "not set"}`);
  if (s.verdict)
    l.push(
      `last decision:    ${s.verdict.healthy ? "healthy" : "NOT healthy"} (${s.verdict.kind}) at ${s.verdict.at}: ${s.verdict.reason}; ${s.badRounds} bad round(s) in a row`,
    );
  if (s.lastCheck)
    l.push(
      `API check:        ${s.lastCheck.result}${s.lastCheck.detail ? ` (${s.lastCheck.detail})` : ""} in ${s.lastCheck.durationMs} ms${s.lastCheck.kubeletLeaseAgeSeconds !== undefined ? `; kubelet Lease renewed ${s.lastCheck.kubeletLeaseAgeSeconds} s ago` : ""}`,
    );
  l.push(`peers known:      ${s.peersKnown}`);
  for (const p of s.peersWaiting ?? []) l.push(`  ${p.name.padEnd(24)} not asked: ${p.why}`);
  for (const p of s.lastPeers ?? []) l.push(`  ${p.node.padEnd(24)} ${p.outcome}${p.detail ? ` (${p.detail})` : ""}`);
  return `${l.join("\n")}\n`;
}

const command: Command = {
  summary: "fencing: show whether the watchdog is armed and petted, and the last decision",
  usage: "status [--root DIR] [--json] [--metrics]",
  help: `Reads ${PATHS.fencingStatus}, which the resident agent (bashible run) rewrites when
its decision, arming, label or peers change, and every 30 s otherwise.

Exit: 0 when armed and petting (or Notify mode, or maintenance), 1 when fencing is on but the
device is not petted, or no agent is running.

Options:
      --json              the raw status
      --metrics           the fencing metrics (Prometheus text, ${PATHS.fencingMetrics})`,
  options: { json: { type: "boolean" }, metrics: { type: "boolean" } },
  takesRoot: true,
  logTo: "stderr",
  async run({ values, positionals, root, stdout }) {
    if ((positionals[0] ?? "status") !== "status") throw new UsageError(`unknown subcommand '${positionals[0]}'`);
    if (values.metrics) {
      stdout(await readFile(path.join(root, PATHS.fencingMetrics), "utf8"));
      return EXIT.ok;
    }
    let s: FencingStatus;
    try {
      s = JSON.parse(await readFile(path.join(root, PATHS.fencingStatus), "utf8")) as FencingStatus;
    } catch (err) {
      throw new UsageError(
        `no fencing status at ${path.join(root, PATHS.fencingStatus)} (${(err as NodeJS.ErrnoException).code ?? (err as Error).message}): is 'bashible run' running?`,
      );
    }
    let alive = true;
    try {
      process.kill(s.pid, 0);
    } catch {
      alive = false;
    }
    stdout(values.json ? `${JSON.stringify({ ...s, agentRunning: alive }, null, 2)}\n` : formatFencingStatus(s, alive));
    const ok = alive && (!s.mode || s.mode === "Notify" || !!s.maintenance || (s.armed && s.petting));
    return ok ? EXIT.ok : EXIT.error;
  },
};
export default command;
