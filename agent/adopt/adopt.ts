// Taking a node over from Deckhouse's bashible, and giving it back.
//
// The plan is `bashible plan` for the node's bundle (the same steps, diffs and restarts a
// converge would apply over what Deckhouse left) plus what adoption itself does: stop and disable
// Deckhouse's timer, save a copy of every Deckhouse file the converge would change or remove,
// move the API proxy's static pod out of the kubelet's manifests (this agent runs the proxy as a
// unit on the same address). Adopting carries out exactly that, records it, then converges.
// Nothing here deletes the Node, the kubelet's certificates or the containers: the converge keeps
// what its steps find equal, and the kubelet's restart (when its unit or config differs) leaves
// the pods running.
import { ADOPTION, DECKHOUSE } from "../../bundles/deckhouse-node.ts";
import { PATHS } from "../../bundles/paths.ts";
import { UNITS } from "../../bundles/steps/index.ts";
import type { FileStat, Host } from "../../host/host.ts";
import { VERSION } from "../../lib/version.ts";
import { type ConvergeOptions, converge, planWithBundle, type PlanReport } from "../converge/converge.ts";
import type { NodeGroupBundle } from "../../bundles/types.ts";
import type { Recognition } from "./recognize.ts";
import { type AdoptionRecord, type SavedFile, readRecord, writeRecord } from "./record.ts";

export interface AdoptionPlan {
  recognition: Recognition;
  report: PlanReport;
  /** The bundle planned for: the converge applies this one. */
  bundle: NodeGroupBundle;
  /** Units adoption stops and disables, with why. */
  stop: { unit: string; why: string }[];
  /** Deckhouse's unit the converge replaces with this agent's (the same name). */
  replace: { unit: string; why: string };
  /** Deckhouse's files the converge changes or removes: saved first. */
  save: string[];
  /** Files the converge creates where Deckhouse had none. */
  create: string[];
  /** Services the converge restarts or reloads, with what they read that changed. */
  restarts: { unit: string; action: "restart" | "reload"; why: string[] }[];
  /** The static pod manifest moved out, when the node runs the API proxy as one. */
  moveManifest?: string;
}

export const savedCopy = (p: string) => `${ADOPTION.saved}${p}`;

export class AdoptRefused extends Error {
  override name = "AdoptRefused";
}

/**
 * The adoption plan: `recognition` (of the node under `host`), the converge's plan, and
 * adoption's own changes. Changes nothing.
 */
export async function planAdoption(o: ConvergeOptions, host: Host, recognition: Recognition): Promise<AdoptionPlan> {
  const { report, bundle } = await planWithBundle(o);
  const save = new Set<string>();
  const create: string[] = [];
  const restarts: AdoptionPlan["restarts"] = [];
  for (const s of report.steps) {
    for (const c of s.changes) {
      if ((c.kind === "file" || c.kind === "symlink") && c.path) {
        if (c.action === "create") create.push(c.path);
        else save.add(c.path);
      } else if (c.kind === "service") {
        restarts.push({ unit: c.unit, action: c.action, why: c.why ?? [] });
      }
    }
  }
  // Deckhouse's own units, whatever the plan says about them: revert puts them back.
  for (const p of [DECKHOUSE.serviceFile, DECKHOUSE.timerFile]) if (await host.exists(p)) save.add(p);
  const stop: AdoptionPlan["stop"] = [];
  if (await host.exists(DECKHOUSE.timerFile)) {
    stop.push({ unit: DECKHOUSE.timer, why: "Deckhouse's bashible would run every minute beside this agent" });
  }
  const replace = {
    unit: DECKHOUSE.service,
    why: `Deckhouse's oneshot (runs ${DECKHOUSE.entry}): a run in progress is waited for, then the converge replaces the unit with this agent's daemon`,
  };
  // Only when this agent's bundle runs the proxy itself: otherwise the static pod stays the node's proxy.
  const runsProxy = report.steps.some((s) => s.kind === "KubernetesApiProxy");
  const manifest =
    runsProxy && (await host.exists(DECKHOUSE.apiProxyManifest)) ? DECKHOUSE.apiProxyManifest : undefined;
  return {
    recognition,
    report,
    bundle,
    stop,
    replace,
    save: [...save].sort(),
    create: create.sort(),
    restarts,
    ...(manifest ? { moveManifest: manifest } : {}),
  };
}

