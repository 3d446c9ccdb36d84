// What the agent remembers between runs, under /var/lib/bashible. Every write is atomic, so a
// kill at any point leaves the previous or the next state, never a torn one. State that does
// not parse or verify is never silently taken for "nothing": it is logged and, when the caller
// may write, moved aside to /var/lib/bashible/corrupt/<name>.corrupt-<time> for a person to
// read; the last good bundle is then taken from the newest stored bundle that verifies.
import type { Logger } from "../../lib/log/log.ts";
import { Host } from "../../host/host.ts";
import type { NodeGroupBundle } from "../../bundles/types.ts";
import { acceptBundle } from "../../bundles/verify.ts";
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
  /** Problems reported by the step (a NodeUser that clashes, say); not failures. */
  problems?: { subject: string; message: string }[];
}

export type RunOutcome = "applied" | "in-sync" | "failed" | "waiting-approval" | "waiting-disruption-approval";

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
    outcome: RunOutcome;
    reason: string;
    error?: string;
  };
  steps: StepStatus[];
  /** The last fetch problem (server down, wrong CA, rejected bundle), cleared by a good fetch. */
  fetchError?: { at: string; message: string };
  /** What the node waits for, while it waits (approval, disruption approval). */
  waiting?: { for: string; since: string };
}

/**
 * A host for the state files alone (the daemon, the helpers' callbacks): the OS profile only
 * matters to steps, which never run on it.
 */
export function stateHost(root: string): Host {
  return new Host(root, { id: "", versionId: "", family: "debian", packageManager: "apt" });
}

const EMPTY: Status = { failureCount: 0, steps: [] };

export interface StateOptions {
  log?: Logger;
  /** May move corrupt files aside (not in `plan`, which writes nothing). */
  mayWrite?: boolean;
}

/** Moves a corrupt state file aside, keeping it for a person to read. */
async function quarantine(host: Host, p: string, o: StateOptions, why: string): Promise<void> {
  o.log?.error({ file: p }, `${p} is corrupt (${why})${o.mayWrite ? "; moved to " + PATHS.corrupt : ""}`);
  if (!o.mayWrite) return;
  const content = (await host.readFile(p).catch(() => undefined)) ?? Buffer.alloc(0);
  const name = `${p.split("/").pop()}.corrupt-${new Date().toISOString().replace(/[:.]/g, "-")}`;
  await host.mkdir(PATHS.corrupt, { mode: 0o700 });
  await host.writeFile(`${PATHS.corrupt}/${name}`, content, { mode: 0o600 });
  await host.remove(p);
}

export async function readStatus(host: Host, o: StateOptions = {}): Promise<Status> {
  const text = await host.readText(PATHS.status);
  if (text === undefined) return { ...EMPTY };
  try {
    const doc = JSON.parse(text) as Status;
    if (typeof doc !== "object" || doc === null || Array.isArray(doc)) throw new Error("not an object");
    return { ...EMPTY, ...doc };
  } catch (err) {
    await quarantine(host, PATHS.status, o, (err as Error).message);
    return { ...EMPTY };
  }
}

/**
 * 0600: status quotes what the node's programs and bundles said (a failed command's last line
 * of output, a script's, a refused bundle's reason), which no redaction can prove free of
 * secrets; only root reads it (`bashible status`, the daemon), as only root reads the bundles.
 */
export async function writeStatus(host: Host, s: Status): Promise<void> {
  await host.writeFile(PATHS.status, `${JSON.stringify(s, null, 2)}\n`, { mode: 0o600 });
}

export async function updateStatus(host: Host, patch: (s: Status) => void, o: StateOptions = {}): Promise<Status> {
  const s = await readStatus(host, { ...o, mayWrite: true });
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
  for (const { f } of (await storedBundles(host)).slice(KEEP_BUNDLES)) await host.remove(`${PATHS.bundles}/${f}`);
}

async function storedBundles(host: Host): Promise<{ f: string; mtime: number }[]> {
  const entries = await Promise.all(
    (await host.listDir(PATHS.bundles))
      .filter((f) => f.endsWith(".json"))
      .map(async (f) => ({ f, mtime: (await host.stat(`${PATHS.bundles}/${f}`))?.mtimeMs ?? 0 })),
  );
  return entries.sort((a, b) => b.mtime - a.mtime);
}

async function readStoredBundle(host: Host, file: string, o: StateOptions): Promise<NodeGroupBundle | undefined> {
  const p = `${PATHS.bundles}/${file}`;
  const raw = await host.readFile(p);
  if (!raw) return undefined;
  try {
    return acceptBundle(raw, p);
  } catch (err) {
    await quarantine(host, p, o, (err as Error).message);
    return undefined;
  }
}

/**
 * The last good bundle: the one last applied, verified again on read; when that one is gone or
 * corrupt (or status.json is), the newest stored bundle that verifies.
 */
export async function lastGoodBundle(
  host: Host,
  status: Status,
  o: StateOptions = {},
): Promise<NodeGroupBundle | undefined> {
  if (status.appliedChecksum) {
    const b = await readStoredBundle(host, `${status.appliedChecksum}.json`, o);
    if (b) return b;
  }
  for (const { f } of await storedBundles(host)) {
    if (f === `${status.appliedChecksum}.json`) continue;
    const b = await readStoredBundle(host, f, o);
    if (b) {
      o.log?.warn({ checksum: b.checksum }, "using the newest stored bundle that verifies as the last good one");
      return b;
    }
  }
  return undefined;
}
