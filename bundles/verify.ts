// Accepting a bundle: size, JSON, envelope, every step's spec and the context against their
// schemas (bundles/specs.ts), step names and order, checksum. Anything wrong is a
// BundleRejectedError naming what and where; the caller keeps the last good bundle.
import { bundleChecksum } from "./checksum.ts";
import { CHECKSUM, STEP_NAME } from "./rules.ts";
import { SpecError } from "./schema.ts";
import { BUNDLE_CONTEXT, type BundleStep, STEP_KINDS, STEP_SPECS, type StepKind } from "./specs.ts";
import { API_VERSION, type NodeGroupBundle } from "./types.ts";

export const MAX_BUNDLE_BYTES = 8 * 1024 * 1024;
/**
 * What the server renders at most: the node's limit less room for what serving wraps around a
 * bundle (metadata.resourceVersion, a watch event's envelope), so nothing served is refused.
 */
export const MAX_RENDERED_BUNDLE_BYTES = MAX_BUNDLE_BYTES - 4096;

export class BundleRejectedError extends Error {
  override name = "BundleRejectedError";
  readonly source: string;
  readonly why: string;
  constructor(source: string, why: string) {
    super(`bundle from ${source} rejected: ${why}`);
    this.source = source;
    this.why = why;
  }
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** Parses and verifies raw bundle bytes (the caller reads at most MAX_BUNDLE_BYTES + 1). */
export function acceptBundle(raw: Buffer | string, source: string): NodeGroupBundle {
  const size = typeof raw === "string" ? Buffer.byteLength(raw) : raw.length;
  if (size > MAX_BUNDLE_BYTES) {
    throw new BundleRejectedError(source, `larger than the ${MAX_BUNDLE_BYTES}-byte limit`);
  }
  let doc: unknown;
  try {
    doc = JSON.parse(raw.toString());
  } catch (err) {
    throw new BundleRejectedError(source, `not JSON (truncated?): ${(err as Error).message}`);
  }
  return verifyBundle(doc, source);
}

function verifyStep(s: unknown, i: number, reject: (why: string) => never): BundleStep {
  if (!isObject(s)) return reject(`step #${i} is not an object`);
  const name = typeof s.name === "string" ? s.name : "";
  if (!STEP_NAME.test(name)) reject(`step #${i} has an invalid name '${String(s.name)}' (want NNN_name)`);
  const kind = s.kind as StepKind;
  if (!STEP_KINDS.includes(kind)) reject(`step ${name} has unknown kind '${String(s.kind)}'`);
  for (const k of Object.keys(s))
    if (k !== "name" && k !== "kind" && k !== "spec") reject(`step ${name}: unknown field '${k}'`);
  try {
    const spec = STEP_SPECS[kind].parse(s.spec, "spec");
    return { name, kind, spec } as BundleStep;
  } catch (err) {
    if (err instanceof SpecError) return reject(`step ${name} (${kind}): ${err.message}`);
    throw err;
  }
}

export function verifyBundle(doc: unknown, source: string): NodeGroupBundle {
  const reject = (why: string): never => {
    throw new BundleRejectedError(source, why);
  };
  if (!isObject(doc)) return reject("not a JSON object");
  if (doc.apiVersion !== API_VERSION || doc.kind !== "NodeGroupBundle") {
    reject(`expected ${API_VERSION} NodeGroupBundle, got ${String(doc.apiVersion)} ${String(doc.kind)}`);
  }
  if (typeof doc.nodeGroup !== "string" || !doc.nodeGroup) reject("nodeGroup missing");
  if (!Array.isArray(doc.steps)) reject("steps missing");
  if (typeof doc.checksum !== "string" || !CHECKSUM.test(doc.checksum)) reject("checksum missing or malformed");
  let context: NodeGroupBundle["context"];
  try {
    context = BUNDLE_CONTEXT.parse(doc.context, "context");
  } catch (err) {
    if (err instanceof SpecError) return reject(err.message);
    throw err;
  }
  const steps: BundleStep[] = [];
  const seen = new Set<string>();
  let previous = "";
  for (const [i, raw] of (doc.steps as unknown[]).entries()) {
    const step = verifyStep(raw, i, reject);
    if (seen.has(step.name)) reject(`step name '${step.name}' appears twice`);
    if (step.name < previous) reject(`steps are not in name order ('${step.name}' after '${previous}')`);
    seen.add(step.name);
    previous = step.name;
    steps.push(step);
  }
  const bundle = { ...(doc as unknown as NodeGroupBundle), context, steps };
  const actual = bundleChecksum(doc as unknown as NodeGroupBundle);
  if (actual !== bundle.checksum) {
    reject(
      `checksum mismatch: content hashes to ${actual.slice(0, 12)}…, bundle says ${bundle.checksum.slice(0, 12)}…`,
    );
  }
  return bundle;
}
