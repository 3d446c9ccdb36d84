// What one converge carries from phase to phase (converge.ts decides their order). Built once,
// after the fetch: the bundle, its secrets (bound once for every plan, log line, Event and
// status the run writes) and the gate's inputs (read once, gate-inputs.ts).
import type { Logger } from "../../../lib/log/log.ts";
import type { Host } from "../../../host/host.ts";
import type { KubeObject } from "../../../lib/kube/api.ts";
import type { NodeGroupBundle } from "../../../bundles/types.ts";
import type { BaseContext, RetryPolicy } from "../engine.ts";
import type { NodeGateState } from "../gate-inputs.ts";
import type { NodeReporter } from "../node-report.ts";
import type { RunOutcome } from "../state.ts";

export interface Run {
  host: Host;
  log: Logger;
  reporter: NodeReporter;
  nodeName: string;
  /** The Node as read when the run started; undefined in local mode or when it could not be read. */
  node: KubeObject | undefined;
  bundle: NodeGroupBundle;
  checksum: string;
  /** Every secret value of the bundle (bundleSecrets): computed once, redacts everything the run shows. */
  secrets: string[];
  gateState: NodeGateState;
  /** The bundle fetched was refused; this run uses the last good one. */
  rejected: boolean;
  startedAt: string;
}

/** A run the gate let through: the steps' shared context and the run's budgets. */
export interface ApplyingRun extends Run {
  base: BaseContext;
  /** Why the gate let it through (the start and finish Events, status). */
  reason: string;
  retry: RetryPolicy;
  /** Epoch ms after which no retry starts. */
  deadline: number;
  approvalTimeoutMs: number;
  /** Something outside the 000_* steps would change: a later run asks for update approval. */
  pendingLater: boolean;
}

/** A problem a step reported, with the step: what is held back and why. */
export interface RunProblem {
  step: string;
  subject: string;
  message: string;
}

export interface ConvergeResult {
  outcome: RunOutcome;
  checksum?: string;
  reason: string;
  /**
   * The problems the steps reported (redacted), in step order: this run's, or, for a run with
   * nothing to do, those the run that applied the bundle recorded (nothing since fixed them).
   */
  problems: RunProblem[];
  /** The bundle fetched was refused; the last good one was used (or nothing ran). */
  rejected?: boolean;
}
