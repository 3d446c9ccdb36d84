// "Not older than": a client that read resourceVersion X from one replica and asks another
// (its watch moved, or its GET landed elsewhere) must not get anything older than X. Served
// resourceVersions carry the checksums Secret's revision (checksum-gate.ts), so a replica can
// tell whether it has seen that revision, and for a group whether it serves what that revision
// names. If not, the request waits briefly for this replica to catch up.
import type { ChecksumGate } from "./checksum-gate.ts";
import type { RenderLoop } from "./render-loop.ts";
import { REVISION_SHIFT, type BundleStore } from "./store.ts";

export type FreshnessCheck = (rv: number, group: string | undefined, mode: "get" | "watch") => Promise<boolean>;

export function freshness(store: BundleStore, gate: ChecksumGate, loop: RenderLoop, waitMs = 3000): FreshnessCheck {
  const covers = (rv: number, group: string | undefined, mode: "get" | "watch") => {
    if (gate.revision < Math.floor(rv / REVISION_SHIFT)) return false;
    // A watch only sends what is newer than rv anyway; a GET answers with what is here now.
    return mode === "watch" || !group || loop.caughtUp(group);
  };
  return (rv, group, mode) => {
    if (covers(rv, group, mode)) return Promise.resolve(true);
    return new Promise((resolve) => {
      const check = () => {
        if (!covers(rv, group, mode)) return;
        done(true);
      };
      const offGate = gate.onChange(check);
      const offStore = store.subscribe("nodegroupbundles", check);
      const timer = setTimeout(() => done(false), waitMs);
      function done(ok: boolean) {
        clearTimeout(timer);
        offGate();
        offStore();
        resolve(ok);
      }
    });
  };
}
