// One converge, start to finish, and the read-only plan. The pieces (source, gate, engine,
// state, reporter, approval) are small and each phase is its own function (phases/); this file
// opens the session and decides their order:
//
//   fetch → gate → plan → 000_* steps (NodeUsers: emergency access never waits) → update
//   approval → the other steps (disruption approval before a disruptive one) → record →
//   reboot last, when a step or the Node asked for it and the disruption was approved.
import { access } from "node:fs/promises";
import { constants as fsConstants } from "node:fs";
import path from "node:path";
import type { Logger } from "../../lib/log/log.ts";
import { gatherFacts } from "../facts.ts";
import { Host, type OsProfile } from "../../host/host.ts";
import type { KubeClient } from "../../lib/kube/client.ts";
import type { NodeGroupBundle } from "../../bundles/types.ts";
import { NODE_KEYS } from "../../bundles/names.ts";
import { PATHS } from "../../bundles/paths.ts";
import { getNode, type KubeObject } from "../../lib/kube/api.ts";
import { agentArgv } from "../self.ts";
import { nodeName as resolveNodeName } from "./node-name.ts";
import { ApiBundleSource, FileBundleSource, resolveBundleFile, type BundleSource } from "./source.ts";
import { decide, type GateDecision } from "./gate.ts";
import { gateInput, readGateState, type NodeGateState } from "./gate-inputs.ts";
import {
  bundleSecrets,
  DEFAULT_RETRY,
  planSteps,
  type BaseContext,
  type RetryPolicy,
  type StepPlan,
} from "./engine.ts";
import { NodeReporter } from "./node-report.ts";
import { acquireLock } from "./lock.ts";
import { hostFlags } from "../../host/flags.ts";
import { lastGoodBundle, readStatus } from "./state.ts";
import { fetchBundle, recordFetch } from "./phases/fetch.ts";
import { applyAdmission, applyRest, markUnapplied, pendingOutsideAdmission } from "./phases/apply.ts";
import { approveUpdate } from "./phases/approve.ts";
import { inSync, recordApplied, recordFailure, waiting } from "./phases/record.ts";
import { announceApplied, rebootDecision } from "./phases/reboot.ts";
import type { ApplyingRun, ConvergeResult, Run } from "./phases/run.ts";

export interface ConvergeOptions {
  root: string;
  log: Logger;
  /** Local mode: a bundle file or directory; no bundle server. */
  bundle?: string;
  nodeName?: string;
  nodeGroup?: string;
  kubeconfig?: string;
  servers?: string[];
  retry?: RetryPolicy;
  approvalTimeoutMs?: number;
  /** The whole run's budget for retries (default 30 min). */
  runTimeoutMs?: number;
  signal?: AbortSignal;
}

export class ConvergeError extends Error {
  override name = "ConvergeError";
}

interface Session {
  host: Host;
  nodeName: string;
  source: BundleSource;
  reporter: NodeReporter;
  node?: KubeObject;
  lastGood?: NodeGroupBundle;
}

export async function osProfile(root: string): Promise<OsProfile> {
  const f = await gatherFacts(root);
  if (!f.os.id) throw new ConvergeError(await whyNoOs(root));
  if (!f.os.family || !f.os.packageManager) throw new ConvergeError(f.os.error ?? "unsupported OS");
  return {
    id: f.os.id,
    versionId: f.os.versionId,
    family: f.os.family,
    packageManager: f.os.packageManager as OsProfile["packageManager"],
  };
}

/** Why the OS under root cannot be told: no os-release, or one that cannot be read or has no ID. */
async function whyNoOs(root: string): Promise<string> {
  const where = root === "/" ? "this machine" : `--root ${root}`;
  for (const rel of ["etc/os-release", "usr/lib/os-release"]) {
    const file = path.join(root, rel);
    try {
      await access(file, fsConstants.R_OK);
      return `${file} has no ID= line: the OS of ${where} cannot be told`;
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === "ENOENT") continue;
      const fix = process.geteuid?.() === 0 ? "" : ": run it with sudo";
      return `cannot read ${file}: ${(err as Error).message}${fix}`;
    }
  }
  return root === "/"
    ? "this machine has no /etc/os-release (nor /usr/lib/os-release): its OS cannot be told"
    : `--root ${root} has no etc/os-release (nor usr/lib/os-release): point it at a node's root`;
}

