import { EXIT, type Command } from "../../lib/cli.ts";
import { plan, type PlanReport } from "../converge/converge.ts";
import { redact } from "../../lib/log/redact.ts";
import { visible } from "../../lib/log/format.ts";
import { SOURCE_HELP, SOURCE_OPTIONS, convergeOptions } from "./converge-options.ts";

function indent(text: string, by = "      "): string {
  return text
    .trimEnd()
    .split("\n")
    .map((l) => by + l)
    .join("\n");
}

export function formatPlan(r: PlanReport): string {
  // Redacted, and control characters shown as \xNN: a diff quotes files users own (their
  // authorized_keys), and an escape sequence there must not drive the reader's terminal.
  const show = (t: string) =>
    redact(t, r.secrets)
      .split("\n")
      .map((l) => visible(l))
      .join("\n");
  const lines = [
    `node ${r.nodeName}, group ${r.nodeGroup}, bundle ${r.checksum.slice(0, 12)} from ${r.source}`,
    `gate: ${r.gate.run ? "a converge would run" : "in sync"} (${r.gate.reason})`,
  ];
  if (r.fetchError) lines.push(`fetch failed, planned against the last good bundle: ${show(r.fetchError)}`);
  lines.push("");
  for (const s of r.steps) {
    if (s.error) {
      lines.push(`! ${s.name} (${s.kind}): cannot plan: ${show(s.error)}`);
    } else if (s.changes.length === 0) {
      lines.push(`  ${s.name} (${s.kind}): in sync`);
    } else {
      lines.push(`~ ${s.name} (${s.kind}): ${s.changes.length} change${s.changes.length > 1 ? "s" : ""}`);
      for (const c of s.changes) {
        lines.push(`    - ${show(c.summary)}${c.disruptive ? ` [disruptive: ${show(c.disruptive)}]` : ""}`);
        if (c.kind === "file" && c.diff) lines.push(indent(c.secret ? "(secret content)" : show(c.diff)));
      }
    }
    for (const p of s.problems) lines.push(`    ! ${p.subject}: ${show(p.message)} (reported, not a change)`);
  }
  const changed = r.steps.filter((s) => s.changes.length).length;
  const failed = r.steps.filter((s) => s.error).length;
  const problems = r.steps.reduce((n, s) => n + s.problems.length, 0);
  lines.push(
    "",
    `${changed} of ${r.steps.length} steps would change the node${failed ? `; ${failed} could not be planned` : ""}${problems ? `; ${problems} problem${problems > 1 ? "s" : ""} reported` : ""}.`,
  );
  return `${lines.join("\n")}\n`;
}

/** The plan as JSON: file contents, stdin and secrets left out. */
export function planJson(r: PlanReport): string {
  const { secrets, ...report } = r;
  const text = JSON.stringify(report, (k, v) => (k === "content" || k === "input" ? undefined : v), 2);
  return `${redact(text, secrets)}\n`;
}

const planCommand: Command = {
  summary: "show what a converge would change (dry run; exit 2 when changes are pending)",
  usage: "[--root DIR] [--bundle FILE|DIR] [--json] [options]",
  help: `Plans every step of the bundle against the machine as it is now: per step a one-line
summary and, for files, a unified diff; problems a step found (a NodeUser that clashes with an
unmanaged account, say) are listed but are not changes. Changes nothing, not even state files.

Problems are also printed on stderr as warnings.

Exit: 0 in sync, 2 changes pending (a step would change something, or a converge is due:
new checksum, reboot, forced), 3 nothing pending but problems hold part of the bundle back
(a converge cannot fix them; a person must), 1 error (a step cannot be planned, or the current
bundle could not be fetched: the plan shown is then against the last good one).

Options:
      --json              print the plan as JSON

${SOURCE_HELP}`,
  // No retry or approval options: a dry run applies nothing, so it neither retries nor waits.
  options: { ...SOURCE_OPTIONS, json: { type: "boolean" } },
  takesRoot: true,
  logTo: "stderr",
  async run({ values, root, log, stdout }) {
    const report = await plan(convergeOptions(values, root, log));
    if (values.json) {
      stdout(planJson(report));
    } else {
      stdout(formatPlan(report));
    }
    // On stderr too, as warnings: what `--json` or a pipe into less would bury.
    const problems = report.steps.flatMap((s) => s.problems.map((p) => ({ step: s.name, ...p })));
    for (const p of problems)
      log.warn({ step: p.step, subject: p.subject }, `not applied: ${p.subject}: ${redact(p.message, report.secrets)}`);
    // Planned against the last good bundle because the current one could not be had: the
    // answer is not "in sync", it is unknown.
    if (report.fetchError || report.steps.some((s) => s.error)) return EXIT.error;
    const pending = report.steps.some((s) => s.changes.length) || report.gate.run;
    if (pending) return EXIT.changesPending;
    return problems.length ? EXIT.problems : EXIT.ok;
  },
};
export default planCommand;
