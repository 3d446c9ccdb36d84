// One converge, start to finish, and the read-only plan. The pieces (source, gate, engine,
// state, reporter, approval) are small; this file decides their order:
//
//   fetch → gate → plan → 000_* steps (NodeUsers: emergency access never waits) → update
//   approval → the other steps (disruption approval before a disruptive one) → record →
//   reboot last, when a step or the Node asked for it and the disruption was approved.
import type { Logger } from "../../lib/log/log.ts";
import { gatherFacts, readBootId } from "../facts.ts";
import { Host, type OsProfile } from "../../host/host.ts";
import type { KubeClient } from "../../lib/kube/client.ts";
import type { NodeGroupBundle } from "../../bundles/types.ts";
import { acceptBundle, BundleRejectedError } from "../../bundles/verify.ts";
import { NODE_KEYS, EVENTS } from "../../bundles/names.ts";
import { PATHS } from "../../bundles/paths.ts";
import { getNode, type KubeObject } from "../../lib/kube/api.ts";
import { redact } from "../../lib/log/redact.ts";
import { agentArgv } from "../self.ts";
import { nodeName as resolveNodeName } from "./node-name.ts";
import { ApiBundleSource, FileBundleSource, resolveBundleFile, type BundleSource } from "./source.ts";
import { decide, type GateDecision } from "./gate.ts";
import {
  applySteps,
  bundleSecrets,
  DEFAULT_RETRY,
  finishRun,
  planSteps,
  type BaseContext,
  type RetryPolicy,
  type StepPlan,
} from "./engine.ts";
import { NodeReporter } from "./node-report.ts";
import { announceAndWait, hasAnnotation } from "./approval.ts";
import { acquireLock } from "./lock.ts";
import { FLAG, hostFlags } from "../../host/flags.ts";
import {
  lastGoodBundle,
  readAppliedChecksum,
  readStatus,
  rememberBundle,
  updateStatus,
  writeAppliedChecksum,
  type RunOutcome,
  type Status,
} from "./state.ts";

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
  status: Status;
}

export async function osProfile(root: string): Promise<OsProfile> {
  const f = await gatherFacts(root);
  if (!f.os.family || !f.os.packageManager) throw new ConvergeError(f.os.error ?? "unsupported OS");
  return {
    id: f.os.id,
    versionId: f.os.versionId,
    family: f.os.family,
    packageManager: f.os.packageManager as OsProfile["packageManager"],
  };
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
  return { host, nodeName: name, source, reporter: new NodeReporter(kube, name, o.log), node, lastGood, status };
}

interface Fetch {
  bundle?: NodeGroupBundle;
  error?: string;
  rejected: boolean;
}

async function fetchBundle(s: Session): Promise<Fetch> {
  try {
    const got = await s.source.fetch();
    if ("notModified" in got) return { bundle: s.lastGood, rejected: false };
    return { bundle: acceptBundle(got.raw, s.source.description), rejected: false };
  } catch (err) {
    return { error: (err as Error).message, rejected: err instanceof BundleRejectedError };
  }
}

async function gateFor(s: Session, bundle: NodeGroupBundle): Promise<GateDecision> {
  return decide({
    bundleChecksum: bundle.checksum,
    bootId: await readBootId(),
    appliedChecksum: await readAppliedChecksum(s.host),
    appliedBootId: s.status.appliedBootId,
    rebootRequested: s.node?.metadata.annotations?.[NODE_KEYS.reboot] !== undefined,
    rebootPending: await hostFlags(s.host).has(FLAG.reboot),
  });
}

