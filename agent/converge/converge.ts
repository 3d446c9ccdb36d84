// One converge, start to finish, and the read-only plan. The pieces (source, gate, engine,
// state, reporter, approval) are small; this file decides their order.
import type { Logger } from "../../lib/log/log.ts";
import { gatherFacts, readBootId } from "../facts.ts";
import { Host, type OsProfile } from "../host/host.ts";
import type { KubeClient } from "../../lib/kube/client.ts";
import type { NodeGroupBundle } from "../../bundles/types.ts";
import { acceptBundle, bundleSecrets, BundleRejectedError, redact } from "./bundle.ts";
import { clusterClients } from "./connect.ts";
import { nodeName as resolveNodeName } from "./node-name.ts";
import { ApiBundleSource, FileBundleSource, resolveBundleFile, type BundleSource } from "./source.ts";
import { decide, type GateDecision } from "./gate.ts";
import { applySteps, DEFAULT_RETRY, planSteps, type BaseContext, type RetryPolicy, type StepPlan } from "./engine.ts";
import { NodeReporter } from "./node-report.ts";
import { waitForApproval } from "./approval.ts";
import { acquireLock } from "./lock.ts";
import { NODE_KEYS } from "../../bundles/names.ts";
import { PATHS } from "../../bundles/paths.ts";
import {
  lastGoodBundle,
  readAppliedChecksum,
  readStatus,
  rememberBundle,
  updateStatus,
  writeAppliedChecksum,
  type Status,
} from "./state.ts";
import { getNode, type KubeObject } from "../../lib/kube/api.ts";

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

/** Sets up host, identity, cluster access and the bundle source. Writes nothing. */
async function openSession(o: ConvergeOptions): Promise<Session> {
  const host = new Host(o.root, await osProfile(o.root));
  const name = await resolveNodeName(host, o.nodeName);
  const [status, lastGood] = await Promise.all([readStatus(host), lastGoodBundle(host)]);
  let kube: KubeClient | undefined;
  let node: KubeObject | undefined;
  let clients: KubeClient[] = [];
  let nodeError: string | undefined;
  if (!o.bundle || o.kubeconfig) {
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
    const file = await resolveBundleFile(o.bundle, group);
    source = new FileBundleSource(file);
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
  return {
    host,
    nodeName: name,
    source,
    reporter: new NodeReporter(kube, name, o.log),
    node,
    lastGood,
    status,
  };
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
  });
}

async function baseContext(s: Session, bundle: NodeGroupBundle, o: ConvergeOptions): Promise<BaseContext> {
  const [firstRun, applied] = await Promise.all([s.host.exists(PATHS.firstRun), readAppliedChecksum(s.host)]);
  return {
    forced: applied === undefined,
    nodeName: s.nodeName,
    nodeGroup: bundle.nodeGroup,
    bundle,
    firstRun,
    log: o.log,
    kube: s.reporter.kube,
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
}

/** What a converge would change now. Changes nothing on the host, not even state files. */
export async function plan(o: ConvergeOptions): Promise<PlanReport> {
  const s = await openSession(o);
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
  };
}

export type ConvergeOutcome = "applied" | "in-sync" | "failed" | "waiting-approval";

export interface ConvergeResult {
  outcome: ConvergeOutcome;
  checksum?: string;
  reason: string;
}

/** One converge under the lock. Throws only when there is nothing to work with. */
export async function converge(o: ConvergeOptions): Promise<ConvergeResult> {
  const s = await openSession(o);
  const release = await acquireLock(s.host.path(PATHS.lock));
  try {
    return await convergeLocked(s, o);
  } finally {
    await release();
  }
}

