// Where the resident agent learns its node group's settings (fencing, early OOM): the bundle it
// last applied (status.json names it; bundles/<checksum>.json holds it). Read from disk, so an
// agent that restarts after a crash re-arms at once, without waiting for the API.
import { watch, type FSWatcher } from "node:fs";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { PATHS } from "../../bundles/paths.ts";
import type { NodeGroupBundle } from "../../bundles/types.ts";
import type { FencingConfig } from "./fencing.ts";

type BundleContext = NodeGroupBundle["context"];
type NodeGroupContext = BundleContext["nodeGroup"];

/**
 * The last bundle read, by checksum: a bundle file is named by its checksum and never changes,
 * so the once-a-minute poll (and each job's) reads the small status file and parses the bundle,
 * which may be megabytes, only when a converge applied another one.
 */
let lastRead: { root: string; checksum: string; context: BundleContext | undefined } | undefined;

/** The last applied bundle's context, or undefined before any. */
export async function appliedContext(root: string): Promise<BundleContext | undefined> {
  const status = JSON.parse(await readFile(path.join(root, PATHS.status), "utf8").catch(() => "{}")) as {
    appliedChecksum?: string;
  };
  const checksum = status.appliedChecksum;
  if (!checksum || !/^[0-9a-f]{64}$/.test(checksum)) return undefined;
  if (lastRead?.root === root && lastRead.checksum === checksum) return lastRead.context;
  const raw = await readFile(path.join(root, PATHS.bundles, `${checksum}.json`), "utf8").catch(() => undefined);
  if (!raw) return undefined;
  const context = (JSON.parse(raw) as NodeGroupBundle).context;
  lastRead = { root, checksum, context };
  return context;
}

/** The node group part of the last applied bundle's context, or undefined before any. */
export async function appliedNodeGroup(root: string): Promise<NodeGroupContext | undefined> {
  return (await appliedContext(root))?.nodeGroup;
}

export function fencingConfigOf(ng: NodeGroupContext | undefined): FencingConfig | undefined {
  const mode = ng?.fencing?.mode;
  return ng && (mode === "Watchdog" || mode === "Notify") ? { mode, nodeGroup: ng.name } : undefined;
}

export async function appliedFencingConfig(root: string): Promise<FencingConfig | undefined> {
  return fencingConfigOf(await appliedNodeGroup(root));
}

/**
 * Calls `onChange` with the applied fencing setting now and whenever a converge applies a new
 * bundle (status.json is rewritten), plus every `pollMs` as a safety net.
 */
export function followAppliedFencingConfig(
  root: string,
  onChange: (cfg: FencingConfig | undefined) => void,
  onError: (err: Error) => void,
  pollMs = 60_000,
): Follower {
  return followApplied(root, appliedFencingConfig, onChange, onError, pollMs);
}

export interface Follower {
  close(): void;
  /** Read again now (the daemon calls it when a converge ended). */
  refresh(): void;
}

/** Like followAppliedFencingConfig, for any setting read from the applied bundle. */
export function followApplied<T>(
  root: string,
  read: (root: string) => Promise<T>,
  onChange: (value: T) => void,
  onError: (err: Error) => void,
  pollMs = 60_000,
): Follower {
  let last = "";
  let timer: NodeJS.Timeout | undefined;
  const check = () => {
    read(root).then((value) => {
      const key = JSON.stringify(value ?? null);
      if (key === last) return;
      last = key;
      onChange(value);
    }, onError);
  };
  let watcher: FSWatcher | undefined;
  const watchState = () => {
    if (watcher) return;
    try {
      watcher = watch(path.join(root, PATHS.stateDir), (_ev, name) => {
        if (name !== path.basename(PATHS.status)) return;
        clearTimeout(timer);
        timer = setTimeout(check, 200);
      });
      watcher.on("error", onError);
    } catch {
      // no state directory yet (nothing converged): the poll tries again
    }
  };
  watchState();
  const poll = setInterval(() => {
    watchState();
    check();
  }, pollMs);
  check();
  return {
    close() {
      watcher?.close();
      clearInterval(poll);
      clearTimeout(timer);
    },
    refresh() {
      watchState();
      check();
    },
  };
}