/** Why adoption cannot go ahead on this plan, or undefined. */
export function refusal(p: AdoptionPlan): string | undefined {
  const r = p.recognition;
  if (r.kind === "unknown") return `${r.reason}: there is nothing to adopt`;
  if (p.report.fetchError)
    return `the node's bundle could not be fetched (${p.report.fetchError}); nothing was changed`;
  const failed = p.report.steps.filter((s) => s.error);
  if (failed.length)
    return `${failed.map((s) => `${s.name}: ${s.error}`).join("; ")}: these steps cannot be planned, so adoption would stop halfway; nothing was changed`;
  return undefined;
}

export function formatAdoptionPlan(p: AdoptionPlan, formattedPlan: string): string {
  const r = p.recognition;
  const found = r.evidence.filter((e) => e.found);
  const lines = [
    `node: ${r.reason}`,
    ...(r.deckhouseChecksum ? [`Deckhouse's last applied checksum: ${r.deckhouseChecksum}`] : []),
    "found:",
    ...found.map((e) => `  ${e.path}  (${e.what})`),
    "",
    "adoption:",
    ...p.stop.map((s) => `  stop and disable ${s.unit}: ${s.why}`),
    `  replace ${p.replace.unit}: ${p.replace.why}`,
    ...(p.moveManifest
      ? [
          `  move ${p.moveManifest} to ${savedCopy(p.moveManifest)}: the kubelet stops Deckhouse's API proxy pod; ${UNITS.apiProxy} takes 127.0.0.1:6445 over`,
        ]
      : []),
    `  save a copy of ${p.save.length} Deckhouse file${p.save.length === 1 ? "" : "s"} under ${ADOPTION.saved} before the converge changes ${p.save.length === 1 ? "it" : "them"}:`,
    ...p.save.map((f) => `    ${f}`),
    ...(p.create.length
      ? ["  files the converge creates (revert removes them):", ...p.create.map((f) => `    ${f}`)]
      : []),
    p.restarts.length
      ? `  services that would restart: ${p.restarts.map((s) => `${s.unit} (${s.action}: ${s.why.join(", ") || "changed"})`).join("; ")}`
      : "  services that would restart: none",
    `  record what was done and how to go back in ${ADOPTION.record}`,
    "  kept: the Node object, the kubelet's certificates and kubeconfig, containerd's state and the running pods",
    "",
    "the converge over what Deckhouse left (bashible plan):",
    formattedPlan.trimEnd(),
  ];
  return `${lines.join("\n")}\n`;
}

export interface AdoptHooks {
  /** Waits until `unit` is no longer running (Deckhouse's oneshot finishing a run); false = gave up. */
  waitInactive(host: Host, unit: string): Promise<boolean>;
  /** Waits until nothing listens on the API proxy's address (the static pod gone). */
  waitProxyGone(host: Host): Promise<boolean>;
}

const now = () => new Date().toISOString();

function revertCommands(r: AdoptionRecord): string[] {
  return [
    `systemctl disable --now ${UNITS.agent} ${UNITS.agentRestart}`,
    ...r.saved.map((s) => `cp -a ${s.copy} ${s.path}`),
    ...r.created.map((p) => `rm -f ${p}`),
    ...(r.movedManifest
      ? [`systemctl disable --now ${UNITS.apiProxy}`, `mv ${r.movedManifest.copy} ${r.movedManifest.path}`]
      : []),
    "systemctl daemon-reload",
    `systemctl enable --now ${DECKHOUSE.timer}`,
  ];
}

/** Copies the file `from` (stat `st`) to `to`, mode and owner kept, its directory root-only; false when unreadable. */
async function copyOut(host: Host, from: string, st: FileStat, to: string): Promise<boolean> {
  const content = await host.readFile(from);
  if (content === undefined) return false;
  await host.mkdir(to.slice(0, to.lastIndexOf("/")), { mode: 0o700 });
  await host.writeFile(to, content, { mode: st.mode, uid: st.uid, gid: st.gid });
  return true;
}

