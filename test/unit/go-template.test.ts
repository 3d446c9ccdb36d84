// The Go-template renderer of NodeGroupConfiguration content: every construct it supports
// renders what Go's text/template + sprig renders for Deckhouse (checked against Go itself when
// Go is installed), every construct outside the set is refused with its line, and the few
// deliberate differences are pinned down next to what Go does instead.
import t from "tap";
import { renderGoTemplate, TemplateError } from "../../cluster/render/go-template.ts";
import { goReference, renderWithGo } from "../lib/go-reference.ts";

/** A context shaped like Deckhouse's bundle-<group> context. */
const DATA = {
  runType: "Normal",
  kubernetesVersion: "1.34",
  cri: "Containerd",
  nodeGroup: {
    name: "worker",
    nodeType: "Static",
    disruptions: { approvalMode: "Automatic" },
    kubelet: { maxPods: 110, containerLogMaxSize: "50Mi" },
  },
  nodeUsers: [
    {
      name: "alice",
      spec: { uid: 1100, isSudoer: true, sshPublicKeys: ["ssh-ed25519 AAAA alice"], nodeGroups: ["*"] },
    },
    { name: "bob", spec: { uid: 1200, isSudoer: false, sshPublicKeys: [], nodeGroups: ["worker"] } },
  ],
  normal: { apiserverEndpoints: ["10.0.0.10:6443", "10.0.0.11:6443"], kubernetesCA: "CA-PEM\n" },
  registry: { address: "registry.example.com", path: "/deckhouse/ce", scheme: "https" },
  proxy: { httpProxy: "http://proxy:3128", httpsProxy: "https://proxy:8443", noProxy: ["127.0.0.1", ".svc"] },
  empty: "",
  zero: 0,
  big: 1100000,
  small: 0.00001,
  frac: 2.5,
  tru: true,
  nul: null,
  emptyList: [],
  emptyMap: {},
  special: 'a "b" \\ c\t<&>',
};

interface Case {
  name: string;
  tpl: string;
  /** Expected output; a RegExp means "refused, message matches". */
  want: string | RegExp;
  /** We deliberately differ from Go here; this is what Go does instead (output or /error/). */
  go?: string | RegExp;
}

