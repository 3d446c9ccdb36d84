// NodeGroupConfiguration content rendered as Deckhouse renders it: by Go's own text/template +
// sprig with Deckhouse's function set (cluster/render/template-engine.ts runs them compiled to
// WebAssembly). The output is Deckhouse's byte for byte; where Deckhouse's output would itself
// be a bug ("<no value>", "%!d(float64=110)", a kept-out secret, include's "NotImplemented", a
// value that changes on every render), the render fails naming the line instead
// (template-engine/guard.go; the list is in docs/deckhouse-compatibility.md).
import { createHash } from "node:crypto";
import { EngineError, EngineMissingError, renderInEngine } from "./template-engine.ts";

export class TemplateError extends Error {
  override name = "TemplateError";
  readonly line: number;
  /** The action Go names (e.g. `.nodeGroup.x`), or "" when it names none. */
  readonly construct: string;
  readonly reason: string;
  constructor(line: number, construct: string, reason: string) {
    const action = construct.startsWith("{{") ? construct : `{{ ${construct} }}`;
    super(`${line ? `line ${line}: ` : ""}${construct ? `${action}: ` : ""}${reason}`);
    this.line = line;
    this.construct = construct;
    this.reason = reason;
  }
}

export interface RenderOptions {
  /** The template's name, as Deckhouse names it (the step name, `NNN_<name>`). */
  name?: string;
  /** Bytes the output may have; a longer one fails. */
  maxOutput?: number;
}

// Each context object is encoded (and hashed) once for all the scripts that read it.
interface Encoded {
  json: string;
  key: string;
}
const encoded = new WeakMap<object, Encoded>();
const encode = (data: unknown): Encoded => {
  const obj = typeof data === "object" && data !== null ? data : undefined;
  let e = obj && encoded.get(obj);
  if (!e) {
    const json = JSON.stringify(data ?? {});
    e = { json, key: createHash("sha256").update(json).digest("hex") };
    if (obj) encoded.set(obj, e);
  }
  return e;
};

// Rendering is pure (whatever could differ between renders is refused), so an unchanged script
// in an unchanged context is not rendered again: a render pass re-renders only what changed.
type Rendered = { out: string } | { error: TemplateError };
const cache = new Map<string, Rendered>();
const CACHE_MAX = 4096;

/**
 * Renders `text` against `data` (plain JSON: numbers become Go's float64, as in Deckhouse's
 * context). A value `{ $keptOut: "why" }` in the data is true in `if` and refused everywhere
 * else with `why`. Throws TemplateError; EngineMissingError when the engine is not built.
 * Treat `data` as frozen once rendered with: its encoding is remembered.
 */
export function renderGoTemplate(text: string, data: unknown, o: RenderOptions = {}): string {
  // No action, nothing to render: Go's output is the text itself.
  if (!text.includes("{{")) {
    if (o.maxOutput && Buffer.byteLength(text) > o.maxOutput) {
      throw new TemplateError(0, "", "the rendered script is longer than the limit for one step");
    }
    return text;
  }
  const name = o.name ?? "ngc";
  const ctx = encode(data);
  const key = createHash("sha256")
    .update(`${name}\0${o.maxOutput ?? 0}\0${ctx.key}\0${text}`)
    .digest("hex");
  let r = cache.get(key);
  if (r) {
    cache.delete(key);
  } else {
    const res = renderInEngine({ name, template: text, dataJson: ctx.json, dataKey: ctx.key, maxOutput: o.maxOutput });
    const reason = res.reason ?? res.err ?? "the template engine gave no result";
    r = res.out !== undefined ? { out: res.out } : { error: new TemplateError(res.line ?? 0, res.at ?? "", reason) };
  }
  cache.set(key, r);
  if (cache.size > CACHE_MAX) cache.delete(cache.keys().next().value as string);
  if ("out" in r) return r.out;
  throw r.error;
}

export { EngineError, EngineMissingError };
