// The bundle server's template engine (Go's text/template + sprig in WebAssembly): every
// construct renders as Deckhouse renders it, and where Deckhouse's output would be a bug in the
// script the render fails naming the line. test/integration/go-template-reference.test.ts checks
// the same cases, every function and generated templates against a model of Deckhouse's engine.
import t from "tap";
import { renderGoTemplate, TemplateError } from "../../cluster/render/go-template.ts";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { cases, DATA, DELIBERATE_REFUSALS } from "../fixtures/go-template-cases.ts";

const render = (tpl: string, data: unknown = DATA): string | TemplateError => {
  try {
    return renderGoTemplate(tpl, data);
  } catch (e) {
    if (e instanceof TemplateError) return e;
    throw e;
  }
};

t.test("each construct renders as Deckhouse renders it, or is refused with its reason", async (t) => {
  for (const c of cases) {
    const got = render(c.tpl);
    if (typeof c.want === "string") {
      t.equal(got instanceof TemplateError ? `REFUSED ${got.message}` : got, c.want, c.name);
    } else {
      t.type(got, TemplateError, `${c.name}: refused`);
      t.match(got instanceof TemplateError ? got.message : got, c.want, c.name);
    }
  }
});

t.test("a refusal names the line and the construct; nothing of the script is returned", async (t) => {
  const tpl =
    '#!/bin/bash\necho start\nX={{ .nodeGroup.name }}\nMAX={{ printf "%d" .nodeGroup.kubelet.maxPods }}\necho end\n';
  const err = render(tpl) as TemplateError;
  t.type(err, TemplateError);
  t.equal(err.line, 4);
  t.equal(err.construct, 'printf "%d" .nodeGroup.kubelet.maxPods');
  t.equal(
    err.message,
    'line 4: {{ printf "%d" .nodeGroup.kubelet.maxPods }}: printf "%d": Go writes "%!d(float64=110)" into the script (numbers from the context are float64: use %v, or int)',
  );
});

t.test("a kept-out value's reason reaches the user, the value never does", async (t) => {
  const data = { registry: { auth: { $keptOut: ".registry.auth is a secret" } } };
  for (const tpl of [
    "{{ .registry.auth }}",
    "{{ toJson . }}",
    "{{ .registry | toString | b64enc }}",
    "{{ quote .registry.auth }}",
  ]) {
    const err = render(tpl, data);
    t.type(err, TemplateError, tpl);
    t.match((err as Error).message, /\.registry\.auth is a secret/, tpl);
  }
  t.equal(render("{{ with .registry.auth }}set{{ end }}", data), "set", "usable as a condition");
});

t.test("renders are independent: one script's set and define never reach the next", async (t) => {
  const data = { m: { a: 1 } };
  t.equal(render('{{ define "x" }}X{{ end }}{{ $_ := set .m "b" 2 }}{{ len .m }}', data), "2");
  t.equal(render("{{ len .m }}", data), "1");
  t.match(render('{{ template "x" }}', data), /template "x" not defined/);
});

t.test("a rendered script longer than the limit is refused", async (t) => {
  t.equal(renderGoTemplate('{{ repeat 10 "a" }}', {}, { maxOutput: 10 }), "aaaaaaaaaa");
  t.throws(() => renderGoTemplate('{{ repeat 11 "a" }}', {}, { maxOutput: 10 }), /longer than the limit/);
});

t.test("the deliberate refusals are refusals, and each is a row of docs/deckhouse-compatibility.md", async (t) => {
  const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
  const doc = await readFile(path.join(REPO, "docs/deckhouse-compatibility.md"), "utf8");
  const table = doc.slice(doc.indexOf("### Refused where Deckhouse renders"), doc.indexOf("### The context"));
  const rows = table
    .split("\n")
    .filter((l) => l.startsWith("| ") && !l.startsWith("| kind"))
    .map((l) => l.split("|")[1]!.trim());
  t.same([...rows].sort(), DELIBERATE_REFUSALS.map((r) => r.kind).sort(), "the table lists exactly these kinds");
  for (const r of DELIBERATE_REFUSALS) {
    const got = render(r.example);
    t.type(got, TemplateError, `${r.kind}: refused`);
    t.match((got as Error).message, r.message, r.kind);
  }
});

t.test("without the engine, plain scripts render and templated ones fail naming the build command", async (t) => {
  const { execFile } = await import("node:child_process");
  const { promisify } = await import("node:util");
  const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
  const code = `
    const { renderGoTemplate } = await import(${JSON.stringify(path.join(REPO, "cluster/render/go-template.ts"))});
    console.log(JSON.stringify(renderGoTemplate("echo plain\\n", {})));
    try { renderGoTemplate("echo {{ .x }}", { x: 1 }); } catch (e) { console.log(e.name + ": " + e.message); }`;
  const run = async (env: Record<string, string>) => {
    const { BASHIBLE_TEMPLATE_ENGINE: _, ...rest } = process.env;
    return (
      await promisify(execFile)(process.execPath, ["--input-type=module", "-e", code], { env: { ...rest, ...env } })
    ).stdout;
  };
  t.match(
    await run({ BASHIBLE_TEST_CACHE: "/nonexistent/cache" }),
    /^"echo plain\\n"\nEngineMissingError: the Go template engine is not built .*: run `npm run build` \(it needs Go/,
  );
  t.equal(
    await run({ BASHIBLE_TEMPLATE_ENGINE: "/nonexistent/engine.wasm" }),
    '"echo plain\\n"\nEngineMissingError: BASHIBLE_TEMPLATE_ENGINE=/nonexistent/engine.wasm: no such file\n',
  );
});