const cases: Case[] = [
  // field access and printing
  { name: "field", tpl: "{{ .nodeGroup.name }}", want: "worker" },
  {
    name: "root from inside range",
    tpl: "{{ range .nodeUsers }}{{ $.nodeGroup.name }}:{{ .name }} {{ end }}",
    want: "worker:alice worker:bob ",
  },
  { name: "list prints as Go", tpl: "{{ .normal.apiserverEndpoints }}", want: "[10.0.0.10:6443 10.0.0.11:6443]" },
  {
    name: "map prints as Go",
    tpl: "{{ .registry }}",
    want: "map[address:registry.example.com path:/deckhouse/ce scheme:https]",
  },
  {
    name: "numbers print as Go",
    tpl: "{{ .nodeGroup.kubelet.maxPods }} {{ .big }} {{ .small }} {{ .frac }} {{ 42 }} {{ 1.5 }} {{ -3 }} {{ 0x1F }} {{ 1e3 }}",
    want: "110 1.1e+06 1e-05 2.5 42 1.5 -3 31 1000",
  },
  { name: "bools", tpl: "{{ .tru }} {{ false }}", want: "true false" },
  { name: "string escapes", tpl: '{{ "a\\tb\\u00e9\\x41" }}|{{ `raw\\n` }}', want: "a\tbéA|raw\\n" },
  { name: "missing chain is false", tpl: "{{ if .nodeGroup.missing.deeper }}yes{{ else }}no{{ end }}", want: "no" },
  {
    name: "index",
    tpl: '{{ index .normal.apiserverEndpoints 1 }} {{ index .nodeGroup "name" }}',
    want: "10.0.0.11:6443 worker",
  },
  { name: "len counts bytes", tpl: '{{ len .nodeUsers }} {{ len "héllo" }} {{ len .registry }}', want: "2 6 3" },
  { name: "parenthesised pipeline with field", tpl: "{{ (index .nodeUsers 0).spec.uid }}", want: "1100" },
  // if / else if / else, comparisons, logic
  { name: "if eq runType", tpl: '{{ if eq .runType "Normal" }}normal{{ end }}', want: "normal" },
  {
    name: "else if chain",
    tpl: '{{ if eq .nodeGroup.nodeType "CloudEphemeral" }}cloud{{ else if eq .nodeGroup.nodeType "Static" }}static{{ else }}other{{ end }}',
    want: "static",
  },
  {
    name: "else branch",
    tpl: '{{ if eq .nodeGroup.name "master" }}m{{ else }}not master{{ end }}',
    want: "not master",
  },
  { name: "eq with several", tpl: '{{ if eq .nodeGroup.name "master" "worker" }}y{{ end }}', want: "y" },
  {
    name: "and/ne",
    tpl: '{{ if and (eq .runType "Normal") (ne .nodeGroup.nodeType "CloudEphemeral") }}ok{{ end }}',
    want: "ok",
  },
  { name: "or over falsy values", tpl: "{{ if or .empty .zero .tru }}t{{ end }}", want: "t" },
  {
    name: "and/or return values",
    tpl: '{{ and 1 "x" }} {{ or .empty "fallback" }} {{ and .zero "never" }}',
    want: "x fallback 0",
  },
  { name: "and short-circuits", tpl: "{{ if and .nul .nul.x }}a{{ else }}b{{ end }}", want: "b" },
  { name: "not", tpl: "{{ not .empty }} {{ not .tru }}", want: "true false" },
  {
    name: "empty list and map are false",
    tpl: "{{ if .emptyList }}y{{ else }}n{{ end }}{{ if .emptyMap }}y{{ else }}n{{ end }}",
    want: "nn",
  },
  { name: "eq with a missing value", tpl: '{{ eq .missing "x" }}', want: "false" },
  { name: "lt/ge on floats", tpl: "{{ lt .frac 3.0 }} {{ ge .nodeGroup.kubelet.maxPods 110.0 }}", want: "true true" },
  { name: "lt on strings", tpl: '{{ lt "a" "b" }}', want: "true" },
  // range
  {
    name: "range with index and value",
    tpl: "{{ range $i, $u := .nodeUsers }}{{ $i }}:{{ $u.name }},{{ end }}",
    want: "0:alice,1:bob,",
  },
  {
    name: "range with one variable",
    tpl: "{{ range $u := .nodeUsers }}{{ $u.spec.uid }} {{ end }}",
    want: "1100 1200 ",
  },
  {
    name: "range over a map is sorted",
    tpl: "{{ range $k, $v := .registry }}{{ $k }}={{ $v }};{{ end }}",
    want: "address=registry.example.com;path=/deckhouse/ce;scheme=https;",
  },
  { name: "range else", tpl: "{{ range .emptyList }}x{{ else }}none{{ end }}", want: "none" },
  { name: "range over a missing value", tpl: "{{ range .missing }}x{{ else }}empty{{ end }}", want: "empty" },
  {
    name: "break and continue",
    tpl: '{{ range .nodeUsers }}{{ if eq .name "alice" }}{{ continue }}{{ end }}{{ .name }}{{ break }}{{ end }}',
    want: "bob",
  },
  {
    name: "nested range",
    tpl: "{{ range .nodeUsers }}{{ $u := .name }}{{ range .spec.sshPublicKeys }}{{ $u }}={{ . }};{{ end }}{{ end }}",
    want: "alice=ssh-ed25519 AAAA alice;",
  },
  // with
  { name: "with", tpl: "{{ with .proxy }}{{ .httpProxy }}{{ end }}", want: "http://proxy:3128" },
  { name: "with else", tpl: "{{ with .missing }}x{{ else }}no proxy{{ end }}", want: "no proxy" },
  { name: "with variable", tpl: "{{ with $p := .proxy }}{{ $p.httpsProxy }}{{ end }}", want: "https://proxy:8443" },
  {
    name: "else with",
    tpl: "{{ with .missing }}a{{ else with .proxy }}{{ .httpProxy }}{{ end }}",
    want: "http://proxy:3128",
  },
  // variables
  {
    name: "assignment reaches the outer variable",
    tpl: "{{ $x := 1 }}{{ if true }}{{ $x = 2 }}{{ end }}{{ $x }}",
    want: "2",
  },
  { name: "declaration prints nothing", tpl: "a{{ $x := .nodeGroup.name }}b{{ $x }}", want: "abworker" },
  // comments and trimming
  { name: "comment", tpl: "a {{/* comment */}} b", want: "a  b" },
  { name: "trimmed comment", tpl: "a {{- /* comment */ -}} b", want: "ab" },
  { name: "multi-line comment", tpl: "a\n{{- /*\n  several\n  lines\n*/}}\nb", want: "a\nb" },
  { name: "trim markers", tpl: "line1\n{{- if true }}\nline2\n{{- end }}\n", want: "line1\nline2\n" },
  { name: "trim both sides", tpl: "x  {{- .nodeGroup.name -}}  \n y", want: "xworkery" },
  { name: "negative number is not a trim", tpl: "a {{-3}}", want: "a -3" },
  { name: "action spanning lines", tpl: '{{ if\n  eq .runType "Normal" }}y{{ end }}', want: "y" },
  // pipes and functions
  { name: "quote", tpl: "{{ .proxy.httpProxy | quote }}", want: '"http://proxy:3128"' },
  { name: "quote escapes", tpl: "{{ .special | quote }}", want: '"a \\"b\\" \\\\ c\\t<&>"' },
  { name: "quote of a number", tpl: "{{ .big | quote }} {{ .missing | quote }}|", want: '"1.1e+06" |' },
  { name: "squote", tpl: "{{ .nodeGroup.name | squote }}", want: "'worker'" },
  {
    name: "default",
    tpl: '{{ .missing | default "none" }} {{ .empty | default "e" }} {{ .zero | default 5 }} {{ default "d" .nodeGroup.name }}',
    want: "none e 5 worker",
  },
  {
    name: "toYaml of a list",
    tpl: "{{ .normal.apiserverEndpoints | toYaml }}",
    want: "- 10.0.0.10:6443\n- 10.0.0.11:6443",
  },
  {
    name: "toYaml of nested objects",
    tpl: "{{ .nodeUsers | toYaml }}",
    want:
      "- name: alice\n  spec:\n    isSudoer: true\n    nodeGroups:\n    - '*'\n    sshPublicKeys:\n    - ssh-ed25519 AAAA alice\n    uid: 1100\n" +
      "- name: bob\n  spec:\n    isSudoer: false\n    nodeGroups:\n    - worker\n    sshPublicKeys: []\n    uid: 1200",
  },
  {
    name: "toYaml indented",
    tpl: "proxy:{{ .proxy | toYaml | nindent 2 }}",
    want: "proxy:\n  httpProxy: http://proxy:3128\n  httpsProxy: https://proxy:8443\n  noProxy:\n  - 127.0.0.1\n  - .svc",
  },
  {
    name: "toYaml quoting as go-yaml",
    tpl: '{{ dict "ca" .normal.kubernetesCA "yes" "true" "num" "123" "blank" "" "star" "*" "colon" "a: b" "m" .emptyMap "l" .emptyList "n" .nul | toYaml }}',
    want: 'blank: ""\nca: |\n  CA-PEM\ncolon: \'a: b\'\nl: []\nm: {}\n"n": null\nnum: "123"\nstar: \'*\'\n"yes": "true"',
  },
  { name: "indent", tpl: '{{ "a\\nb" | indent 3 }}', want: "   a\n   b" },
  {
    name: "toJson",
    tpl: "{{ .proxy | toJson }} {{ .special | toJson }}",
    want: '{"httpProxy":"http://proxy:3128","httpsProxy":"https://proxy:8443","noProxy":["127.0.0.1",".svc"]} "a \\"b\\" \\\\ c\\t\\u003c\\u0026\\u003e"',
  },
  {
    name: "b64enc and b64dec",
    tpl: '{{ .normal.kubernetesCA | b64enc }} {{ "aGVsbG8=" | b64dec }}',
    want: "Q0EtUEVNCg== hello",
  },
  { name: "join", tpl: '{{ .proxy.noProxy | join "," }}', want: "127.0.0.1,.svc" },
  {
    name: "string functions",
    tpl: '{{ .nodeGroup.name | upper }} {{ "ABC" | lower }} [{{ "  x  " | trim }}] {{ "a-b-c" | replace "-" "_" }} {{ "hello.sh" | trimSuffix ".sh" }} {{ "v1.2" | trimPrefix "v" }}',
    want: "WORKER abc [x] a_b_c hello 1.2",
  },
  {
    name: "contains / hasPrefix / hasSuffix",
    tpl: '{{ contains "proxy" .proxy.httpProxy }} {{ hasPrefix "http:" .proxy.httpProxy }} {{ hasSuffix ".com" .registry.address }}',
    want: "true true true",
  },
  {
    name: "list and has, as Deckhouse's steps use them",
    tpl: '{{- $nodeTypeList := list "CloudPermanent" "Static" }}{{ if has .nodeGroup.nodeType $nodeTypeList }}yes{{ end }}',
    want: "yes",
  },
  {
    name: "dict / hasKey / get",
    tpl: '{{ $d := dict "a" "1" "b" "2" }}{{ hasKey $d "a" }} {{ get $d "b" }} [{{ get $d "zz" }}]',
    want: "true 2 []",
  },
  { name: "first / last", tpl: "{{ (first .nodeUsers).name }} {{ last .proxy.noProxy }}", want: "alice .svc" },
  { name: "splitList", tpl: '{{ range splitList "." .kubernetesVersion }}[{{ . }}]{{ end }}', want: "[1][34]" },
  {
    name: "ternary / coalesce",
    tpl: '{{ ternary "yes" "no" .tru }} {{ coalesce .empty .missing "c" }}',
    want: "yes c",
  },
  { name: "required passes a value", tpl: '{{ required "need a name" .nodeGroup.name }}', want: "worker" },
  { name: "printf", tpl: '{{ printf "%s-%d %v %q" .nodeGroup.name 3 .tru "x" }}', want: 'worker-3 true "x"' },
  { name: "piped value is the last argument", tpl: '{{ "x" | printf "%s-%s" "a" }}', want: "a-x" },
  { name: "print spacing as Go", tpl: '{{ print "a" 1 2 "b" }}', want: "a1 2b" },
  { name: "keys | sortAlpha", tpl: '{{ keys .registry | sortAlpha | join "," }}', want: "address,path,scheme" },
  {
    name: "semverCompare",
    tpl: '{{ semverCompare ">=1.30" .kubernetesVersion }} {{ semverCompare "~1.34" "1.34.4" }} {{ semverCompare "<1.30 || >=1.34" "1.34" }} {{ semverCompare ">1.34" "1.34.0" }}',
    want: "true true true false",
  },
  {
    name: "toString / empty",
    tpl: "{{ toString .big }} {{ empty .emptyList }} {{ empty .nodeGroup }}",
    want: "1.1e+06 true false",
  },

  // refused, as Go refuses too
  { name: "template", tpl: '{{ template "x" . }}', want: /'template' is not supported/ },
  { name: "include", tpl: '{{ include "x" . }}', want: /'include' is not supported/ },
  { name: "tpl", tpl: '{{ tpl "{{ 1 }}" . }}', want: /'tpl' is not supported/ },
  { name: "env", tpl: '{{ env "HOME" }}', want: /'env' is not supported/ },
  { name: "unknown function", tpl: "{{ frobnicate 1 }}", want: /function 'frobnicate' is not supported/ },
  { name: "nil field", tpl: "{{ .nul.x }}", want: /\.nul is nil/ },
  { name: "field of a string", tpl: "{{ .nodeGroup.name.x }}", want: /can't read field \.x of \.nodeGroup\.name/ },
  { name: "arguments to a field", tpl: "{{ .nodeGroup.name 1 }}", want: /not a function and cannot take arguments/ },
  {
    name: "unclosed if",
    tpl: "a\n{{ if .tru }}\nb",
    want: /line 2: \{\{ if \.tru \}\}: \{\{if\}\} has no matching \{\{end\}\}/,
  },
  { name: "stray end", tpl: "{{ end }}", want: /unexpected \{\{end\}\}/ },
  { name: "stray else", tpl: "{{ else }}", want: /unexpected \{\{else\}\}/ },
  { name: "break outside range", tpl: "{{ break }}", want: /outside \{\{range\}\}/ },
  { name: "undefined variable", tpl: "{{ $nope }}", want: /undefined variable "\$nope"/ },
  {
    name: "variable out of scope",
    tpl: "{{ if .tru }}{{ $y := 1 }}{{ end }}{{ $y }}",
    want: /undefined variable "\$y"/,
  },
  { name: "eq string with number", tpl: '{{ eq "1" 1 }}', want: /incompatible types for comparison/ },
  { name: "eq of a list", tpl: '{{ eq .nodeUsers "x" }}', want: /cannot compare list/ },
  { name: "required fails", tpl: '{{ required "a value is needed" .missing }}', want: /a value is needed/ },
  { name: "len of a number", tpl: "{{ len 3 }}", want: /len of int/ },
  { name: "index out of range", tpl: "{{ index .normal.apiserverEndpoints 5 }}", want: /index out of range/ },
  { name: "nil command", tpl: "{{ nil }}", want: /nil is not a command/ },
  { name: "comment not at the start", tpl: "{{ /* c */ }}", want: /unexpected '\/'/ },
  { name: "unterminated string", tpl: '{{ "abc }}', want: /unterminated quoted string/ },
  { name: "unclosed action", tpl: "{{ .nodeGroup.name", want: /unclosed action/ },
  { name: "pipe into a field", tpl: "{{ .tru | .nodeGroup }}", want: /can't give an argument to non-function/ },
  { name: "two variables outside range", tpl: "{{ $a, $b := .nodeUsers }}", want: /only in \{\{range\}\}/ },

  // refused where Go renders: what Deckhouse would do is written next to it
  { name: "character constant", tpl: "{{ 'a' }}", want: /character constants are not supported/, go: "97" },
  { name: "define", tpl: '{{ define "x" }}y{{ end }}z', want: /'define' is not supported/, go: "z" },
  { name: "block", tpl: '{{ block "x" . }}y{{ end }}', want: /'block' is not supported/, go: "y" },
  {
    name: "a sprig function outside the set",
    tpl: '{{ sha256sum "x" }}',
    want: /function 'sha256sum' is not supported/,
    go: "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881",
  },
  {
    name: "printing a missing value",
    tpl: "{{ .missing }}",
    want: /the value is missing .*<no value>/,
    go: "<no value>",
  },
  { name: "printing nil", tpl: "{{ .nul }}", want: /the value is nil/, go: "<no value>" },
  { name: "printf with flags", tpl: '{{ printf "%08d" 3 }}', want: /'%08d' is not supported/, go: "00000003" },
  { name: "range over an integer", tpl: "{{ range 3 }}x{{ end }}", want: /range can't iterate over 3/, go: "xxx" },
  { name: "binary literal", tpl: "{{ 0b101 }}", want: /not a number this renderer supports/, go: "5" },
  {
    name: "b64dec of garbage",
    tpl: '{{ b64dec "!!!" }}',
    want: /not base64/,
    go: "illegal base64 data at input byte 0",
  },
  // rendered where Go refuses: numbers of different Go types compare by value
  {
    name: "float from the data against an int literal",
    tpl: "{{ gt .nodeGroup.kubelet.maxPods 100 }}",
    want: "true",
    go: /incompatible types for comparison/,
  },
];

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