async function baseContext(s: Session, bundle: NodeGroupBundle, o: ConvergeOptions): Promise<BaseContext> {
  const [firstRun, applied, bootId] = await Promise.all([
    s.host.exists(PATHS.firstRun),
    readAppliedChecksum(s.host),
    readBootId(),
  ]);
  return {
    forced: applied === undefined,
    nodeName: s.nodeName,
    nodeGroup: bundle.nodeGroup,
    bundle,
    firstRun,
    bootId,
    log: o.log,
    kube: s.reporter.kube,
    flags: hostFlags(s.host),
    agentArgv: agentArgv(),
    cluster: s.reporter.kube ? (o.kubeconfig ? { kubeconfig: o.kubeconfig } : {}) : "local",
    signal: o.signal,
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
  const s = await openSession(o, false);
  const f = await fetchBundle(s);
  const bundle = f.bundle ?? s.lastGood;
  if (!bundle) throw new ConvergeError(`no bundle: ${f.error ?? "nothing fetched"} and none applied before`);
  const steps = await planSteps(s.host, bundle, await baseContext(s, bundle, o));
  return {
    nodeName: s.nodeName,
    nodeGroup: bundle.nodeGroup,
    checksum: bundle.checksum,
    source: s.source.description,
    gate: await gateFor(s, bundle),
    fetchError: f.error,
    steps,
    secrets: await bundleSecrets(bundle),
  };
}

export interface ConvergeResult {
  outcome: RunOutcome;
  checksum?: string;
  reason: string;
  /** The bundle fetched was refused; the last good one was used (or nothing ran). */
  rejected?: boolean;
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

const isAdmissionStep = (name: string) => name.startsWith("000_");

async function convergeLocked(s: Session, o: ConvergeOptions): Promise<ConvergeResult> {
  const { host, reporter } = s;
  const log = o.log;
  const startedAt = new Date().toISOString();
  const deadline = Date.now() + (o.runTimeoutMs ?? 30 * 60_000);
  await host.mkdir(PATHS.stateDir, { mode: 0o755 });

  const f = await fetchBundle(s);
  if (f.error) {
    log.error(`bundle fetch failed: ${f.error}`);
    const fetchError = { at: startedAt, message: f.error };
    await updateStatus(
      host,
      (st) => {
        st.fetchError = fetchError;
      },
      { log },
    );
    if (f.rejected) await reporter.event(EVENTS.bundleRejected, f.error, "Warning");
  } else {
    await updateStatus(
      host,
      (st) => {
        delete st.fetchError;
      },
      { log },
    );
  }
  const bundle = f.bundle ?? s.lastGood;
  if (!bundle)
    throw new ConvergeError(`no bundle to apply: ${f.error ?? "nothing fetched"}, and none was applied before`);
  if (f.error) log.warn({ checksum: bundle.checksum.slice(0, 12) }, "keeping the last good bundle");
  const rejected = f.rejected;
  const secrets = await bundleSecrets(bundle);
  const checksum = bundle.checksum;
  const gate = await gateFor(s, bundle);
  const finish = async (outcome: RunOutcome, reason: string, patch?: (st: Status) => void): Promise<ConvergeResult> => {
    await updateStatus(host, (st) => {
      st.lastRun = { startedAt, finishedAt: new Date().toISOString(), checksum, outcome, reason };
      if (!outcome.startsWith("waiting")) delete st.waiting;
      patch?.(st);
    });
    return { outcome, checksum, reason, ...(rejected ? { rejected } : {}) };
  };

  if (!gate.run) {
    if (s.node && s.node.metadata.annotations?.[NODE_KEYS.checksum] !== checksum) {
      await reporter.annotate({ [NODE_KEYS.checksum]: checksum });
    }
    log.debug(gate.reason);
    return finish("in-sync", gate.reason);
  }
  log.info({ checksum: checksum.slice(0, 12), reason: gate.reason }, "converge starts");
  const base = await baseContext(s, bundle, o);
  const { firstRun } = base;
  const approvalTimeoutMs = o.approvalTimeoutMs ?? 10 * 60_000;
  const kube = reporter.kube;
  const wait = async (what: string, announce: Record<string, string | null>, grantedKey: string) => {
    if (!kube) return true; // local mode: the operator who ran it is the approval
    await updateStatus(host, (st) => {
      st.waiting = { for: what, since: new Date().toISOString() };
    });
    log.info(`waiting for ${grantedKey} on Node ${s.nodeName} (${what})`);
    return announceAndWait(kube, s.nodeName, log, announce, hasAnnotation(grantedKey), {
      timeoutMs: approvalTimeoutMs,
      signal: o.signal,
    });
  };
  const approveDisruption = async (reasons: string[]): Promise<boolean> => {
    if (firstRun) return true; // provisioning: nothing runs on the node yet (as Deckhouse)
    if (await base.flags.has(FLAG.disruption)) return true;
    if (bundle.context.nodeGroup.disruptions.approvalMode === "RollingUpdate") {
      await reporter.annotate({ [NODE_KEYS.rollingUpdate]: "" });
      log.warn({ reasons }, "disruptive update: the node is marked for replacement (RollingUpdate)");
      return false;
    }
    const ok = await wait(
      `disruption approval: ${reasons.join("; ")}`,
      { [NODE_KEYS.disruptionRequired]: "" },
      NODE_KEYS.disruptionApproved,
    );
    if (ok) await base.flags.set(FLAG.disruption, reasons.join("; "));
    return ok;
  };

  const plans = await planSteps(host, bundle, base);
  const pendingLater = plans.some((p) => !isAdmissionStep(p.name) && (p.changes.length > 0 || p.error));

  // From here the node is between states: drop the applied checksum first (as Deckhouse does),
  // so a run that is killed or fails is never mistaken for an applied one.
  await host.remove(PATHS.configurationChecksum);
  // What scripts' helpers (bb-package-install, disruption approval) read: the bundle being applied.
  await host.writeFile(PATHS.runBundle, JSON.stringify(bundle), { mode: 0o600 });
  await reporter.event(EVENTS.nodeUpdate, `converge to ${checksum.slice(0, 12)} started: ${gate.reason}`);
  const hooks = {
    onStepFailed: (step: { name: string }, message: string, tail: string) =>
      reporter.event(EVENTS.stepFailed, `step ${step.name} failed: ${message}\n${tail}`, "Warning"),
    approveDisruption: (_step: unknown, reasons: string[]) => approveDisruption(reasons),
  };
  const failed = async (result: Awaited<ReturnType<typeof applySteps>>) => {
    const error = redact(`step ${result.failed?.name} failed: ${result.failed?.error}`, secrets);
    log.error(error);
    await reporter.event(EVENTS.nodeUpdate, `converge to ${checksum.slice(0, 12)} failed: ${error}`, "Warning");
    return finish("failed", error, (st) => {
      st.failureCount = st.failedChecksum === checksum ? st.failureCount + 1 : 1;
      st.failedChecksum = checksum;
      st.steps = result.steps;
      if (st.lastRun) st.lastRun.error = error;
    });
  };
  const retry = o.retry ?? DEFAULT_RETRY;

  // NodeUsers first, without waiting: emergency access must not depend on an approval.
  const admission = await applySteps(host, bundle, base, { retry, deadline, hooks, only: isAdmissionStep });
  if (!admission.ok) return failed(admission);

  // A later run never changes the node unapproved: if the Node cannot be read, this fails.
  if (pendingLater && !firstRun && kube) {
    const approved = await wait(
      "update approval",
      { [NODE_KEYS.waitingForApproval]: "", [NODE_KEYS.checksum]: null },
      NODE_KEYS.approved,
    );
    if (!approved) {
      log.warn("update not approved yet; the next run asks again");
      return finish("waiting-approval", `waiting for ${NODE_KEYS.approved}`, (st) => {
        st.steps = admission.steps;
      });
    }
  }
  const rest = await applySteps(host, bundle, base, { retry, deadline, hooks, only: (n) => !isAdmissionStep(n) });
  const steps = [...admission.steps, ...rest.steps];
  if (!rest.ok) {
    if (/disruptive change not approved/.test(rest.failed?.error ?? "")) {
      return finish("waiting-disruption-approval", rest.failed?.error ?? "", (st) => {
        st.steps = steps;
      });
    }
    return failed({ ...rest, steps });
  }

  // Success: remember the bundle first, then the checksum, so a kill in between re-runs
  // (cheaply: every step then plans nothing) instead of trusting an unrecorded bundle.
  await rememberBundle(host, bundle);
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
  if (firstRun) await host.remove(PATHS.firstRun);
  const changed = steps.filter((st) => st.outcome === "changed").map((st) => st.name);

  // Reboot last: asked by a step or a script (flag), or by the Node's annotation.
  const rebootAsked =
    (await base.flags.has(FLAG.reboot)) || s.node?.metadata.annotations?.[NODE_KEYS.reboot] !== undefined;
  let reboot = false;
  if (rebootAsked && firstRun) {
    log.info("first run: reboot skipped, as Deckhouse does while provisioning");
    await base.flags.unset(FLAG.reboot);
  } else if (rebootAsked) {
    reboot = await approveDisruption(["reboot"]);
    if (!reboot) {
      // No checksum annotation yet: the node is not done until it has rebooted.
      return finish("waiting-disruption-approval", "reboot waits for disruption approval", (st) => {
        st.steps = steps;
      });
    }
  }
  await base.flags.unset(FLAG.disruption);
  // The checksum annotation says "done": the approval controller uncordons a node once it
  // matches, so a node about to reboot does not write it; the run after the reboot does (the
  // new boot id forces one). The approval annotations are the controller's to clear.
  await reporter.annotate(reboot ? { [NODE_KEYS.reboot]: null } : { [NODE_KEYS.checksum]: checksum });
  // The first run's end: the cluster removes the taint the kubelet registered with (a kubelet
  // may not remove its own), so workloads come only to a converged node.
  if (firstRun) await reporter.label({ [NODE_KEYS.firstRunFinished]: "true" });
  await reporter.event(
    EVENTS.nodeUpdate,
    `converge to ${checksum.slice(0, 12)} finished; changed: ${changed.join(", ") || "nothing"}${reboot ? "; rebooting" : ""}`,
  );
  log.info({ checksum: checksum.slice(0, 12), changed }, "converge finished");
  const outcome = await finish("applied", gate.reason);
  if (reboot) {
    await base.flags.unset(FLAG.reboot);
    log.warn("rebooting: disruption approved");
    await host.reboot();
  }
  return outcome;
}
