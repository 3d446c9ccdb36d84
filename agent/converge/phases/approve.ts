// The run's two approvals, as Deckhouse asks for them: update approval (a later run with
// something to change outside the 000_* steps) and disruption approval (before a disruptive
// change, and before a reboot). Local mode has nobody to ask: the operator who ran it approves.
import { NODE_KEYS } from "../../../bundles/names.ts";
import { FLAG } from "../../../host/flags.ts";
import { announceAndWait, hasAnnotation } from "../approval.ts";
import { updateStatus } from "../state.ts";
import type { ApplyingRun } from "./run.ts";

/** Announces on the Node, records what the node waits for, and waits for `grantedKey`. */
async function waitFor(
  run: ApplyingRun,
  what: string,
  announce: Record<string, string | null>,
  grantedKey: string,
): Promise<boolean> {
  const kube = run.reporter.kube;
  if (!kube) return true; // local mode: the operator who ran it is the approval
  await updateStatus(run.host, (st) => {
    st.waiting = { for: what, since: new Date().toISOString() };
  });
  run.log.info(`waiting for ${grantedKey} on Node ${run.nodeName} (${what})`);
  return announceAndWait(kube, run.nodeName, run.log, announce, hasAnnotation(grantedKey), {
    timeoutMs: run.approvalTimeoutMs,
    signal: run.base.signal,
  });
}

/**
 * A later run never changes the node unapproved (if the Node cannot be read, this throws). The
 * first run (provisioning) and a run with nothing to change outside the 000_* steps need none.
 */
export async function approveUpdate(run: ApplyingRun): Promise<boolean> {
  if (!run.pendingLater || run.base.firstRun || !run.reporter.kube) return true;
  const approved = await waitFor(
    run,
    "update approval",
    { [NODE_KEYS.waitingForApproval]: "", [NODE_KEYS.checksum]: null },
    NODE_KEYS.approved,
  );
  if (!approved) run.log.warn("update not approved yet; the next run asks again");
  return approved;
}

/**
 * Disruption approval, once per run (the `disruption` flag remembers it until the run ends).
 * RollingUpdate never approves: the node is marked for replacement instead.
 */
export async function approveDisruption(run: ApplyingRun, reasons: string[]): Promise<boolean> {
  const { base } = run;
  if (base.firstRun) return true; // provisioning: nothing runs on the node yet (as Deckhouse)
  if (await base.flags.has(FLAG.disruption)) return true;
  if (run.bundle.context.nodeGroup.disruptions.approvalMode === "RollingUpdate") {
    await run.reporter.annotate({ [NODE_KEYS.rollingUpdate]: "" });
    run.log.warn({ reasons }, "disruptive update: the node is marked for replacement (RollingUpdate)");
    return false;
  }
  const ok = await waitFor(
    run,
    `disruption approval: ${reasons.join("; ")}`,
    { [NODE_KEYS.disruptionRequired]: "" },
    NODE_KEYS.disruptionApproved,
  );
  if (ok) await base.flags.set(FLAG.disruption, reasons.join("; "));
  return ok;
}
