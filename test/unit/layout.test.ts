// The layout's rules, checked on every import in the tree (docs/architecture.md, "Layout"):
// arrows run one way, so the server never loads step code, the host layer never knows the
// runtime above it, and the contract depends on nothing. The second half proves each rule fires.
import t from "tap";
import { readdir, readFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const ENTRY = "agent/main.ts";

/** Where each top-level folder may import from (besides itself). Anything else is unknown. */
const ALLOWED: Record<string, string[]> = {
  bundles: [],
  lib: [],
  host: ["bundles", "lib"],
  steps: ["host", "bundles", "lib"],
  agent: ["steps", "host", "bundles", "lib"],
  cluster: ["bundles", "lib"],
  scripts: ["agent", "cluster", "steps", "host", "bundles", "lib"],
  test: ["agent", "cluster", "steps", "host", "bundles", "lib", "scripts", "examples"],
};

/** Folders that hold no TypeScript of ours (checked so that a new top-level folder is a decision). */
const NO_CODE = new Set(["docs", "examples", "systemd", "node_modules", "dist", "dist-packages", ".ci", ".git"]);

/** Arrows inside a top-level folder: files under `from` never import anything under `not`. */
const INNER: { from: string; not: string[]; why: string }[] = [
  {
    from: "agent/",
    not: ["agent/commands/"],
    why: "commands sit on top of the runtime",
  },
  {
    from: "agent/fencing/",
    not: ["agent/converge/", "agent/early-oom/", "agent/daemon/"],
    why: "jobs are independent",
  },
  {
    from: "agent/early-oom/",
    not: ["agent/converge/", "agent/fencing/", "agent/daemon/"],
    why: "jobs are independent",
  },
  {
    from: "agent/converge/",
    not: ["agent/fencing/", "agent/early-oom/", "agent/daemon/"],
    why: "jobs are independent",
  },
  {
    from: "cluster/render/",
    not: ["cluster/server/", "cluster/controllers/", "cluster/sources/"],
    why: "rendering is pure",
  },
  {
    from: "cluster/controllers/",
    not: ["cluster/server/", "cluster/sources/", "cluster/render/"],
    why: "the controllers run without the bundle server",
  },
  {
    from: "cluster/sources/",
    not: ["cluster/server/", "cluster/controllers/"],
    why: "the bundle server wires its sources; they do not know it",
  },
];

async function sources(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const e of await readdir(path.join(REPO, dir), { withFileTypes: true })) {
    const rel = path.join(dir, e.name);
    if (e.isDirectory()) {
      if (e.name === "node_modules" || (dir === "test" && e.name === "fixtures")) continue;
      out.push(...(await sources(rel)));
    } else if (e.name.endsWith(".ts")) out.push(rel);
  }
  return out;
}

