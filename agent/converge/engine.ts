// Runs a bundle's steps in order. Each step is planned against the host as it is at that
// moment and applied; a failure is retried with a fixed interval (bashible: every 2 s, 10
// times) and then stops the run. Per-step logs go to /var/log/d8/bashible/step.<name>.log.
import type { Host } from "../host/host.ts";
import { sleep } from "../../lib/sleep.ts";
import type { BundleStep, NodeGroupBundle } from "../../bundles/types.ts";
import type { Change, StepContext } from "../../steps/types.ts";
import { loadStep } from "../../steps/index.ts";
import { bundleSecrets, redact } from "./bundle.ts";
import { stepLogPath } from "../../bundles/paths.ts";
import type { StepStatus } from "./state.ts";

export interface RetryPolicy {
  intervalMs: number;
  maxAttempts: number;
}

export const DEFAULT_RETRY: RetryPolicy = { intervalMs: 2000, maxAttempts: 10 };

export type BaseContext = Omit<StepContext, "stepName" | "logFile">;

export interface StepPlan {
  name: string;
  kind: BundleStep["kind"];
  changes: Change[];
  error?: string;
}

function contextFor(step: BundleStep, base: BaseContext): StepContext {
  return { ...base, stepName: step.name, logFile: stepLogPath(step.name) };
}

async function planOne(step: BundleStep, host: Host, ctx: StepContext): Promise<Change[]> {
  const impl = await loadStep(step.kind);
  // The union of specs narrows per kind inside each module; here any step takes its own spec.
  return impl.plan(step.spec as never, host, ctx);
}

/** Plans every step against the host as it is now. Changes nothing. */
export async function planSteps(host: Host, bundle: NodeGroupBundle, base: BaseContext): Promise<StepPlan[]> {
  const secrets = bundleSecrets(bundle);
  const out: StepPlan[] = [];
  for (const step of bundle.steps) {
    try {
      out.push({ name: step.name, kind: step.kind, changes: await planOne(step, host, contextFor(step, base)) });
    } catch (err) {
      out.push({ name: step.name, kind: step.kind, changes: [], error: redact((err as Error).message, secrets) });
    }
  }
  return out;
}

export interface ApplyHooks {
  onStepFailed?(step: BundleStep, message: string, logTail: string): Promise<void>;
}

export interface ApplyResult {
  ok: boolean;
  steps: StepStatus[];
  failed?: { name: string; error: string };
}

/** Applies the steps in order; stops at the first step that still fails after its retries. */
export async function applySteps(
  host: Host,
  bundle: NodeGroupBundle,
  base: BaseContext,
  retry: RetryPolicy = DEFAULT_RETRY,
  hooks: ApplyHooks = {},
): Promise<ApplyResult> {
  const secrets = bundleSecrets(bundle);
  const results: StepStatus[] = bundle.steps.map((s) => ({
    name: s.name,
    kind: s.kind,
    outcome: "not-run",
    changes: 0,
    attempts: 0,
    durationMs: 0,
  }));
  for (const [i, step] of bundle.steps.entries()) {
    const status = results[i] as StepStatus;
    const ctx = contextFor(step, base);
    const log = base.log.child({ step: step.name });
    const started = Date.now();
    await host.writeFile(ctx.logFile, `# ${new Date().toISOString()} ${step.name} (${step.kind})\n`, { mode: 0o640 });
    let lastError = "";
    for (let attempt = 1; attempt <= retry.maxAttempts; attempt++) {
      status.attempts = attempt;
      try {
        const impl = await loadStep(step.kind);
        const changes = await impl.plan(step.spec as never, host, ctx);
        if (changes.length === 0) {
          status.outcome = attempt > 1 ? "changed" : "unchanged";
          log.debug("step unchanged");
        } else {
          await host.appendFile(ctx.logFile, changes.map((c) => `plan: ${redact(c.summary, secrets)}\n`).join(""));
          const result = await impl.apply(changes, step.spec as never, host, ctx);
          status.outcome = "changed";
          status.changes = changes.length;
          if (result?.warnings?.length) status.warnings = result.warnings.map((w) => redact(w, secrets));
          log.info({ changes: changes.map((c) => redact(c.summary, secrets)) }, "step changed the node");
        }
        lastError = "";
        break;
      } catch (err) {
        lastError = redact((err as Error).message, secrets);
        await host.appendFile(ctx.logFile, `attempt ${attempt} failed: ${lastError}\n`);
        log.warn({ attempt, of: retry.maxAttempts }, `step failed: ${lastError}`);
        if (attempt < retry.maxAttempts) await sleep(retry.intervalMs, base.signal);
        if (base.signal?.aborted) break;
      }
    }
    status.durationMs = Date.now() - started;
    if (lastError) {
      status.outcome = "failed";
      status.error = lastError;
      const tail = redact(((await host.readText(ctx.logFile)) ?? "").slice(-500), secrets);
      await hooks.onStepFailed?.(step, lastError, tail);
      return { ok: false, steps: results, failed: { name: step.name, error: lastError } };
    }
  }
  return { ok: true, steps: results };
}
