// The forced re-run: every group's bundle changes once per 4-hour window, but each group's
// window is shifted by a hash of (clusterUUID, group), so groups (and clusters) do not all
// re-run at the same moment. Same idea as Deckhouse's fnv64a-based updateEpoch.

export const EPOCH_SECONDS = 4 * 60 * 60;

const FNV64_OFFSET = 0xcbf29ce484222325n;
const FNV64_PRIME = 0x100000001b3n;
const MASK64 = (1n << 64n) - 1n;

export function fnv64a(text: string): bigint {
  let h = FNV64_OFFSET;
  for (const byte of Buffer.from(text, "utf8")) {
    h ^= BigInt(byte);
    h = (h * FNV64_PRIME) & MASK64;
  }
  return h;
}

function offsetSeconds(clusterUUID: string, group: string): number {
  return Number(fnv64a(`${clusterUUID}${group}`) % BigInt(EPOCH_SECONDS));
}

/** The epoch number (as a string, it goes into the bundle) for a group at `nowMs`. */
export function updateEpoch(clusterUUID: string, group: string, nowMs: number): string {
  return String(Math.floor((Math.floor(nowMs / 1000) + offsetSeconds(clusterUUID, group)) / EPOCH_SECONDS));
}

/** When this group's epoch next changes (ms since the epoch), so the server can re-render then. */
export function nextEpochChangeMs(clusterUUID: string, group: string, nowMs: number): number {
  const shifted = Math.floor(nowMs / 1000) + offsetSeconds(clusterUUID, group);
  const next = (Math.floor(shifted / EPOCH_SECONDS) + 1) * EPOCH_SECONDS;
  return (next - offsetSeconds(clusterUUID, group)) * 1000;
}
