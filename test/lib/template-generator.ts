// Random NodeGroupConfiguration-like templates over the fields of the test context
// (test/fixtures/go-template-cases.ts DATA), for the differential test: fields of every kind,
// sprig functions applied to them (also to the wrong kind, so errors are generated too), pipes,
// if/else, range, with and variables. Seeded: the same seed gives the same templates.

type Kind = "string" | "number" | "bool" | "list" | "map" | "any";

const FIELDS: Record<Exclude<Kind, "any">, string[]> = {
  string: [
    ".nodeGroup.name",
    ".bundle",
    ".cri",
    ".runType",
    ".kubernetesVersion",
    ".registry.address",
    ".normal.clusterDomain",
    ".special",
    ".german",
    ".long",
    ".quoteish",
    ".leadingNewline",
    ".empty",
    '"a-b_c"',
    '"1.31.0-rc.1"',
  ],
  number: [".nodeGroup.kubelet.maxPods", ".big", ".small", ".frac", ".zero", "3", "-2", "1.5", "0x10"],
  bool: [".tru", "false", ".nodeGroup.kubelet.missing"],
  list: [".proxy.noProxy", ".normal.apiserverEndpoints", ".numbers", ".emptyList", ".nodeUsers", '(list "b" "a" "b")'],
  map: [".nodeGroup", ".proxy", ".emptyMap", ".nodeGroup.kubelet", ".registry", '(dict "k" "v")', "."],
};
const MISSING = [".missing", ".nul", ".nodeGroup.nope"];

/** name, argument templates (`$` is the piped/last argument), result kind. */
const FUNCS: { kinds: Kind[]; make: (x: string) => string; out: Kind }[] = [
  ...["upper", "lower", "title", "trim", "quote", "squote", "b64enc", "sha256sum", "kebabcase", "snakecase"].map(
    (f) => ({ kinds: ["string"] as Kind[], make: (x: string) => `${f} ${x}`, out: "string" as Kind }),
  ),
  ...["camelcase", "nospace", "swapcase", "toString", "initials", "b64dec", "untitle"].map((f) => ({
    kinds: ["string"] as Kind[],
    make: (x: string) => `${f} ${x}`,
    out: "string" as Kind,
  })),
  { kinds: ["string"], make: (x) => `trunc 5 ${x}`, out: "string" },
  { kinds: ["string"], make: (x) => `abbrev 8 ${x}`, out: "string" },
  { kinds: ["string"], make: (x) => `replace "a" "4" ${x}`, out: "string" },
  { kinds: ["string"], make: (x) => `trimPrefix "w" ${x}`, out: "string" },
  { kinds: ["string"], make: (x) => `repeat 2 ${x}`, out: "string" },
  { kinds: ["string"], make: (x) => `indent 2 ${x}`, out: "string" },
  { kinds: ["string"], make: (x) => `nindent 4 ${x}`, out: "string" },
  { kinds: ["string"], make: (x) => `splitList "." ${x}`, out: "list" },
  { kinds: ["string"], make: (x) => `contains "o" ${x}`, out: "bool" },
  { kinds: ["string"], make: (x) => `hasPrefix "1" ${x}`, out: "bool" },
  { kinds: ["string"], make: (x) => `semverCompare ">=1.30" ${x}`, out: "bool" },
  { kinds: ["string"], make: (x) => `regexReplaceAll "[aeiou]" ${x} "_"`, out: "string" },
  { kinds: ["string"], make: (x) => `printf "%s|%q" ${x} ${x}`, out: "string" },
  { kinds: ["any"], make: (x) => `toYaml ${x}`, out: "string" },
  { kinds: ["any"], make: (x) => `toJson ${x}`, out: "string" },
  { kinds: ["any"], make: (x) => `toString ${x}`, out: "string" },
  { kinds: ["any"], make: (x) => `printf "%v" ${x}`, out: "string" },
  { kinds: ["any"], make: (x) => `print ${x} "x"`, out: "string" },
  { kinds: ["any"], make: (x) => `kindOf ${x}`, out: "string" },
  { kinds: ["any"], make: (x) => `typeOf ${x}`, out: "string" },
  { kinds: ["any"], make: (x) => `empty ${x}`, out: "bool" },
  { kinds: ["any"], make: (x) => `default "d" ${x}`, out: "any" },
  { kinds: ["any"], make: (x) => `list ${x} 1`, out: "list" },
  { kinds: ["any"], make: (x) => `quote ${x}`, out: "string" },
  { kinds: ["any"], make: (x) => `eq ${x} ${x}`, out: "bool" },
  { kinds: ["list"], make: (x) => `first ${x}`, out: "any" },
  { kinds: ["list"], make: (x) => `last ${x}`, out: "any" },
  { kinds: ["list"], make: (x) => `len ${x}`, out: "number" },
  { kinds: ["list"], make: (x) => `join "," ${x}`, out: "string" },
  { kinds: ["list"], make: (x) => `sortAlpha ${x}`, out: "list" },
  { kinds: ["list"], make: (x) => `uniq ${x}`, out: "list" },
  { kinds: ["list"], make: (x) => `reverse ${x}`, out: "list" },
  { kinds: ["list"], make: (x) => `compact ${x}`, out: "list" },
  { kinds: ["list"], make: (x) => `has "127.0.0.1" ${x}`, out: "bool" },
  { kinds: ["list"], make: (x) => `index ${x} 0`, out: "any" },
  { kinds: ["map"], make: (x) => `keys ${x} | sortAlpha`, out: "list" },
  { kinds: ["map"], make: (x) => `hasKey ${x} "name"`, out: "bool" },
  { kinds: ["map"], make: (x) => `get ${x} "name"`, out: "any" },
  { kinds: ["map"], make: (x) => `dig "kubelet" "maxPods" 0 ${x}`, out: "any" },
  { kinds: ["map"], make: (x) => `pick ${x} "name" "httpProxy"`, out: "map" },
  { kinds: ["map"], make: (x) => `omit ${x} "auth"`, out: "map" },
  { kinds: ["map"], make: (x) => `len ${x}`, out: "number" },
  { kinds: ["number"], make: (x) => `add1 ${x}`, out: "number" },
  { kinds: ["number"], make: (x) => `add ${x} 1`, out: "number" },
  { kinds: ["number"], make: (x) => `mul ${x} 2`, out: "number" },
  { kinds: ["number"], make: (x) => `int ${x}`, out: "number" },
  { kinds: ["number"], make: (x) => `printf "%d" ${x}`, out: "string" },
  { kinds: ["number"], make: (x) => `printf "%.2f" ${x}`, out: "string" },
  { kinds: ["number"], make: (x) => `gt ${x} 100.0`, out: "bool" },
  { kinds: ["number"], make: (x) => `lt ${x} 100`, out: "bool" },
  { kinds: ["bool"], make: (x) => `not ${x}`, out: "bool" },
  { kinds: ["bool"], make: (x) => `ternary "yes" "no" ${x}`, out: "string" },
  { kinds: ["bool"], make: (x) => `and ${x} "t"`, out: "any" },
  { kinds: ["bool"], make: (x) => `or ${x} "o"`, out: "any" },
];

