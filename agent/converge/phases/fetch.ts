// The fetch: the bundle asked for, or the last good one when the fetch failed or was refused.
// A converge records the outcome (status.json's fetchError, a BashibleBundleRejected Event);
// `bashible plan` only shows it.
import type { Logger } from "../../../lib/log/log.ts";
import type { Host } from "../../../host/host.ts";
import type { NodeGroupBundle } from "../../../bundles/types.ts";
import { acceptBundle, BundleRejectedError } from "../../../bundles/verify.ts";
import { EVENTS } from "../../../bundles/names.ts";
import type { BundleSource } from "../source.ts";
import type { NodeReporter } from "../node-report.ts";
import { updateStatus } from "../state.ts";

export interface Fetch {
  /** The bundle to work with: the one fetched, or the last good one. */
  bundle?: NodeGroupBundle;
  error?: string;
  /** The bundle fetched was refused (it did not verify), not merely unreachable. */
  rejected: boolean;
}

export async function fetchBundle(source: BundleSource, lastGood: NodeGroupBundle | undefined): Promise<Fetch> {
  try {
    const got = await source.fetch();
    if ("notModified" in got) return { bundle: lastGood, rejected: false };
    return { bundle: acceptBundle(got.raw, source.description), rejected: false };
  } catch (err) {
    const rejected = err instanceof BundleRejectedError;
    return {
      bundle: lastGood,
      error: rejected ? withoutValues((err as Error).message) : (err as Error).message,
      rejected,
    };
  }
}

/**
 * A refused bundle's reason names the field and quotes its value (`the string "…"`,
 * bundles/schema.ts). Nothing of a refused bundle is known to be safe to show: the value may be
 * a password hash or a key line with an injected newline, and the secrets that redact a good
 * bundle's output come from parsing it. The field's path says where to look.
 */
export function withoutValues(message: string): string {
  return message.replace(/the string "(?:[^"\\]|\\.)*"/g, "a string (its value not shown)");
}

/** Keeps the last fetch problem in status.json (a good fetch clears it); a refusal becomes an Event. */
export async function recordFetch(
  f: Fetch,
  at: string,
  r: { host: Host; reporter: NodeReporter; log: Logger },
): Promise<void> {
  const { host, reporter, log } = r;
  if (!f.error) {
    await updateStatus(
      host,
      (st) => {
        delete st.fetchError;
      },
      { log },
    );
    return;
  }
  log.error(`bundle fetch failed: ${f.error}`);
  const fetchError = { at, message: f.error };
  await updateStatus(
    host,
    (st) => {
      st.fetchError = fetchError;
    },
    { log },
  );
  if (f.rejected) await reporter.event(EVENTS.bundleRejected, f.error, "Warning");
}
