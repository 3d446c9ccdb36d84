// Runs a bundle's steps in order. Each step is planned against the host as it is at that
// moment and its plan applied: primitives by the engine (primitives.ts), the step's own kinds by
// the step. A change carrying `isolate` fails alone (reported as a problem of its subject). A
// failure is retried with a fixed interval (bashible: every 2 s, 10 times) unless it cannot go
// away by waiting, within one deadline for the whole run; then the run stops. Units whose files
// changed in this run are restarted or reloaded (once) after the step that declares them, and
// again at the end of the run for files later steps changed.
import type { Host } from "../../host/host.ts";
import { sleep } from "../../lib/sleep.ts";
import { isPermanent } from "../../lib/errors.ts";
import type { BundleStep, NodeGroupBundle } from "../../bundles/types.ts";
import { STATE_DIR, stepLogPath } from "../../bundles/paths.ts";
import { isPrimitive, pathsOf } from "../../host/changes.ts";
import { bindStep, type BoundStep } from "../../steps/index.ts";
import type { Change, Flags, Problem, ServiceChange, ServiceDecl, StepContext } from "../../steps/types.ts";
import { redact } from "../../lib/log/redact.ts";
import { applyPrimitive } from "../../host/primitives.ts";
import { FLAG } from "../../host/flags.ts";
import { RunJournal } from "./journal.ts";
import type { StepStatus } from "./state.ts";

export interface RetryPolicy {
  intervalMs: number;
  maxAttempts: number;
}

export const DEFAULT_RETRY: RetryPolicy = { intervalMs: 2000, maxAttempts: 10 };

/**
 * What every step of one run shares. `secrets` are the bundle's (bundleSecrets), bound once per
 * converge and passed down; a caller that plans or applies a bundle once may leave them out.
 */
export type BaseContext = Omit<StepContext, "stepName" | "logFile" | "secrets"> & { secrets?: string[] };

export interface StepPlan {
  name: string;
  kind: BundleStep["kind"];
  changes: Change[];
  problems: Problem[];
  error?: string;
}

function contextFor(step: BundleStep, base: BaseContext, secrets: string[]): StepContext {
  return {
    ...base,
    log: base.log.child({ step: step.name }),
    stepName: step.name,
    logFile: stepLogPath(step.name),
    secrets,
  };
}

const bind = (step: BundleStep): Promise<BoundStep> => bindStep(step.kind, step.spec);

/** Every value in the bundle that must never be shown: the context's tokens and each step's secrets. */
export async function bundleSecrets(bundle: NodeGroupBundle): Promise<string[]> {
  const out = [bundle.context.packagesProxy.token];
  for (const step of bundle.steps) out.push(...(await bind(step)).secrets());
  return out.filter((v) => typeof v === "string" && v.length >= 4);
}

const flagsOf = (decl: ServiceDecl) => [FLAG.needRestart(decl.unit), ...(decl.flags ?? [])];

const covers = (reads: string[], p: string) =>
  reads.some((r) => (r.endsWith("/") ? p.startsWith(r) || `${p}/` === r : p === r));

/** The restart/reload a unit needs given the paths changed so far, or undefined. */
async function serviceChange(
  decl: ServiceDecl,
  changed: Iterable<string>,
  base: BaseContext,
): Promise<ServiceChange | undefined> {
  const why = [...changed].filter((p) => covers(decl.reads, p));
  for (const f of flagsOf(decl)) if (await base.flags.has(f)) why.push(`flag ${f}`);
  if (why.length === 0) return undefined;
  return {
    kind: "service",
    unit: decl.unit,
    action: decl.onChange,
    why,
    summary: `${decl.onChange} ${decl.unit}: ${why.join(", ")} changed`,
  };
}

/** Plans every step against the host as it is now. Changes nothing. */
export async function planSteps(host: Host, bundle: NodeGroupBundle, base: BaseContext): Promise<StepPlan[]> {
  const secrets = base.secrets ?? (await bundleSecrets(bundle));
  const out: StepPlan[] = [];
  const journal = await RunJournal.peek(host);
  const changed = new Set<string>();
  for (const step of bundle.steps) {
    try {
      const bound = await bind(step);
      const p = await bound.plan(host, contextFor(step, base, secrets));
      for (const c of p.changes) for (const path of pathsOf(c)) changed.add(path);
      for (const decl of bound.services(host)) {
        // Paths this plan would change, and those an unfinished run changed that this unit has not picked up.
        const svc = await serviceChange(decl, new Set([...changed, ...journal.pending(decl.unit)]), base);
        if (svc) p.changes.push(svc);
      }
      out.push({
        name: step.name,
        kind: step.kind,
        changes: p.changes,
        problems: p.problems.map((pr) => ({ ...pr, message: redact(pr.message, secrets) })),
      });
    } catch (err) {
      out.push({
        name: step.name,
        kind: step.kind,
        changes: [],
        problems: [],
        error: redact((err as Error).message, secrets),
      });
    }
  }
  return out;
}