/** Saves a copy of a node file under ADOPTION.saved, once: a resumed adoption keeps the first copy. */
async function saveOnce(host: Host, p: string): Promise<SavedFile | undefined> {
  const copy = savedCopy(p);
  if (await host.exists(copy)) return { path: p, copy };
  const st = await host.stat(p);
  if (!st) return undefined;
  if (st.isSymlink) await host.symlink(copy, (await host.fs.readLink(p)) ?? "");
  else if (!st.isFile || !(await copyOut(host, p, st, copy))) return undefined;
  return { path: p, copy };
}

/**
 * Adopts the node under `host` on this plan: records, saves, stops Deckhouse's timer, moves the proxy's
 * static pod, converges, records the outcome. Returns the record.
 */
export async function adopt(
  o: ConvergeOptions,
  host: Host,
  p: AdoptionPlan,
  hooks: AdoptHooks,
): Promise<AdoptionRecord> {
  const log = o.log;
  // The record as the plan's recognition read it (planning changes nothing).
  const previous = p.recognition.record;
  const resume = previous?.state === "adopting" ? previous : undefined;
  const record: AdoptionRecord = {
    version: 1,
    state: "adopting",
    startedAt: resume?.startedAt ?? now(),
    agentVersion: VERSION,
    nodeName: p.report.nodeName,
    nodeGroup: p.report.nodeGroup,
    deckhouseChecksum: resume?.deckhouseChecksum ?? p.recognition.deckhouseChecksum,
    bundleChecksum: p.report.checksum,
    stopped: resume?.stopped ?? [],
    saved: resume?.saved ?? [],
    created: [...new Set([...(resume?.created ?? []), ...p.create])],
    ...(resume?.movedManifest ? { movedManifest: resume.movedManifest } : {}),
    restarted: [],
    revertByHand: [],
  };
  const save = async () => {
    record.revertByHand = revertCommands(record);
    await writeRecord(host, record);
  };
  await host.mkdir(ADOPTION.saved, { mode: 0o700 });
  await save(); // before the first change: whatever happens next, the record says where things are

  // 1. No new Deckhouse run; the one in progress (if any) finishes first.
  if (p.stop.some((s) => s.unit === DECKHOUSE.timer)) {
    await host.systemctl("stop", DECKHOUSE.timer);
    await host.systemctl("disable", DECKHOUSE.timer);
    if (!record.stopped.includes(DECKHOUSE.timer)) record.stopped.push(DECKHOUSE.timer);
    await save();
    log.info({ unit: DECKHOUSE.timer }, "stopped and disabled Deckhouse's timer");
  }
  if (!(await hooks.waitInactive(host, DECKHOUSE.service))) {
    throw new AdoptRefused(
      `Deckhouse's ${DECKHOUSE.service} is still running a converge; its timer is stopped, so no new one starts: wait for it to finish and run 'bashible adopt --yes' again (or 'bashible adopt --revert' to turn the timer back on)`,
    );
  }

  // 2. Copies of every Deckhouse file the converge changes or removes, and its units.
  for (const f of p.save) {
    if (record.saved.some((s) => s.path === f)) continue;
    const saved = await saveOnce(host, f);
    if (saved) record.saved.push(saved);
  }
  record.created = record.created.filter((c) => !record.saved.some((s) => s.path === c));
  await save();
  log.info({ files: record.saved.length, dir: ADOPTION.saved }, "saved Deckhouse's files");

  // 3. The API proxy: out of the kubelet's manifests, so this agent's unit can take its address.
  if (p.moveManifest && !record.movedManifest) {
    const copy = savedCopy(p.moveManifest);
    const st = await host.stat(p.moveManifest);
    if (st && (await copyOut(host, p.moveManifest, st, copy))) {
      await host.remove(p.moveManifest);
      record.movedManifest = { path: p.moveManifest, copy };
      await save();
      log.info({ manifest: p.moveManifest }, "moved the API proxy's static pod manifest out");
      if (!(await hooks.waitProxyGone(host))) {
        throw new AdoptRefused(
          `the kubelet still runs Deckhouse's API proxy on 127.0.0.1:6445 after its manifest was moved to ${copy}: check 'crictl ps --name kubernetes-api-proxy', then run 'bashible adopt --yes' again`,
        );
      }
    }
  }

  // 4. This agent's converge over what Deckhouse left, to the bundle planned: with the API proxy
  // moved aside, the API may be out of reach until the converge's first step runs the proxy
  // again. Reported to the cluster all the same (the kubelet's credentials), as `once` does.
  await host.writeFile(ADOPTION.bundle, JSON.stringify(p.bundle), { mode: 0o600 });
  // In API mode the converge reports with the kubelet's credentials (a path on this machine:
  // on a node, root is "/"); in local mode, as the caller asked.
  const kubelet = !o.bundle && host.root === "/" && (await host.exists(PATHS.kubeletKubeconfig));
  const kubeconfig = o.kubeconfig ?? (kubelet ? PATHS.kubeletKubeconfig : undefined);
  const result = await converge({
    ...o,
    bundle: await host.fs.realPath(ADOPTION.bundle),
    nodeName: p.report.nodeName,
    nodeGroup: p.report.nodeGroup,
    ...(kubeconfig ? { kubeconfig } : {}),
  });
  record.converge = { outcome: result.outcome, reason: result.reason };
  record.restarted = p.restarts.map((s) => s.unit);
  if (result.outcome === "applied" || result.outcome === "in-sync") {
    record.state = "adopted";
    record.adoptedAt = now();
  }
  await save();
  return record;
}