/** Mulberry32: small, seeded, good enough for test generation. */
function random(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export function generateTemplates(count: number, seed = 24): string[] {
  const rnd = random(seed);
  const pick = <T>(xs: T[]): T => xs[Math.floor(rnd() * xs.length)]!;
  const kinds: Exclude<Kind, "any">[] = ["string", "number", "bool", "list", "map"];
  const field = (): { expr: string; kind: Kind } => {
    if (rnd() < 0.06) return { expr: pick(MISSING), kind: "any" };
    const kind = pick(kinds);
    return { expr: pick(FIELDS[kind]), kind };
  };
  const expr = (depth: number): { expr: string; kind: Kind } => {
    if (depth <= 0 || rnd() < 0.3) return field();
    const inner = expr(depth - 1);
    // Mostly functions that fit the argument's kind, sometimes any function (errors are cases too).
    const fits = FUNCS.filter((f) => f.kinds.includes("any") || f.kinds.includes(inner.kind));
    const f = rnd() < 0.85 && fits.length ? pick(fits) : pick(FUNCS);
    const arg = inner.expr.includes(" ") && !inner.expr.startsWith("(") ? `(${inner.expr})` : inner.expr;
    return {
      expr: rnd() < 0.3 && !arg.startsWith("(") ? `${arg} | ${f.make("").trimEnd()}` : f.make(arg),
      kind: f.out,
    };
  };
  const statement = (depth: number): string => {
    const r = rnd();
    if (depth > 0 && r < 0.15) return `{{ if ${expr(2).expr} }}A${statement(depth - 1)}{{ else }}B{{ end }}`;
    if (depth > 0 && r < 0.25) {
      const l = pick(FIELDS.list);
      return `{{ range $i, $v := ${l} }}[{{ $i }}={{ $v }}]{{ end }}`;
    }
    if (depth > 0 && r < 0.32) return `{{ with ${pick(FIELDS.map)} }}<{{ .name }}>{{ else }}none{{ end }}`;
    if (depth > 0 && r < 0.4) return `{{ $x := ${expr(2).expr} }}{{ $x }}`;
    return `{{ ${expr(3).expr} }}`;
  };
  const out: string[] = [];
  for (let i = 0; i < count; i++) {
    const lines = 1 + Math.floor(rnd() * 3);
    out.push(Array.from({ length: lines }, () => `echo ${statement(2)}`).join("\n") + "\n");
  }
  return out;
}
