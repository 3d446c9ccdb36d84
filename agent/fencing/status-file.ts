// The status file (/run/bashible/fencing.json) and the metrics beside it (fencing.prom): what
// `bashible fencing status` shows a person on the node, and what a restarted agent continues
// from. Written atomically (temporary file, then rename) when what it says changes, and on a
// heartbeat (Fencing.writeStatus). /run is cleared by a reboot; the boot id in the file guards
// against a file that outlived one all the same.
import { mkdirSync, renameSync, writeFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { PATHS } from "../../bundles/paths.ts";
import type { AgentTimings } from "../../bundles/fencing.ts";
import type { Verdict } from "./decide.ts";
import type { KubeletFacts } from "./decision.ts";
import type { FencingConfig } from "./fencing.ts";
import type { ApiCheck } from "./health.ts";
import type { Peer, PeerAnswer } from "./peers.ts";
import type { WatchdogInfo } from "./watchdog.ts";

export interface FencingStatus {
  pid: number;
  node: string;
  mode?: FencingConfig["mode"];
  nodeGroup?: string;
  device: string;
  armed: boolean;
  /** Pets go out (healthy, fresh verdict, armed). */
  petting: boolean;
  /** Pets were stopped by bad verdicts: the node is being fenced. */
  fencing: boolean;
  lastPetAt?: string;
  pets: number;
  timings: AgentTimings;
  detectionWindowMs: number;
  watchdog?: WatchdogInfo;
  maintenance?: string;
  labelled: boolean;
  lastCheck?: ApiCheck;
  peersKnown: number;
  /** The peers from the last Node list seen, kept for a restart while the API is out of reach. */
  peers: Peer[];
  /** Fencing nodes of the group that are not asked (yet), and why. */
  peersWaiting?: { name: string; why: string }[];
  lastPeers?: PeerAnswer[];
  verdict?: Verdict & { at: string };
  badRounds: number;
  /** The kubelet renewed its Lease since this boot (the kubelet rule applies from then on). */
  kubeletSeenAlive?: boolean;
  /** Since when the API has answered every check (continued across a quick restart). */
  apiReachableSince?: string;
  /** The newest kubelet Lease renewal seen. */
  kubeletRenewSeenAt?: string;
  /** The boot these kubelet facts belong to (kernel boot id). */
  bootId?: string;
  /** Why the device is not armed although the mode asks for it. */
  problem?: string;
  updatedAt: string;
}

export const iso = (ms: number | undefined) => (ms === undefined ? undefined : new Date(ms).toISOString());

/**
 * Written atomically: a temporary file renamed over the old one. Synchronously: two files of a
 * few kB in /run (tmpfs) take tens of microseconds, where eight thread-pool round trips cost
 * the idle agent more than the writes themselves.
 */
function replace(file: string, text: string): void {
  const tmp = `${file}.${process.pid}.tmp`;
  writeFileSync(tmp, text, { mode: 0o644 });
  renameSync(tmp, file);
}

export async function writeStatusFiles(root: string, status: FencingStatus, metricsText: string): Promise<void> {
  const file = path.join(root, PATHS.fencingStatus);
  const text = `${JSON.stringify(status)}\n`;
  try {
    replace(file, text);
  } catch (err) {
    // The directory is made on the first write (or again after someone removed it), not before
    // every write: /run/bashible is there all the time after that.
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
    mkdirSync(path.dirname(file), { recursive: true });
    replace(file, text);
  }
  replace(path.join(root, PATHS.fencingMetrics), metricsText);
}

/**
 * The previous agent's status file. Absent is the normal first start; a file that cannot be
 * read or parsed is reported (`problem`) and the agent starts afresh, as without one.
 */
export async function readSavedStatus(root: string): Promise<{ status?: FencingStatus; problem?: string }> {
  const file = path.join(root, PATHS.fencingStatus);
  let text: string;
  try {
    text = await readFile(file, "utf8");
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    return code === "ENOENT" ? {} : { problem: `cannot read ${file} (${code ?? (err as Error).message})` };
  }
  try {
    return { status: JSON.parse(text) as FencingStatus };
  } catch (err) {
    return { problem: `${file} is not JSON (${(err as Error).message})` };
  }
}

/** What a new agent takes over from its predecessor's status. */
export interface Continuation {
  /** Present when the status is recent enough to say something about now. */
  previous?: { fencing: boolean; badRounds: number };
  /** The predecessor's peers (the same group only), whatever its age. */
  peers: Peer[];
  /** What it knew about the kubelet, when from this boot and younger than the watchdog timeout. */
  kubelet?: KubeletFacts;
}

/**
 * Pure: what carries over from `saved`. The kubelet facts carry over within the same boot when
 * the predecessor was away for less than the watchdog timeout (one away longer either disarmed
 * on the way out or the node rebooted): a crash must not restart the kubelet count.
 */
export function continuationOf(
  saved: FencingStatus | undefined,
  o: { node: string; group: string; bootId: string; now: number; watchdogMs: number; recentMs: number },
): Continuation {
  if (!saved || saved.node !== o.node) return { peers: [] };
  const age = o.now - Date.parse(saved.updatedAt);
  const ms = (s: string | undefined) => (s ? Date.parse(s) : Number.NaN);
  const kubelet: KubeletFacts | undefined =
    saved.bootId === o.bootId && o.bootId !== "" && age <= o.watchdogMs
      ? {
          seenAlive: saved.kubeletSeenAlive === true,
          ...(Number.isFinite(ms(saved.apiReachableSince)) ? { apiReachableSince: ms(saved.apiReachableSince) } : {}),
          ...(Number.isFinite(ms(saved.kubeletRenewSeenAt)) ? { renewSeenAt: ms(saved.kubeletRenewSeenAt) } : {}),
        }
      : undefined;
  if (saved.nodeGroup !== o.group) return { peers: [], ...(kubelet ? { kubelet } : {}) };
  const peers = Array.isArray(saved.peers) ? saved.peers : [];
  // A status older than one detection window says nothing about now.
  const recent = age <= o.recentMs;
  return {
    peers,
    ...(recent ? { previous: { fencing: saved.fencing === true, badRounds: saved.badRounds } } : {}),
    ...(kubelet ? { kubelet } : {}),
  };
}
