// The end of an applied run: a reboot last, when a step or a script (flag `reboot`) or the Node
// (update.node.deckhouse.io/reboot) asked for one and the disruption was approved; then the
// Node is told the run is done.
import { EVENTS, NODE_KEYS } from "../../../bundles/names.ts";
import { FLAG } from "../../../host/flags.ts";
import { rebootRequested } from "../gate-inputs.ts";
import type { StepStatus } from "../state.ts";
import { approveDisruption } from "./approve.ts";
import { finish } from "./record.ts";
import type { ApplyingRun, ConvergeResult } from "./run.ts";

/**
 * `reboot` approved, `waiting` for its approval, or `none` asked. The first run (provisioning)
 * reboots without asking, as Deckhouse's 099_reboot does on the first bashible run: a script
 * that updated the kernel (`bb-flag-set reboot`) gets its reboot before the node takes work.
 */
export async function rebootDecision(run: ApplyingRun): Promise<"none" | "reboot" | "waiting"> {
  const { base } = run;
  const asked = (await base.flags.has(FLAG.reboot)) || rebootRequested(run.node);
  if (!asked) return "none";
  if (base.firstRun) {
    run.log.info("first run: a reboot was asked for; rebooting without approval, as Deckhouse does while provisioning");
    return "reboot";
  }
  return (await approveDisruption(run, ["reboot"])) ? "reboot" : "waiting";
}

/** Tells the Node the run is done (or about to reboot), records `applied`, then reboots if approved. */
export async function announceApplied(run: ApplyingRun, steps: StepStatus[], reboot: boolean): Promise<ConvergeResult> {
  const { base, reporter, log, checksum } = run;
  await base.flags.unset(FLAG.disruption);
  // The checksum annotation says "done": the approval controller uncordons a node once it
  // matches, so a node about to reboot does not write it; the run after the reboot does (the
  // new boot id forces one). The approval annotations are the controller's to clear.
  await reporter.annotate(reboot ? { [NODE_KEYS.reboot]: null } : { [NODE_KEYS.checksum]: checksum });
  // The first run's end: the cluster removes the taint the kubelet registered with (a kubelet
  // may not remove its own), so workloads come only to a converged node.
  if (base.firstRun) await reporter.label({ [NODE_KEYS.firstRunFinished]: "true" });
  const changed = steps.filter((st) => st.outcome === "changed").map((st) => st.name);
  await reporter.event(
    EVENTS.nodeUpdate,
    `converge to ${checksum.slice(0, 12)} finished; changed: ${changed.join(", ") || "nothing"}${reboot ? "; rebooting" : ""}`,
  );
  log.info({ checksum: checksum.slice(0, 12), changed }, "converge finished");
  const outcome = await finish(run, "applied", run.reason);
  if (reboot) {
    await base.flags.unset(FLAG.reboot);
    log.warn("rebooting: disruption approved");
    await run.host.reboot();
  }
  return outcome;
}