export interface ApplyHooks {
  onStepFailed?(step: BundleStep, message: string, logTail: string): Promise<void>;
  /** Before a step whose plan has disruptive changes; false = not approved, stop the run. */
  approveDisruption?(step: BundleStep, reasons: string[]): Promise<boolean>;
}

/**
 * How an apply ended, as a tag callers branch on (never its message): every selected step ran
 * (`completed`), a disruptive change was not approved (`not-approved`: the run waits for the
 * approval), a step still failed after its retries (`failed`), or the run was stopped
 * (`aborted`: SIGTERM). `failed` names the step it stopped at and says why, redacted.
 */
export type ApplyResult =
  | { ok: true; stop: "completed"; steps: StepStatus[] }
  | {
      ok: false;
      stop: "not-approved" | "failed" | "aborted";
      steps: StepStatus[];
      failed: { name: string; error: string };
    };

/** The approval hook said no: the run stops at this step, never retried. */
class DisruptionNotApprovedError extends Error {
  override name = "DisruptionNotApprovedError";
  readonly permanent = true;
  constructor(reasons: string[]) {
    super(`disruptive change not approved: ${reasons.join("; ")}`);
  }
}

export interface ApplyOptions {
  retry?: RetryPolicy;
  /** Epoch ms after which no retry starts (the whole run's budget). */
  deadline?: number;
  hooks?: ApplyHooks;
  /** Only steps whose name passes (e.g. the 000_* steps before approval). */
  only?: (name: string) => boolean;
}

const secs = (ms: number) => (ms / 1000).toFixed(1);

