// The README says what the code does, and cannot drift from it: its flags table is the converge
// commands' own option definitions and `--help`, its npm script list is package.json's, every
// command it documents runs on the machine's Node as written (no bare `node FILE.ts`, which
// needs the pinned Node 24), and the figures it and docs/operating.md quote come from one
// place, docs/benchmarks.md's "Headline figures".
import t from "tap";
import { readFile } from "node:fs/promises";
import path from "node:path";
import type { Command } from "../../lib/cli.ts";
import run from "../../agent/commands/run.ts";
import once from "../../agent/commands/once.ts";
import plan from "../../agent/commands/plan.ts";

const REPO = path.resolve(import.meta.dirname, "../..");
const read = (rel: string) => readFile(path.join(REPO, rel), "utf8");
const README = await read("README.md");

/** The lines of a markdown section: from its heading to the next heading of any level. */
function section(text: string, heading: string): string {
  const lines = text.split("\n");
  const start = lines.findIndex((l) => l.trim() === heading);
  if (start < 0) throw new Error(`no section '${heading}'`);
  const end = lines.findIndex((l, i) => i > start && /^#{1,6} /.test(l));
  return lines.slice(start + 1, end < 0 ? undefined : end).join("\n");
}

const CONVERGE_COMMANDS: Record<string, Command> = { run, once, plan };
const ALL = Object.keys(CONVERGE_COMMANDS);

/** README table rows → flag → the commands it is listed for ("(run, once)"; none named: all three). */
export function flagsTable(text: string): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const line of section(text, "### Configuration of the converge commands").split("\n")) {
    if (!line.startsWith("| `--")) continue;
    const first = line.split(/(?<!\\)\|/)[1] ?? "";
    const named = /\(([a-z, ]+)\)\s*$/.exec(first.trim());
    const commands = named?.[1] ? named[1].split(/,\s*/) : ALL;
    for (const m of first.matchAll(/`--([a-z][a-z-]*)/g)) out.set(m[1] as string, commands);
  }
  return out;
}

t.test("the flags table lists exactly each converge command's options", async (t) => {
  const table = flagsTable(README);
  t.ok(table.size > 10, "the table parsed");
  for (const [name, cmd] of Object.entries(CONVERGE_COMMANDS)) {
    const defined = Object.keys(cmd.options ?? {}).sort();
    const listed = [...table].filter(([, cmds]) => cmds.includes(name)).map(([flag]) => flag);
    t.same(listed.sort(), defined, `bashible ${name}: README table = the command's option definitions`);
  }
});

t.test("each converge command's --help names every option it accepts, and no other", async (t) => {
  for (const [name, cmd] of Object.entries(CONVERGE_COMMANDS)) {
    const defined = Object.keys(cmd.options ?? {}).sort();
    const inHelp = [...new Set([...cmd.help.matchAll(/^\s+--([a-z][a-z-]*)/gm)].map((m) => m[1] as string))].sort();
    t.same(inHelp, defined, `bashible ${name} --help`);
  }
});

t.test("plan takes no retry or approval options: a dry run applies nothing", async (t) => {
  for (const flag of ["retry-interval", "max-retries", "approval-timeout"]) {
    t.notOk(flag in (plan.options ?? {}), `plan has no --${flag}`);
    t.notMatch(plan.help, `--${flag}`);
    t.ok(flag in (once.options ?? {}), `once has --${flag}`);
  }
});

t.test("the README's npm script list is package.json's", async (t) => {
  const pkg = JSON.parse(await read("package.json")) as { scripts: Record<string, string> };
  const para = /^npm scripts: [\s\S]*?\n\n/m.exec(README)?.[0] ?? "";
  t.ok(para, "the README has an 'npm scripts:' paragraph");
  // Each script is named first in its backticks: `bench -- <name>`, `push -- REGISTRY/PATH`.
  const listed = [...para.matchAll(/`([a-z][a-z0-9:]*)(?: [^`]*)?`/g)].map((m) => m[1] as string);
  t.same([...new Set(listed)].sort(), Object.keys(pkg.scripts).sort());
});

t.test("no documented command runs a .ts file on the machine's own Node", async (t) => {
  // `node FILE.ts` needs Node 24 (type stripping); Debian 12's Node 18 says "Unknown file
  // extension". Documented commands go through npm (`npm start --`, `npm run`) or `npx node`.
  const files = ["README.md", "docs/operating.md", "docs/testing.md", "cluster/deploy/deployment.yaml"];
  for (const f of files) {
    const bare = [...(await read(f)).matchAll(/(?<![\w/.-]|npx )node [^\s`]*\.ts\b/g)].map((m) => m[0]);
    t.same(bare, [], `${f}: every \`node X.ts\` is \`npx node X.ts\` or an npm script`);
  }
});

/** Number-with-unit figures ("8.2 s", "65.2 MB", "1.38 ×"). */
const figuresIn = (text: string) =>
  [...text.matchAll(/(\d+(?:\.\d+)?) ?(ms|s|MB|×)(?![\w])/g)].map((m) => `${m[1]} ${m[2]}`);

/** The figures in the paragraphs (and list items) that quote measurements; code blocks left out. */
export function quotedFigures(text: string): string[] {
  const prose = text.replace(/```[\s\S]*?```/g, "");
  const paragraphs = prose.split(/\n\s*\n|\n(?=\s*[-*] |\s*\d+\. )/);
  return paragraphs.filter((p) => /benchmarks\.md|\bMeasured\b/.test(p)).flatMap(figuresIn);
}

t.test("figures in the README and docs/operating.md are docs/benchmarks.md's headline figures", async (t) => {
  const headline = section(await read("docs/benchmarks.md"), "## Headline figures");
  const known = new Set(figuresIn(headline));
  for (const f of ["README.md", "docs/operating.md"]) {
    const figures = quotedFigures(await read(f));
    t.ok(figures.length > 0, `${f} quotes figures`);
    t.same(
      figures.filter((x) => !known.has(x)),
      [],
      `${f}: each quoted figure is in the headline table (update both, from the section that measured it)`,
    );
  }
});

t.test("the figure check fires on a figure the headline table lacks", async (t) => {
  t.same(quotedFigures("Measured: join in 9.3 s, 65.4 MB, 1.39×.\n\nelapsed 6.5 s"), ["9.3 s", "65.4 MB", "1.39 ×"]);
});
