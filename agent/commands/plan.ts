import { EXIT, type Command } from "../../lib/cli.ts";
import { plan, type PlanReport } from "../converge/converge.ts";
import { CONVERGE_HELP, CONVERGE_OPTIONS, convergeOptions } from "./converge-options.ts";

function indent(text: string, by = "      "): string {
  return text
    .trimEnd()
    .split("\n")
    .map((l) => by + l)
    .join("\n");
}

export function formatPlan(r: PlanReport): string {
  const lines = [
    `node ${r.nodeName}, group ${r.nodeGroup}, bundle ${r.checksum.slice(0, 12)} from ${r.source}`,
    `gate: ${r.gate.run ? "a converge would run" : "in sync"} (${r.gate.reason})`,
  ];
  if (r.fetchError) lines.push(`fetch failed, planned against the last good bundle: ${r.fetchError}`);
  lines.push("");
  for (const s of r.steps) {
    if (s.error) {
      lines.push(`! ${s.name} (${s.kind}): cannot plan: ${s.error}`);
    } else if (s.changes.length === 0) {
      lines.push(`  ${s.name} (${s.kind}): in sync`);
    } else {
      lines.push(`~ ${s.name} (${s.kind}): ${s.changes.length} change${s.changes.length > 1 ? "s" : ""}`);
      for (const c of s.changes) {
        lines.push(`    - ${c.summary}`);
        if (c.kind === "file" && c.diff) lines.push(indent(c.diff));
      }
    }
  }
  const changed = r.steps.filter((s) => s.changes.length).length;
  const failed = r.steps.filter((s) => s.error).length;
  lines.push(
    "",
    `${changed} of ${r.steps.length} steps would change the node${failed ? `; ${failed} could not be planned` : ""}.`,
  );
  return `${lines.join("\n")}\n`;
}

const planCommand: Command = {
  summary: "show what a converge would change (dry run; exit 2 when changes are pending)",
  usage: "[--root DIR] [--bundle FILE|DIR] [--json] [options]",
  help: `Plans every step of the bundle against the machine as it is now: per step a one-line
summary and, for files, a unified diff. Changes nothing, not even state files.

Exit: 0 in sync, 2 changes pending (a step would change something, or a converge is due:
new checksum, reboot, forced), 1 error (a step cannot be planned, or the current bundle
could not be fetched: the plan shown is then against the last good one).

Options:
      --json              print the plan as JSON

${CONVERGE_HELP}`,
  options: { ...CONVERGE_OPTIONS, json: { type: "boolean" } },
  takesRoot: true,
  logTo: "stderr",
  async run({ values, root, log, stdout }) {
    const report = await plan(convergeOptions(values, root, log));
    if (values.json) {
      stdout(`${JSON.stringify(report, (k, v) => (k === "content" ? undefined : v), 2)}\n`);
    } else {
      stdout(formatPlan(report));
    }
    // Planned against the last good bundle because the current one could not be had: the
    // answer is not "in sync", it is unknown.
    if (report.fetchError || report.steps.some((s) => s.error)) return EXIT.error;
    const pending = report.steps.some((s) => s.changes.length) || report.gate.run;
    return pending ? EXIT.changesPending : EXIT.ok;
  },
};
export default planCommand;