/** Sets up host, identity, cluster access and the bundle source. Writes nothing unless `mayWrite`. */
async function openSession(o: ConvergeOptions, mayWrite: boolean): Promise<Session> {
  const host = new Host(o.root, await osProfile(o.root));
  const name = await resolveNodeName(host, o.nodeName);
  const status = await readStatus(host, { log: o.log, mayWrite });
  const lastGood = await lastGoodBundle(host, status, { log: o.log, mayWrite });
  let kube: KubeClient | undefined;
  let node: KubeObject | undefined;
  let clients: KubeClient[] = [];
  let nodeError: string | undefined;
  if (!o.bundle || o.kubeconfig) {
    // Loaded only with a cluster: TLS and the kubeconfig parser cost a local-mode plan ~100 ms.
    const { clusterClients } = await import("./connect.ts");
    clients = await clusterClients(host, {
      kubeconfig: o.kubeconfig,
      servers: o.servers,
      fallbackEndpoints: lastGood?.context.apiserverEndpoints,
    });
    const errors: string[] = [];
    for (const c of clients) {
      try {
        node = await getNode(c, name, { timeoutMs: 5000 });
        kube = c;
        break;
      } catch (err) {
        errors.push((err as Error).message);
        // The bootstrap identity may not read Nodes (there may be none yet); use it anyway.
        if (!kube) kube = c;
      }
    }
    if (!node) {
      nodeError = errors.join("; ");
      o.log.warn(`Node ${name} not readable: ${nodeError}`);
    }
  }
  let group = o.nodeGroup ?? node?.metadata.labels?.[NODE_KEYS.group];
  let source: BundleSource;
  if (o.bundle) {
    source = new FileBundleSource(await resolveBundleFile(o.bundle, group));
  } else {
    group ??= lastGood?.nodeGroup;
    if (!group) {
      const why = nodeError
        ? `Node ${name} could not be read (${nodeError})`
        : `Node ${name} has no ${NODE_KEYS.group} label`;
      throw new ConvergeError(`cannot tell this node's group: ${why} and no bundle was applied yet; pass --node-group`);
    }
    source = new ApiBundleSource(kube ? [kube, ...clients.filter((c) => c !== kube)] : clients, group);
  }
  return { host, nodeName: name, source, reporter: new NodeReporter(kube, name, o.log), node, lastGood };
}

/** The steps' shared context for this bundle; secrets bound once by the caller. */
async function baseContext(
  s: Session,
  o: ConvergeOptions,
  bundle: NodeGroupBundle,
  gate: NodeGateState,
  secrets: string[],
): Promise<BaseContext> {
  return {
    forced: gate.appliedChecksum === undefined,
    nodeName: s.nodeName,
    nodeGroup: bundle.nodeGroup,
    bundle,
    firstRun: await s.host.exists(PATHS.firstRun),
    bootId: gate.bootId,
    log: o.log,
    kube: s.reporter.kube,
    flags: hostFlags(s.host),
    agentArgv: agentArgv(),
    cluster: s.reporter.kube ? (o.kubeconfig ? { kubeconfig: o.kubeconfig } : {}) : "local",
    signal: o.signal,
    secrets,
  };
}

export interface PlanReport {
  nodeName: string;
  nodeGroup: string;
  checksum: string;
  source: string;
  gate: GateDecision;
  fetchError?: string;
  steps: StepPlan[];
  /** Values the printed plan must redact (commands' stdin is never printed at all). */
  secrets: string[];
}

/** What a converge would change now. Changes nothing on the host, not even state files. */
export async function plan(o: ConvergeOptions): Promise<PlanReport> {
  return (await planWithBundle(o)).report;
}

/**
 * The plan and the bundle it was made for: `bashible adopt` converges to exactly that bundle,
 * since the API may not be reachable while it moves Deckhouse's API proxy aside.
 */