/** Static and literal dynamic imports, either quote style. */
const IMPORT = /(?:\bfrom\s+|\bimport\s*\(\s*|\bimport\s+)(["'])(\.{1,2}\/[^"'\n]+)\1/g;
/** A dynamic import whose specifier is not one plain string literal (a variable, a template, a sum). */
const COMPUTED = /\bimport\s*\(\s*(?!["'][^"'\n]*["']\s*[,)])/g;

/** Imports in `text` (the file at `file`) that go against the rules. */
export function violationsIn(file: string, text: string): string[] {
  const top = file.split("/")[0] as string;
  const bad: string[] = [];
  const allowed = ALLOWED[top];
  if (!allowed) return [`${file} is in an unknown top-level folder ${top}/ (add it to the layout)`];
  // Tests may compute what they load (this file quotes bad imports); nothing they ship does.
  for (const m of top === "test" ? [] : text.matchAll(COMPUTED)) {
    const line = text.slice(0, m.index).split("\n").length;
    bad.push(`${file}:${line} has a computed import (name the module literally)`);
  }
  for (const m of text.matchAll(IMPORT)) {
    const target = path.normalize(path.join(path.dirname(file), m[2] as string));
    if (target === "package.json") continue;
    for (const rule of INNER) {
      if (file === ENTRY || !file.startsWith(rule.from)) continue;
      if (rule.not.some((n) => target.startsWith(n) && !file.startsWith(n)))
        bad.push(`${file} imports ${target} (${rule.why})`);
    }
    if (target.startsWith(`${top}/`)) continue;
    if (file === ENTRY && target.startsWith("cluster/")) continue; // the one entry knows both sides
    if (!allowed.some((a) => target === a || target.startsWith(`${a}/`))) bad.push(`${file} imports ${target}`);
  }
  return bad;
}

async function violations(): Promise<string[]> {
  const bad: string[] = [];
  for (const e of await readdir(REPO, { withFileTypes: true })) {
    if (!e.isDirectory() || NO_CODE.has(e.name) || e.name.startsWith(".")) continue;
    for (const file of await sources(e.name))
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
  t.same(violationsIn("steps/x.ts", 'import { Host } from "../host/host.ts";'), [], "steps may use the host layer");
  t.same(violationsIn("agent/main.ts", 'import("../cluster/server/command.ts")'), [], "the entry knows both sides");
});

t.test("the host layer never imports the runtime above it", async (t) => {
  t.same(violationsIn("host/x.ts", 'import { run } from "../agent/converge/engine.ts";'), [
    "host/x.ts imports agent/converge/engine.ts",
  ]);
  t.same(violationsIn("host/x.ts", 'import type { Flags } from "../steps/types.ts";'), [
    "host/x.ts imports steps/types.ts",
  ]);
  t.same(violationsIn("host/x.ts", 'import { PATHS } from "../bundles/paths.ts";'), []);
});

t.test("single quotes, computed imports and unknown folders are caught", async (t) => {
  t.same(violationsIn("steps/x.ts", "import { a } from '../agent/daemon/daemon.ts';"), [
    "steps/x.ts imports agent/daemon/daemon.ts",
  ]);
  // biome-ignore lint/suspicious/noTemplateCurlyInString: the bad import, quoted
  t.same(violationsIn("cluster/x.ts", "const m = await import(`../steps/${name}.ts`);"), [
    "cluster/x.ts:1 has a computed import (name the module literally)",
  ]);
  t.same(violationsIn("cluster/x.ts", 'const m = await import(dir + "/x.ts");'), [
    "cluster/x.ts:1 has a computed import (name the module literally)",
  ]);
  t.same(violationsIn("cluster/x.ts", 'const m = await import("./y.ts", { with: {} });'), [], "a literal is fine");
  t.same(violationsIn("tools/x.ts", 'import "../steps/index.ts";'), [
    "tools/x.ts is in an unknown top-level folder tools/ (add it to the layout)",
  ]);
});

t.test("sub-layers and scripts", async (t) => {
  t.same(violationsIn("agent/converge/x.ts", 'import { run } from "../commands/once.ts";'), [
    "agent/converge/x.ts imports agent/commands/once.ts (commands sit on top of the runtime)",
  ]);
  t.same(violationsIn("agent/fencing/x.ts", 'import { g } from "../converge/gate.ts";'), [
    "agent/fencing/x.ts imports agent/converge/gate.ts (jobs are independent)",
  ]);
  t.same(violationsIn("cluster/render/x.ts", 'import { s } from "../server/store.ts";'), [
    "cluster/render/x.ts imports cluster/server/store.ts (rendering is pure)",
  ]);
  t.same(violationsIn("cluster/controllers/x.ts", 'import { w } from "../server/checksums.ts";'), [
    "cluster/controllers/x.ts imports cluster/server/checksums.ts (the controllers run without the bundle server)",
  ]);
  t.same(violationsIn("cluster/sources/x.ts", 'import { b } from "../server/bootstrap-secrets.ts";'), [
    "cluster/sources/x.ts imports cluster/server/bootstrap-secrets.ts (the bundle server wires its sources; they do not know it)",
  ]);
  t.same(violationsIn("cluster/server/x.ts", 'import { l } from "../leadership.ts";'), [], "shared infrastructure");
  t.same(violationsIn("scripts/demo.ts", 'import { x } from "../test/lib/pki.ts";'), [
    "scripts/demo.ts imports test/lib/pki.ts",
  ]);
  t.same(violationsIn("agent/commands/x.ts", 'import { r } from "../converge/converge.ts";'), []);
});
