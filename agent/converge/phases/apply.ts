// The steps: planned once up front (to know whether update approval is needed), then applied
// in two parts, the 000_* steps (NodeUsers: emergency access never waits for an approval) and
// the rest, each step re-planned just before it is applied (engine.ts).
import { EVENTS } from "../../../bundles/names.ts";
import { PATHS } from "../../../bundles/paths.ts";
import { applySteps, planSteps, type ApplyResult } from "../engine.ts";
import { approveDisruption } from "./approve.ts";
import type { ApplyingRun } from "./run.ts";

const isAdmissionStep = (name: string) => name.startsWith("000_");

/** Whether anything outside the 000_* steps would change (or cannot be planned). Changes nothing. */
export async function pendingOutsideAdmission(run: Pick<ApplyingRun, "host" | "bundle" | "base">): Promise<boolean> {
  const plans = await planSteps(run.host, run.bundle, run.base);
  return plans.some((p) => !isAdmissionStep(p.name) && (p.changes.length > 0 || p.error));
}

/**
 * From here the node is between states: drop the applied checksum first (as Deckhouse does), so
 * a run that is killed or fails is never mistaken for an applied one; leave the bundle being
 * applied where the scripts' helpers (bb-package-install, disruption approval) read it; say so.
 */
export async function markUnapplied(run: ApplyingRun): Promise<void> {
  await run.host.remove(PATHS.configurationChecksum);
  await run.host.writeFile(PATHS.runBundle, JSON.stringify(run.bundle), { mode: 0o600 });
  await run.reporter.event(EVENTS.nodeUpdate, `converge to ${run.checksum.slice(0, 12)} started: ${run.reason}`);
}

function applyPart(run: ApplyingRun, only: (name: string) => boolean): Promise<ApplyResult> {
  return applySteps(run.host, run.bundle, run.base, {
    retry: run.retry,
    deadline: run.deadline,
    only,
    hooks: {
      onStepFailed: (step, message, tail) =>
        run.reporter.event(EVENTS.stepFailed, `step ${step.name} failed: ${message}\n${tail}`, "Warning"),
      approveDisruption: (_step, reasons) => approveDisruption(run, reasons),
    },
  });
}

/** The 000_* steps, before any approval. */
export const applyAdmission = (run: ApplyingRun) => applyPart(run, isAdmissionStep);

/** Every other step, once the update is approved. */
export const applyRest = (run: ApplyingRun) => applyPart(run, (n) => !isAdmissionStep(n));