/** Applies the steps in order; stops at the first step that still fails after its retries. */
export async function applySteps(
  host: Host,
  bundle: NodeGroupBundle,
  base: BaseContext,
  o: ApplyOptions = {},
): Promise<ApplyResult> {
  const retry = o.retry ?? DEFAULT_RETRY;
  const secrets = base.secrets ?? (await bundleSecrets(bundle));
  const journal = await RunJournal.open(host);
  const selected = bundle.steps.filter((s) => !o.only || o.only(s.name));
  const results: StepStatus[] = selected.map((s) => ({
    name: s.name,
    kind: s.kind,
    outcome: "not-run",
    changes: 0,
    attempts: 0,
    durationMs: 0,
  }));
  const declared: ServiceDecl[] = [];

  const restartServices = async (decls: ServiceDecl[], log: BaseContext["log"], logFile?: string) => {
    for (const decl of decls) {
      const svc = await serviceChange(decl, journal.pending(decl.unit), base);
      if (!svc) continue;
      log.info({ unit: decl.unit, action: decl.onChange, why: svc.why }, `${decl.onChange} ${decl.unit}`);
      await applyPrimitive(host, svc, { ...base, logFile, secrets });
      await journal.consume(decl.unit, svc.why);
      for (const f of flagsOf(decl)) await base.flags.unset(f);
    }
  };

  for (const [i, step] of selected.entries()) {
    const status = results[i] as StepStatus;
    if (base.signal?.aborted) {
      return {
        ok: false,
        stop: "aborted",
        steps: results,
        failed: { name: step.name, error: "the run was stopped before this step" },
      };
    }
    const ctx = contextFor(step, base, secrets);
    const log = ctx.log;
    const started = Date.now();
    await host.writeFile(ctx.logFile, `# ${new Date().toISOString()} ${step.name} (${step.kind})\n`, { mode: 0o640 });
    let lastError = "";
    let notApproved = false;
    let bound: BoundStep | undefined;
    for (let attempt = 1; attempt <= retry.maxAttempts; attempt++) {
      status.attempts = attempt;
      try {
        bound ??= await bind(step);
        const plan = await bound.plan(host, ctx);
        const problems = [...plan.problems];
        const failedSubjects = new Set<string>();
        let applied = 0;
        if (plan.changes.length > 0) {
          const disruptive = plan.changes.flatMap((c) => (c.disruptive ? [c.disruptive] : []));
          if (disruptive.length && o.hooks?.approveDisruption && !(await o.hooks.approveDisruption(step, disruptive))) {
            throw new DisruptionNotApprovedError(disruptive);
          }
          await host.appendFile(ctx.logFile, plan.changes.map((c) => `plan: ${redact(c.summary, secrets)}\n`).join(""));
        }
        for (const change of plan.changes) {
          if (change.isolate && failedSubjects.has(change.isolate)) continue;
          try {
            if (isPrimitive(change)) await applyPrimitive(host, change, { ...ctx, secrets });
            else await bound.applyOwn(change, host, ctx);
            applied++;
            await journal.record(pathsOf(change));
          } catch (err) {
            if (!change.isolate) throw err;
            failedSubjects.add(change.isolate);
            const message = redact((err as Error).message, secrets);
            problems.push({ subject: change.isolate, message });
            log.warn({ subject: change.isolate, err: message }, "change failed; the others go on");
          }
        }
        const decls = bound.services(host);
        declared.push(...decls);
        await restartServices(decls, log, ctx.logFile);
        await bound.report(problems, ctx);
        status.outcome = applied > 0 || attempt > 1 ? "changed" : "unchanged";
        status.changes = applied;
        if (problems.length)
          status.problems = problems.map((p) => ({ subject: p.subject, message: redact(p.message, secrets) }));
        if (applied > 0)
          log.info({ changes: plan.changes.map((c) => redact(c.summary, secrets)) }, "step changed the node");
        else log.debug("step unchanged");
        lastError = "";
        break;
      } catch (err) {
        lastError = redact((err as Error).message, secrets);
        notApproved = err instanceof DisruptionNotApprovedError;
        await host.appendFile(ctx.logFile, `attempt ${attempt} failed: ${lastError}\n`).catch(() => undefined);
        const permanent = isPermanent(err);
        log.warn({ attempt, of: retry.maxAttempts, permanent }, `step failed: ${lastError}`);
        if (permanent || base.signal?.aborted) break;
        if (o.deadline !== undefined && Date.now() + retry.intervalMs > o.deadline) {
          lastError += " (the run's time budget is spent)";
          break;
        }
        if (attempt < retry.maxAttempts) await sleep(retry.intervalMs, base.signal);
        if (base.signal?.aborted) break;
      }
    }
    status.durationMs = Date.now() - started;
    // Progress for whoever watches a run (bootstrap prints it): k of n in the whole bundle.
    const k = bundle.steps.indexOf(step) + 1;
    const outcome = lastError ? "failed" : status.outcome;
    log.info(
      { progress: `${k}/${bundle.steps.length}`, outcome, durationMs: status.durationMs },
      `step ${k} of ${bundle.steps.length} ${step.name}: ${outcome} in ${secs(status.durationMs)} s (${secs(performance.now())} s elapsed)`,
    );
    if (lastError) {
      status.outcome = "failed";
      status.error = lastError;
      const tail = redact(((await host.readText(ctx.logFile).catch(() => "")) ?? "").slice(-500), secrets);
      await o.hooks?.onStepFailed?.(step, lastError, tail);
      const stop = notApproved ? "not-approved" : base.signal?.aborted ? "aborted" : "failed";
      return { ok: false, stop, steps: results, failed: { name: step.name, error: lastError } };
    }
  }
  // Files a later step (a custom script, say) changed that an earlier step's unit reads.
  await restartServices(declared, base.log);
  return { ok: true, stop: "completed", steps: results };
}

/** What the script helpers keep between steps of one run (Deckhouse's bb-run-finished clears it). */
const HELPER_RUN_STATE = [
  `${STATE_DIR}/bashbooster_unhandled_synced_files`,
  `${STATE_DIR}/bashbooster_unhandled_packages`,
];
const HELPER_RUN_FLAGS = ["apt-updated", "apt-rpm-updated", "yum-updated", "dnf-updated", "zypper-updated"];

/** The run finished: nothing is pending any more (the journal, the helpers' per-run state). */
export async function finishRun(host: Host, flags: Flags): Promise<void> {
  await (await RunJournal.open(host)).clear();
  for (const p of HELPER_RUN_STATE) await host.remove(p);
  for (const f of HELPER_RUN_FLAGS) await flags.unset(f);
}
