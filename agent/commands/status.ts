import { EXIT, type Command } from "../../lib/cli.ts";
import { Host } from "../../host/host.ts";
import { readAppliedChecksum, readStatus, type Status } from "../converge/state.ts";
import { osProfile } from "../converge/converge.ts";
import { PATHS } from "../../bundles/paths.ts";
import { metricsStatusLine, readMetricsState } from "../metrics-server.ts";

interface DaemonState {
  pid: number;
  nextTickAt: string;
}

async function daemonState(host: Host): Promise<DaemonState | undefined> {
  const text = await host.readText(PATHS.daemon);
  if (text === undefined) return undefined; // never started (or /run was wiped by a reboot)
  let d: DaemonState;
  try {
    d = JSON.parse(text) as DaemonState;
  } catch {
    return undefined; // torn while the daemon rewrote it: the next read has it
  }
  try {
    process.kill(d.pid, 0);
    return d;
  } catch (err) {
    // EPERM: the daemon runs as root and we do not; it is alive all the same.
    return (err as NodeJS.ErrnoException).code === "EPERM" ? d : undefined;
  }
}

function formatStatus(
  s: Status,
  applied: string | undefined,
  daemon: DaemonState | undefined,
  metrics?: string,
): string {
  const l: string[] = [];
  l.push(`applied checksum: ${applied ?? "(none: the next run applies everything)"}`);
  if (s.appliedAt) l.push(`applied at:       ${s.appliedAt}`);
  if (s.failedChecksum)
    l.push(
      `failed checksum:  ${s.failedChecksum} (${s.failureCount} failed run${s.failureCount === 1 ? "" : "s"} in a row)`,
    );
  if (s.lastRun) {
    l.push(`last run:         ${s.lastRun.outcome} at ${s.lastRun.finishedAt} (${s.lastRun.reason})`);
    if (s.lastRun.error) l.push(`last error:       ${s.lastRun.error}`);
  } else {
    l.push("last run:         never");
  }
  if (s.fetchError) l.push(`fetch problem:    ${s.fetchError.message} (at ${s.fetchError.at})`);
  if (s.waiting) l.push(`waiting for:      ${s.waiting.for} (since ${s.waiting.since})`);
  l.push(
    daemon
      ? `next check:       ${daemon.nextTickAt} (daemon pid ${daemon.pid}; bundle changes apply at once)`
      : "next check:       no daemon running (bashible run)",
  );
  if (metrics) l.push(`metrics:          ${metrics}`);
  if (s.steps.length) {
    l.push("", "steps:");
    for (const st of s.steps) {
      const extra = st.error
        ? `: ${st.error}`
        : st.problems?.length
          ? `: ${st.problems.map((p) => `${p.subject}: ${p.message}`).join("; ")}`
          : "";
      l.push(
        `  ${st.outcome.padEnd(9)} ${st.name} (${st.kind}, ${st.attempts} attempt${st.attempts === 1 ? "" : "s"}, ${st.durationMs} ms)${extra}`,
      );
    }
  }
  return `${l.join("\n")}\n`;
}

const status: Command = {
  summary: "show the last converge: outcome, per-step results, checksums, failures",
  usage: "[--root DIR] [--json]",
  help: `Reads /var/lib/bashible/status.json and configuration_checksum.

Needs root: status.json is root's (0600), as it quotes what commands and refused bundles said.

Exit: 0 when the last run applied or was in sync, 3 the same but steps reported problems
(those parts of the bundle are not applied), 1 when it failed or is waiting.

Options:
      --json              print the raw status as JSON`,
  options: { json: { type: "boolean" } },
  takesRoot: true,
  logTo: "stderr",
  async run({ values, root, stdout, log }) {
    const host = new Host(
      root,
      await osProfile(root).catch(() => ({
        id: "",
        versionId: "",
        family: "debian" as const,
        packageManager: "apt" as const,
      })),
    );
    const [s, applied, daemon] = await Promise.all([
      readStatus(host, { log }),
      readAppliedChecksum(host),
      daemonState(host),
    ]);
    const metrics = daemon && (await readMetricsState(root, daemon.pid));
    stdout(
      values.json
        ? `${JSON.stringify({ ...s, configurationChecksum: applied, daemon, metrics }, null, 2)}\n`
        : formatStatus(s, applied, daemon, metrics ? metricsStatusLine(metrics) : undefined),
    );
    const ok = !s.lastRun || s.lastRun.outcome === "applied" || s.lastRun.outcome === "in-sync";
    if (!ok) return EXIT.error;
    return s.steps.some((st) => st.problems?.length) ? EXIT.problems : EXIT.ok;
  },
};
export default status;
