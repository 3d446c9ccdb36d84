// What the agent remembers between runs, under /var/lib/bashible. Every write is atomic, so a
// kill at any point leaves the previous or the next state, never a torn one.
import type { Host } from "../host/host.ts";
import type { NodeGroupBundle } from "../../bundles/types.ts";
import { acceptBundle } from "./bundle.ts";
import { KEEP_BUNDLES, PATHS } from "../../bundles/paths.ts";

export type StepOutcome = "changed" | "unchanged" | "failed" | "not-run";

export interface StepStatus {
  name: string;
  kind: string;
  outcome: StepOutcome;
  changes: number;
  attempts: number;
  durationMs: number;
  error?: string;
  warnings?: string[];
}

export interface Status {
  /** Checksum and boot id of the last successful run. */
  appliedChecksum?: string;
  appliedBootId?: string;
  appliedAt?: string;
  /** Checksum of the last failed run, and how many runs of it failed in a row. */
  failedChecksum?: string;
  failureCount: number;
  lastRun?: {
    startedAt: string;
    finishedAt: string;
    checksum: string;
    outcome: "applied" | "in-sync" | "failed" | "waiting-approval";
    reason: string;
    error?: string;
  };
  steps: StepStatus[];
  /** The last fetch problem (server down, wrong CA, rejected bundle), cleared by a good fetch. */
  fetchError?: { at: string; message: string };
}

const EMPTY: Status = { failureCount: 0, steps: [] };

export async function readStatus(host: Host): Promise<Status> {
  const text = await host.readText(PATHS.status);
  if (!text) return { ...EMPTY };
  try {
    return { ...EMPTY, ...(JSON.parse(text) as Status) };
  } catch {
    return { ...EMPTY };
  }
}

export async function writeStatus(host: Host, s: Status): Promise<void> {
  await host.writeFile(PATHS.status, `${JSON.stringify(s, null, 2)}\n`, { mode: 0o644 });
}

export async function updateStatus(host: Host, patch: (s: Status) => void): Promise<Status> {
  const s = await readStatus(host);
  patch(s);
  await writeStatus(host, s);
  return s;
}

/** The Deckhouse-compatible checksum file; absent means "run everything". */
export async function readAppliedChecksum(host: Host): Promise<string | undefined> {
  return (await host.readText(PATHS.configurationChecksum))?.trim() || undefined;
}

export async function writeAppliedChecksum(host: Host, checksum: string): Promise<void> {
  await host.writeFile(PATHS.configurationChecksum, `${checksum}\n`, { mode: 0o644 });
}

/** Keeps an applied bundle (0600: it holds tokens) and prunes all but the newest KEEP_BUNDLES. */
export async function rememberBundle(host: Host, b: NodeGroupBundle): Promise<void> {
  await host.mkdir(PATHS.bundles, { mode: 0o700 });
  await host.writeFile(`${PATHS.bundles}/${b.checksum}.json`, JSON.stringify(b), { mode: 0o600 });
  const entries = await Promise.all(
    (await host.listDir(PATHS.bundles))
      .filter((f) => f.endsWith(".json"))
      .map(async (f) => ({ f, mtime: (await host.stat(`${PATHS.bundles}/${f}`))?.mtimeMs ?? 0 })),
  );
  entries.sort((a, b) => b.mtime - a.mtime);
  for (const { f } of entries.slice(KEEP_BUNDLES)) await host.remove(`${PATHS.bundles}/${f}`);
}

/** The last good bundle: the one last applied, verified again on read. */
export async function lastGoodBundle(host: Host): Promise<NodeGroupBundle | undefined> {
  const s = await readStatus(host);
  if (!s.appliedChecksum) return undefined;
  const raw = await host.readFile(`${PATHS.bundles}/${s.appliedChecksum}.json`);
  if (!raw) return undefined;
  try {
    return acceptBundle(raw, `${PATHS.bundles}/${s.appliedChecksum}.json`);
  } catch {
    return undefined;
  }
}
