// Canonical serialisation and checksum of a bundle. Both sides use this one function, so the
// server's checksum and the agent's verification cannot drift apart.
import { createHash } from "node:crypto";
import type { NodeGroupBundle } from "./types.ts";

/** JSON with object keys sorted at every depth and no whitespace. */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== "object") {
    if (value === undefined) return "null";
    if (typeof value === "number" && !Number.isFinite(value)) throw new TypeError("canonicalJson: non-finite number");
    return JSON.stringify(value);
  }
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  const obj = value as Record<string, unknown>;
  const keys = Object.keys(obj)
    .filter((k) => obj[k] !== undefined)
    .sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(obj[k])}`).join(",")}}`;
}

export function sha256Hex(data: string | Buffer): string {
  return createHash("sha256").update(data).digest("hex");
}

/** The bundle checksum: sha256 over {nodeGroup, context, steps}; metadata is transport, not content. */
export function bundleChecksum(b: Pick<NodeGroupBundle, "nodeGroup" | "context" | "steps">): string {
  return sha256Hex(canonicalJson({ nodeGroup: b.nodeGroup, context: b.context, steps: b.steps }));
}
