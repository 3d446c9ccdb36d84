// Mustache templates from cluster/render/templates, read once. Rendering never HTML-escapes (these
// are shell scripts), and a template error becomes a RenderError naming the template.
import { readFileSync } from "node:fs";
import path from "node:path";
import { asset } from "../../lib/assets.ts";
import Mustache from "mustache";
import { RenderError } from "./errors.ts";

// From the source tree, or the copy a build ships (lib/assets.ts); BASHIBLE_TEMPLATES_DIR
// overrides both.
const DIR = process.env.BASHIBLE_TEMPLATES_DIR ?? asset("cluster/render/templates");
const cache = new Map<string, string>();

export function template(name: string): string {
  let text = cache.get(name);
  if (text === undefined) {
    text = readFileSync(path.join(DIR, `${name}.mustache`), "utf8");
    cache.set(name, text);
  }
  return text;
}

const noEscape = (s: unknown) => String(s);

/** Renders mustache text; `object` names what the text came from in the error. */
export function renderText(object: string, text: string, view: object): string {
  try {
    return Mustache.render(text, view, {}, { escape: noEscape });
  } catch (err) {
    throw new RenderError(object, `template does not render: ${(err as Error).message}`);
  }
}

export function renderTemplate(name: string, view: object): string {
  return renderText(`template ${name}`, template(name), view);
}
