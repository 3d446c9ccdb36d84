// The bundle server's template engine against a model of Deckhouse's own (test/reference/
// go-template: the same Go packages at Deckhouse's versions, Deckhouse's function set, none of
// our guards): every case of test/fixtures/go-template-cases.ts, every function a template can
// call, generated templates and the NGC corpus render the same, or the bundle server refuses
// where Deckhouse's output is a bug in the script (or where Deckhouse fails too). Builds the
// reference with the machine's Go the first time (modules from the Go module proxy).
import t from "tap";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { renderGoTemplate, TemplateError } from "../../cluster/render/go-template.ts";
import { loadConfigDir } from "../../cluster/sources/directory.ts";
import { goFunctions, goReference, renderWithGo, withSecrets } from "../lib/go-reference.ts";
import { generateTemplates } from "../lib/template-generator.ts";
import {
  cases,
  DATA,
  DELIBERATE_REFUSALS,
  FUNCTION_CALLS,
  REFUSED_FUNCTIONS,
  SECRET,
} from "../fixtures/go-template-cases.ts";

const ref = await goReference();
const skip = "skip" in ref ? ref.skip : false;
const bin = "skip" in ref ? "" : ref.bin;
const DECKHOUSE_DATA = withSecrets(DATA, SECRET);

const ours = (tpl: string): { out: string } | { refused: string } => {
  try {
    return { out: renderGoTemplate(tpl, DATA) };
  } catch (e) {
    if (e instanceof TemplateError) return { refused: e.message };
    throw e;
  }
};
const shown = (r: { out?: string; err?: string }) => (r.err ? `fails: ${r.err}` : `renders ${JSON.stringify(r.out)}`);

const deliberate = (message: string) => DELIBERATE_REFUSALS.some((r) => r.message.test(message));

t.test(
  "each case: Deckhouse renders what the bundle server renders, or the difference is pinned",
  { skip },
  async (t) => {
    const results = await renderWithGo(
      bin,
      cases.map((c) => ({ template: c.tpl, data: DECKHOUSE_DATA })),
    );
    cases.forEach((c, i) => {
      const go = results[i]!;
      if (c.go instanceof RegExp) t.match(go.err, c.go, `${c.name}: Deckhouse fails (${shown(go)})`);
      else if (typeof c.go === "string") t.equal(go.out, c.go, `${c.name}: Deckhouse renders ${JSON.stringify(c.go)}`);
      else if (c.go)
        t.match(go.out, c.go.out, `${c.name}: Deckhouse renders something like ${c.go.out} (${shown(go)})`);
      else if (typeof c.want === "string") t.equal(go.out, c.want, `${c.name}: same as Deckhouse`);
      else t.ok(go.err, `${c.name}: Deckhouse fails too (${shown(go)})`);
    });
  },
);

t.test("every function Deckhouse offers renders the same, or is a listed refusal", { skip }, async (t) => {
  const names = await goFunctions(bin);
  t.same(
    names.filter((n) => !Object.hasOwn(FUNCTION_CALLS, n)),
    [],
    "every function has a case",
  );
  t.same(
    Object.keys(FUNCTION_CALLS).filter((n) => !names.includes(n)),
    [],
    "no case for a function Deckhouse lacks",
  );
  const entries = Object.entries(FUNCTION_CALLS);
  const results = await renderWithGo(
    bin,
    entries.map(([, template]) => ({ template, data: DECKHOUSE_DATA })),
  );
  entries.forEach(([name, tpl], i) => {
    const go = results[i]!;
    const mine = ours(tpl);
    const refusal = REFUSED_FUNCTIONS.get(name);
    if (refusal) {
      t.ok("refused" in mine, `${name}: refused (${JSON.stringify(mine)})`);
      if ("refused" in mine) t.match(mine.refused, refusal, name);
    } else if (go.err !== undefined) {
      t.ok(
        "refused" in mine,
        `${name}: Deckhouse fails (${go.err}), so does the bundle server (${JSON.stringify(mine)})`,
      );
    } else {
      t.same(mine, { out: go.out }, `${name}: ${tpl}`);
    }
  });
});

t.test(
  "generated templates render as Deckhouse renders them, refused only where its output is a bug",
  { skip },
  async (t) => {
    const templates = generateTemplates(400);
    const results = await renderWithGo(
      bin,
      templates.map((template) => ({ template, data: DECKHOUSE_DATA })),
    );
    let rendered = 0;
    templates.forEach((tpl, i) => {
      const go = results[i]!;
      const mine = ours(tpl);
      if ("out" in mine) {
        rendered++;
        if (mine.out !== go.out) t.fail(`renders as Deckhouse: ${tpl}`, { ours: mine.out, deckhouse: shown(go) });
      } else if (go.err === undefined && !deliberate(mine.refused)) {
        t.fail(`refused only deliberately or where Deckhouse fails too: ${tpl}`, {
          refused: mine.refused,
          deckhouse: go.out,
        });
      }
    });
    t.ok(rendered > templates.length / 3, `most of them render (${rendered} of ${templates.length})`);
  },
);

t.test("the NGC corpus renders as Deckhouse renders it", { skip }, async (t) => {
  const here = path.dirname(fileURLToPath(import.meta.url));
  const corpus = (await loadConfigDir(path.resolve(here, "../fixtures/ngc-corpus"))).snapshot.inputs.configurations;
  const results = await renderWithGo(
    bin,
    corpus.map((c) => ({ template: c.spec.content, data: DECKHOUSE_DATA })),
  );
  corpus.forEach((c, i) => {
    t.same(ours(c.spec.content), { out: results[i]!.out }, c.metadata.name);
  });
});
