// Mustache templates from bundles/templates, read once. Rendering never HTML-escapes (these
// are shell scripts), and a template error becomes a RenderError naming the template.
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import Mustache from "mustache";
import { RenderError } from "./errors.ts";

// From the source tree by default; a bundled build (dist/) sets BASHIBLE_TEMPLATES_DIR to where
// the image ships bundles/templates.
const DIR =
  process.env.BASHIBLE_TEMPLATES_DIR ??
  path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../bundles/templates");
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