export interface RevertResult {
  record: AdoptionRecord;
  restored: string[];
  removed: string[];
}

/** Gives the node back to Deckhouse's bashible: this agent's service stopped, Deckhouse's files and timer back. */
export async function revert(host: Host, log: ConvergeOptions["log"]): Promise<RevertResult> {
  const record = await readRecord(host);
  if (!record) {
    throw new AdoptRefused(
      `${ADOPTION.record} does not exist: this node was not adopted by 'bashible adopt', so there is nothing to revert`,
    );
  }
  if (record.state === "reverted") {
    throw new AdoptRefused(
      `already reverted at ${record.revertedAt} (${ADOPTION.record}): Deckhouse's ${DECKHOUSE.timer} runs this node`,
    );
  }
  for (const unit of [UNITS.agent, UNITS.agentRestart]) {
    await host.systemctl("stop", unit);
    await host.systemctl("disable", unit).catch(() => undefined); // bashible-restart has no [Install]
  }
  log.info("stopped this agent's service");
  const restored: string[] = [];
  for (const s of record.saved) {
    const st = await host.stat(s.copy);
    if (!st)
      throw new AdoptRefused(
        `the copy ${s.copy} of ${s.path} is missing: restore ${s.path} by hand, then run 'bashible adopt --revert' again`,
      );
    if (st.isSymlink) {
      await host.remove(s.path);
      await host.symlink(s.path, (await host.fs.readLink(s.copy)) ?? "");
    } else {
      const content = await host.readFile(s.copy);
      await host.writeFile(s.path, content ?? "", { mode: st.mode, uid: st.uid, gid: st.gid });
    }
    restored.push(s.path);
  }
  const removed: string[] = [];
  for (const p of record.created) {
    if (await host.exists(p)) {
      await host.remove(p);
      removed.push(p);
    }
  }
  if (record.movedManifest) {
    await host.systemctl("stop", UNITS.apiProxy);
    await host.systemctl("disable", UNITS.apiProxy).catch(() => undefined);
    const m = record.movedManifest;
    const st = await host.stat(m.copy);
    const content = await host.readFile(m.copy);
    if (content !== undefined && st) {
      await host.writeFile(m.path, content, { mode: st.mode, uid: st.uid, gid: st.gid });
      restored.push(m.path);
    }
  }
  await host.systemctl("daemon-reload");
  await host.systemctl("enable", DECKHOUSE.timer);
  await host.systemctl("start", DECKHOUSE.timer);
  log.info({ unit: DECKHOUSE.timer }, "re-enabled Deckhouse's timer");
  record.state = "reverted";
  record.revertedAt = now();
  await writeRecord(host, record);
  return { record, restored, removed };
}
