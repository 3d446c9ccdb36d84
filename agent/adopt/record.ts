// The record `bashible adopt` keeps in /var/lib/bashible/adopted-from-deckhouse.json: what it
// stopped, which of Deckhouse's files it saved and where, what it created, and the commands that
// go back by hand. Written before the first change and after each phase, so an interrupted
// adoption can be resumed or reverted from what it says.
import { ADOPTION } from "../../bundles/deckhouse-node.ts";
import type { Host } from "../../host/host.ts";

export interface SavedFile {
  /** The node path Deckhouse's file was at. */
  path: string;
  /** Its copy, under ADOPTION.saved. */
  copy: string;
}

export interface AdoptionRecord {
  version: 1;
  state: "adopting" | "adopted" | "reverted";
  startedAt: string;
  adoptedAt?: string;
  revertedAt?: string;
  /** The agent that adopted the node. */
  agentVersion: string;
  nodeName: string;
  nodeGroup: string;
  /** Deckhouse's last applied checksum, and the bundle this agent converged to. */
  deckhouseChecksum: string;
  bundleChecksum: string;
  /** Units stopped and disabled (Deckhouse's timer). */
  stopped: string[];
  /** Deckhouse's files as they were, before this agent changed or removed them. */
  saved: SavedFile[];
  /** Files this agent created where Deckhouse had none (revert removes them). */
  created: string[];
  /** The API proxy's static pod manifest, moved out so the kubelet stops that pod. */
  movedManifest?: SavedFile;
  /** Services the converge restarted or reloaded. */
  restarted: string[];
  /** The converge's outcome, when it ran. */
  converge?: { outcome: string; reason?: string };
  /** Going back by hand, command by command (`bashible adopt --revert` does the same). */
  revertByHand: string[];
}

export class RecordError extends Error {
  override name = "RecordError";
}

export async function readRecord(host: Host): Promise<AdoptionRecord | undefined> {
  const text = await host.readText(ADOPTION.record);
  if (text === undefined) return undefined;
  try {
    const r = JSON.parse(text) as AdoptionRecord;
    if (r.version !== 1 || !["adopting", "adopted", "reverted"].includes(r.state))
      throw new Error("unknown version or state");
    return r;
  } catch (err) {
    // Not "absent": a record that cannot be read must stop adopt and revert, not be ignored.
    throw new RecordError(
      `${ADOPTION.record} cannot be read (${(err as Error).message}): fix or move it; the copies of Deckhouse's files are in ${ADOPTION.saved}`,
    );
  }
}

export async function writeRecord(host: Host, r: AdoptionRecord): Promise<void> {
  await host.writeFile(ADOPTION.record, `${JSON.stringify(r, null, 2)}\n`, { mode: 0o600 });
}