export async function planWithBundle(o: ConvergeOptions): Promise<{ report: PlanReport; bundle: NodeGroupBundle }> {
  const s = await openSession(o, false);
  const f = await fetchBundle(s.source, s.lastGood);
  const bundle = f.bundle;
  if (!bundle) throw new ConvergeError(`no bundle: ${f.error ?? "nothing fetched"} and none applied before`);
  const secrets = await bundleSecrets(bundle);
  const gate = await readGateState(s.host, { log: o.log });
  const steps = await planSteps(s.host, bundle, await baseContext(s, o, bundle, gate, secrets));
  const report: PlanReport = {
    nodeName: s.nodeName,
    nodeGroup: bundle.nodeGroup,
    checksum: bundle.checksum,
    source: s.source.description,
    gate: decide(gateInput(gate, bundle.checksum, s.node)),
    fetchError: f.error,
    steps,
    secrets,
  };
  return { report, bundle };
}

/** One converge under the lock. Throws only when there is nothing to work with. */
export async function converge(o: ConvergeOptions): Promise<ConvergeResult> {
  const s = await openSession(o, true);
  const release = await acquireLock(await s.host.fs.realPath(PATHS.lock));
  try {
    return await convergeLocked(s, o);
  } finally {
    await release();
  }
}

async function convergeLocked(s: Session, o: ConvergeOptions): Promise<ConvergeResult> {
  const run = await fetchPhase(s, o);
  const gate = decide(gateInput(run.gateState, run.checksum, run.node));
  if (!gate.run) return inSync(run, gate.reason);
  o.log.info({ checksum: run.checksum.slice(0, 12), reason: gate.reason }, "converge starts");
  const r = await applyingRun(s, o, run, gate.reason);
  await markUnapplied(r);

  const admission = await applyAdmission(r);
  if (!admission.ok) return recordFailure(r, admission);
  if (!(await approveUpdate(r)))
    return waiting(r, "waiting-approval", `waiting for ${NODE_KEYS.approved}`, admission.steps);
  const rest = await applyRest(r);
  const steps = [...admission.steps, ...rest.steps];
  if (rest.stop === "not-approved") return waiting(r, "waiting-disruption-approval", rest.failed.error, steps);
  if (!rest.ok) return recordFailure(r, { ...rest, steps });

  await recordApplied(r, steps);
  const reboot = await rebootDecision(r);
  // No checksum annotation yet: the node is not done until it has rebooted.
  if (reboot === "waiting")
    return waiting(r, "waiting-disruption-approval", "reboot waits for disruption approval", steps);
  return announceApplied(r, steps, reboot === "reboot");
}

/** Fetches and records the fetch, then binds what the whole run shares: the bundle, its secrets, the gate's inputs. */
async function fetchPhase(s: Session, o: ConvergeOptions): Promise<Run> {
  const startedAt = new Date().toISOString();
  const { host, reporter } = s;
  const log = o.log;
  await host.mkdir(PATHS.stateDir, { mode: 0o755 });
  const f = await fetchBundle(s.source, s.lastGood);
  await recordFetch(f, startedAt, { host, reporter, log });
  const bundle = f.bundle;
  if (!bundle)
    throw new ConvergeError(`no bundle to apply: ${f.error ?? "nothing fetched"}, and none was applied before`);
  if (f.error) log.warn({ checksum: bundle.checksum.slice(0, 12) }, "keeping the last good bundle");
  return {
    host,
    log,
    reporter,
    nodeName: s.nodeName,
    node: s.node,
    bundle,
    checksum: bundle.checksum,
    secrets: await bundleSecrets(bundle),
    gateState: await readGateState(host, { log, mayWrite: true }),
    rejected: f.rejected,
    startedAt,
  };
}

/** The run the gate let through: the steps' context, the budgets, and whether update approval is needed. */
async function applyingRun(s: Session, o: ConvergeOptions, run: Run, reason: string): Promise<ApplyingRun> {
  const base = await baseContext(s, o, run.bundle, run.gateState, run.secrets);
  return {
    ...run,
    base,
    reason,
    retry: o.retry ?? DEFAULT_RETRY,
    deadline: Date.parse(run.startedAt) + (o.runTimeoutMs ?? 30 * 60_000),
    approvalTimeoutMs: o.approvalTimeoutMs ?? 10 * 60_000,
    pendingLater: await pendingOutsideAdmission({ host: run.host, bundle: run.bundle, base }),
  };
}
