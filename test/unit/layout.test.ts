// The layout's rules, checked on every import in the tree (docs/architecture.md, "Layout"):
// arrows run one way, so the server never loads step code and the contract depends on nothing.
import t from "tap";
import { readdir, readFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const ENTRY = "agent/main.ts";

/** Where each top-level folder may import from (besides itself). */
const ALLOWED: Record<string, string[]> = {
  bundles: [],
  lib: [],
  steps: ["bundles", "lib", "agent/host"],
  agent: ["steps", "bundles", "lib"],
  cluster: ["bundles", "lib"],
};

async function sources(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const e of await readdir(path.join(REPO, dir), { withFileTypes: true })) {
    const rel = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...(await sources(rel)));
    else if (e.name.endsWith(".ts")) out.push(rel);
  }
  return out;
}

const IMPORT = /(?:from\s+|import\s*\(\s*|import\s+)"(\.{1,2}\/[^"]+)"/g;

/** Imports in `text` (the file at `file`) that go against the rules. */
export function violationsIn(file: string, text: string): string[] {
  const top = file.split("/")[0] as string;
  const bad: string[] = [];
  for (const m of text.matchAll(IMPORT)) {
    const target = path.normalize(path.join(path.dirname(file), m[1] as string));
    if (target === "package.json" || target.startsWith(`${top}/`)) continue;
    if (file === ENTRY && target.startsWith("cluster/")) continue; // the one entry knows both sides
    if (!(ALLOWED[top] ?? []).some((a) => target === a || target.startsWith(`${a}/`)))
      bad.push(`${file} imports ${target}`);
  }
  return bad;
}

async function violations(): Promise<string[]> {
  const bad: string[] = [];
  for (const top of Object.keys(ALLOWED)) {
    for (const file of await sources(top))
      bad.push(...violationsIn(file, await readFile(path.join(REPO, file), "utf8")));
  }
  return bad;
}

t.test("every import follows the layout's arrows", async (t) => {
  t.same(await violations(), []);
});

t.test("arrows against the rules are found", async (t) => {
  t.same(violationsIn("steps/x.ts", 'import { a } from "../agent/converge/engine.ts";'), [
    "steps/x.ts imports agent/converge/engine.ts",
  ]);
  t.same(violationsIn("cluster/x.ts", 'const m = await import("../steps/node-users.ts");'), [
    "cluster/x.ts imports steps/node-users.ts",
  ]);
  t.same(violationsIn("agent/x.ts", 'import "../test/lib/pki.ts";'), ["agent/x.ts imports test/lib/pki.ts"]);
  t.same(violationsIn("bundles/x.ts", 'import type { L } from "../lib/log/log.ts";'), [
    "bundles/x.ts imports lib/log/log.ts",
  ]);
  t.same(
    violationsIn("steps/x.ts", 'import { Host } from "../agent/host/host.ts";'),
    [],
    "steps may use the host layer",
  );
  t.same(violationsIn("agent/main.ts", 'import("../cluster/command.ts")'), [], "the entry knows both sides");
});
