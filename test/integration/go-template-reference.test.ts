// The Go-template cases (test/fixtures/go-template-cases.ts) rendered by Go's own text/template
// + sprig, as Deckhouse's bashible-apiserver renders NodeGroupConfiguration content: what our
// renderer renders, Go renders the same; what it refuses, Go refuses too, except for the
// deliberate differences, where Go's output is pinned. Builds the reference program with the
// machine's Go the first time (modules from the Go module proxy).
import t from "tap";
import { goReference, renderWithGo } from "../lib/go-reference.ts";
import { cases, DATA } from "../fixtures/go-template-cases.ts";

const ref = await goReference();
t.test(
  "Go's text/template + sprig render the same (differential)",
  { skip: "skip" in ref ? ref.skip : false },
  async (t) => {
    if ("skip" in ref) return;
    const results = await renderWithGo(
      ref.bin,
      cases.map((c) => ({ template: c.tpl, data: DATA })),
    );
    cases.forEach((c, i) => {
      const go = results[i]!;
      if (c.go !== undefined) {
        if (typeof c.go === "string") t.equal(go.out, c.go, `${c.name}: Go renders ${JSON.stringify(c.go)}`);
        else t.match(go.err, c.go, `${c.name}: Go fails (${go.err ?? `rendered ${JSON.stringify(go.out)}`})`);
      } else if (typeof c.want === "string") {
        t.equal(go.out, c.want, `${c.name}: same as Go`);
      } else {
        t.ok(go.err, `${c.name}: Go refuses too (${go.err ?? `rendered ${JSON.stringify(go.out)}`})`);
      }
    });
  },
);
