// Accepting a bundle: size limit, JSON, shape, known step kinds, checksum. Anything wrong is a
// BundleRejectedError naming what and where; the caller keeps the last good bundle.
import { bundleChecksum } from "../../bundles/checksum.ts";
import { STEPS } from "../../steps/index.ts";
import { API_VERSION, type BundleStep, type NodeGroupBundle, type StepKind } from "../../bundles/types.ts";

export const MAX_BUNDLE_BYTES = 8 * 1024 * 1024;
/** Kinds this agent can apply: the step catalogue's. */
export const STEP_KINDS = Object.keys(STEPS) as StepKind[];
const STEP_NAME = /^\d{3}_[a-z0-9][a-z0-9_.-]*$/;

export class BundleRejectedError extends Error {
  override name = "BundleRejectedError";
  readonly source: string;
  constructor(source: string, why: string) {
    super(`bundle from ${source} rejected: ${why}; keeping the last good bundle`);
    this.source = source;
  }
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** Parses and verifies raw bundle bytes. */
export function acceptBundle(raw: Buffer | string, source: string): NodeGroupBundle {
  const size = typeof raw === "string" ? Buffer.byteLength(raw) : raw.length;
  if (size > MAX_BUNDLE_BYTES)
    throw new BundleRejectedError(source, `${size} bytes is over the ${MAX_BUNDLE_BYTES}-byte limit`);
  let doc: unknown;
  try {
    doc = JSON.parse(raw.toString());
  } catch (err) {
    throw new BundleRejectedError(source, `not JSON (truncated?): ${(err as Error).message}`);
  }
  return verifyBundle(doc, source);
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
  if (!isObject(doc.context)) reject("context missing");
  if (!Array.isArray(doc.steps)) reject("steps missing");
  if (typeof doc.checksum !== "string" || !/^[0-9a-f]{64}$/.test(doc.checksum)) reject("checksum missing or malformed");
  const steps = doc.steps as unknown[];
  const seen = new Set<string>();
  let previous = "";
  for (const [i, s] of steps.entries()) {
    if (!isObject(s)) return reject(`step #${i} is not an object`);
    const name = String(s.name);
    if (!STEP_NAME.test(name)) reject(`step #${i} has an invalid name '${name}' (want NNN_name)`);
    if (seen.has(name)) reject(`step name '${name}' appears twice`);
    if (name < previous) reject(`steps are not in name order ('${name}' after '${previous}')`);
    if (!STEP_KINDS.includes(s.kind as StepKind)) reject(`step ${name} has unknown kind '${String(s.kind)}'`);
    if (!isObject(s.spec)) reject(`step ${name} has no spec`);
    seen.add(name);
    previous = name;
  }
  const bundle = doc as unknown as NodeGroupBundle;
  const actual = bundleChecksum(bundle);
  if (actual !== bundle.checksum) {
    reject(
      `checksum mismatch: content hashes to ${actual.slice(0, 12)}…, bundle says ${bundle.checksum.slice(0, 12)}…`,
    );
  }
  return bundle;
}

/** Secret values inside a bundle, so logs, plans and Events can redact them. */
export function bundleSecrets(b: NodeGroupBundle): string[] {
  const out: (string | undefined)[] = [b.context.packagesProxy?.token];
  for (const s of b.steps as BundleStep[]) {
    if (s.kind === "NodeUsers") for (const u of s.spec.users) out.push(u.passwordHash);
  }
  return out.filter((v): v is string => typeof v === "string" && v.length >= 6);
}

export function redact(text: string, secrets: string[]): string {
  let out = text;
  for (const s of secrets) out = out.split(s).join("[redacted]");
  return out;
}