async function convergeLocked(s: Session, o: ConvergeOptions): Promise<ConvergeResult> {
  const { host, reporter, log } = { ...s, log: o.log };
  const startedAt = new Date().toISOString();
  await host.mkdir(PATHS.stateDir, { mode: 0o755 });

  const f = await fetchBundle(s);
  if (f.error) {
    log.error(`bundle fetch failed: ${f.error}`);
    const fetchError = { at: startedAt, message: f.error };
    await updateStatus(host, (st) => {
      st.fetchError = fetchError;
    });
    if (f.rejected) await reporter.event("BashibleBundleRejected", f.error, "Warning");
  } else {
    await updateStatus(host, (st) => void delete st.fetchError);
  }
  const bundle = f.bundle ?? s.lastGood;
  if (!bundle)
    throw new ConvergeError(`no bundle to apply: ${f.error ?? "nothing fetched"}, and none was applied before`);
  const secrets = bundleSecrets(bundle);
  const checksum = bundle.checksum;
  const gate = await gateFor(s, bundle);
  const finish = async (outcome: ConvergeOutcome, reason: string, patch?: (st: Status) => void) => {
    await updateStatus(host, (st) => {
      st.lastRun = { startedAt, finishedAt: new Date().toISOString(), checksum, outcome, reason };
      patch?.(st);
    });
    return { outcome, checksum, reason };
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
  const firstRun = base.firstRun;

  const plans = await planSteps(host, bundle, base);
  const pending = plans.some((p) => p.changes.length > 0 || p.error);
  // With a cluster, a later run never changes the node unapproved: if the Node cannot be read,
  // waitForApproval fails and so does the run.
  if (pending && !firstRun && reporter.kube) {
    const approved = await waitForApproval(reporter.kube, s.nodeName, log, {
      timeoutMs: o.approvalTimeoutMs ?? 10 * 60_000,
      signal: o.signal,
    });
    if (!approved) {
      log.warn("update not approved yet; the next run asks again");
      return finish("waiting-approval", "waiting for update.node.deckhouse.io/approved");
    }
  }

  // From here the node is between states: drop the applied checksum first (as Deckhouse does),
  // so a run that is killed or fails is never mistaken for an applied one.
  await host.remove(PATHS.configurationChecksum);
  await reporter.event("BashibleNodeUpdate", `converge to ${checksum.slice(0, 12)} started: ${gate.reason}`);
  const result = await applySteps(host, bundle, base, o.retry ?? DEFAULT_RETRY, {
    onStepFailed: (step, message, tail) =>
      reporter.event("BashibleStepFailed", `step ${step.name} failed: ${message}\n${tail}`, "Warning"),
  });

  if (!result.ok) {
    const error = redact(`step ${result.failed?.name} failed: ${result.failed?.error}`, secrets);
    log.error(error);
    await reporter.event("BashibleNodeUpdate", `converge to ${checksum.slice(0, 12)} failed: ${error}`, "Warning");
    return finish("failed", error, (st) => {
      st.failureCount = st.failedChecksum === checksum ? st.failureCount + 1 : 1;
      st.failedChecksum = checksum;
      st.steps = result.steps;
      if (st.lastRun) st.lastRun.error = error;
    });
  }

  // Success: remember the bundle first, then the checksum, so a kill in between re-runs
  // (cheaply: every step then plans nothing) instead of trusting an unrecorded bundle.
  await rememberBundle(host, bundle);
  const boot = await readBootId();
  await updateStatus(host, (st) => {
    st.appliedChecksum = checksum;
    st.appliedBootId = boot;
    st.appliedAt = new Date().toISOString();
    st.steps = result.steps;
    st.failureCount = 0;
    delete st.failedChecksum;
  });
  await writeAppliedChecksum(host, checksum);
  if (firstRun) await host.remove(PATHS.firstRun);
  const rebootAsked = s.node?.metadata.annotations?.[NODE_KEYS.reboot] !== undefined;
  await reporter.annotate({
    [NODE_KEYS.checksum]: checksum,
    [NODE_KEYS.waitingForApproval]: null,
    [NODE_KEYS.approved]: null,
    ...(rebootAsked ? { [NODE_KEYS.reboot]: null } : {}),
  });
  const changed = result.steps.filter((st) => st.outcome === "changed").map((st) => st.name);
  await reporter.event(
    "BashibleNodeUpdate",
    `converge to ${checksum.slice(0, 12)} finished; changed: ${changed.join(", ") || "nothing"}`,
  );
  log.info({ checksum: checksum.slice(0, 12), changed }, "converge finished");
  const outcome = await finish("applied", gate.reason);
  if (rebootAsked && !firstRun) {
    log.warn("rebooting: the Node asked for it with update.node.deckhouse.io/reboot");
    await host.reboot();
  }
  return outcome;
}
