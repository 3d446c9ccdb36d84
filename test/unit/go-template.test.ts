// The Go-template renderer of NodeGroupConfiguration content: every construct it supports
// renders as documented (test/integration/go-template-reference.test.ts checks the same cases
// against Go itself), every construct outside the set is refused with its line.
import t from "tap";
import { renderGoTemplate, TemplateError } from "../../cluster/render/go-template.ts";
import { cases, DATA } from "../fixtures/go-template-cases.ts";

t.test("each construct renders as documented", async (t) => {
  for (const c of cases) {
    let got: string | Error;
    try {
      got = renderGoTemplate(c.tpl, DATA);
    } catch (e) {
      got = e as Error;
    }
    if (typeof c.want === "string") {
      t.equal(got instanceof Error ? `ERROR ${got.message}` : got, c.want, c.name);
    } else {
      t.type(got, TemplateError, `${c.name}: refused`);
      t.match(got instanceof Error ? got.message : got, c.want, c.name);
    }
  }
});

t.test("a refusal names the line and the construct", async (t) => {
  const tpl = '#!/bin/bash\necho start\nX={{ .nodeGroup.name }}\n{{- template "helpers" . }}\necho end\n';
  const err = (() => {
    try {
      renderGoTemplate(tpl, DATA);
    } catch (e) {
      return e as TemplateError;
    }
  })();
  t.type(err, TemplateError);
  t.equal(err?.line, 4);
  t.equal(err?.construct, '{{- template "helpers" . }}');
  t.equal(
    err?.message,
    `line 4: {{- template "helpers" . }}: 'template' is not supported: named templates cannot be used in NodeGroupConfiguration scripts`,
  );
});

t.test("nothing is printed before a refusal: the whole script fails", async (t) => {
  t.throws(() => renderGoTemplate("echo one\n{{ .missing }}\necho two\n", DATA), TemplateError);
});
