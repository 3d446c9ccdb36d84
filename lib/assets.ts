// Data files the code reads at run time (mustache templates, CRDs, the example cluster). In a
// checkout they sit in the repository; in a build, scripts/build.ts copies them to
// dist/bashible.d/share/ under the same relative paths. `asset("cluster/render/templates")` finds
// either.
import { existsSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
// Source: <repo>/lib/assets.ts. Bundle: <dist>/bashible.d/app/<chunk>.mjs.
const ROOT = [path.resolve(here, ".."), path.resolve(here, "../share")].find((d) =>
  existsSync(path.join(d, "cluster")),
);

/** Absolute path of a data file or directory, given its path relative to the repository. */
export function asset(rel: string): string {
  if (process.env.BASHIBLE_ASSETS) return path.join(process.env.BASHIBLE_ASSETS, rel);
  if (!ROOT) throw new Error(`bashible: data files not found next to ${here} (looked for cluster/ and share/cluster/)`);
  return path.join(ROOT, rel);
}

/** What the build ships as data, relative to the repository. */
export const SHIPPED_ASSETS = [
  "cluster/render/templates",
  "cluster/crds",
  "examples/cluster",
  "steps/bashbooster",
  "systemd",
  "steps/checks",
];
