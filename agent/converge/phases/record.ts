// What a run writes down: status.json's last run (every ending goes through `finish`), a
// failure with its Events, the in-sync re-assertion, and a success (bundle, status, checksum).
import { EVENTS, NODE_KEYS } from "../../../bundles/names.ts";
import { PATHS } from "../../../bundles/paths.ts";
import { redact } from "../../../lib/log/redact.ts";
import { finishRun, type ApplyResult } from "../engine.ts";
import {
  rememberBundle,
  updateStatus,
  writeAppliedChecksum,
  type RunOutcome,
  type Status,
  type StepStatus,
} from "../state.ts";
import type { ApplyingRun, ConvergeResult, Run } from "./run.ts";

const isWaiting = (o: RunOutcome) => o === "waiting-approval" || o === "waiting-disruption-approval";

/** Ends the run: its outcome in status.json's lastRun (plus `patch`), and the result to return. */
export async function finish(
  run: Run,
  outcome: RunOutcome,
  reason: string,
  patch?: (st: Status) => void,
): Promise<ConvergeResult> {
  const { startedAt, checksum } = run;
  const st = await updateStatus(run.host, (st) => {
    st.lastRun = { startedAt, finishedAt: new Date().toISOString(), checksum, outcome, reason };
    if (!isWaiting(outcome)) delete st.waiting;
    patch?.(st);
  });
  const problems = st.steps.flatMap((s) =>
    (s.problems ?? []).map((p) => ({ step: s.name, subject: p.subject, message: redact(p.message, run.secrets) })),
  );
  return { outcome, checksum, reason, problems, ...(run.rejected ? { rejected: true } : {}) };
}

/** Nothing to run: only the Node's checksum annotation is re-asserted. */
export async function inSync(run: Run, reason: string): Promise<ConvergeResult> {
  if (run.node && run.node.metadata.annotations?.[NODE_KEYS.checksum] !== run.checksum) {
    await run.reporter.annotate({ [NODE_KEYS.checksum]: run.checksum });
  }
  run.log.debug(reason);
  return finish(run, "in-sync", reason);
}

/** The run waits for an approval; the steps that ran so far are kept in status. */
export function waiting(
  run: Run,
  outcome: "waiting-approval" | "waiting-disruption-approval",
  reason: string,
  steps: StepStatus[],
): Promise<ConvergeResult> {
  return finish(run, outcome, reason, (st) => {
    st.steps = steps;
  });
}

/** A step failed (or the run was stopped): logged, an Event, and the failure counted per checksum. */
export async function recordFailure(
  run: ApplyingRun,
  result: Extract<ApplyResult, { ok: false }>,
): Promise<ConvergeResult> {
  const { checksum } = run;
  const error = redact(`step ${result.failed.name} failed: ${result.failed.error}`, run.secrets);
  run.log.error(error);
  await run.reporter.event(EVENTS.nodeUpdate, `converge to ${checksum.slice(0, 12)} failed: ${error}`, "Warning");
  return finish(run, "failed", error, (st) => {
    st.failureCount = st.failedChecksum === checksum ? st.failureCount + 1 : 1;
    st.failedChecksum = checksum;
    st.steps = result.steps;
    if (st.lastRun) st.lastRun.error = error;
  });
}

/**
 * Every step went through: the bundle first, then status, then the checksum file, so a kill in
 * between re-runs (cheaply: every step then plans nothing) instead of trusting an unrecorded
 * bundle. Then the run's pending state is cleared and the first run is over.
 */
export async function recordApplied(run: ApplyingRun, steps: StepStatus[]): Promise<void> {
  const { host, base, checksum } = run;
  await rememberBundle(host, run.bundle);
  await updateStatus(host, (st) => {
    st.appliedChecksum = checksum;
    st.appliedBootId = base.bootId;
    st.appliedAt = new Date().toISOString();
    st.steps = steps;
    st.failureCount = 0;
    delete st.failedChecksum;
  });
  await writeAppliedChecksum(host, checksum);
  await finishRun(host, base.flags);
  if (base.firstRun) await host.remove(PATHS.firstRun);
}
