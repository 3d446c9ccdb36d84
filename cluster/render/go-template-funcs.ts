// The functions NodeGroupConfiguration templates may call, with Go's and sprig's semantics as
// Deckhouse's renderer (text/template + sprig) has them, and Go's way of printing values. Only
// what Deckhouse's documentation and steps use is here; a template naming anything else is
// refused at parse time (go-template.ts), never rendered with a guess.
import { Document, Scalar, visit } from "yaml";

/** An integer literal written in the template (Go `int`), as opposed to a number from the data (float64). */
export class GoInt {
  readonly value: number;
  constructor(value: number) {
    this.value = value;
  }
}

/** A failure inside a function; go-template.ts adds the line and the construct. */
export class FuncError extends Error {
  override name = "FuncError";
}

export type Value = unknown;

const isMap = (v: Value): v is Record<string, Value> =>
  typeof v === "object" && v !== null && !Array.isArray(v) && !(v instanceof GoInt);
export const isNil = (v: Value): v is null | undefined => v === undefined || v === null;
export const num = (v: Value): number | undefined =>
  v instanceof GoInt ? v.value : typeof v === "number" ? v : undefined;

/** Go's %v for a float64: shortest digits, exponent form below 1e-4 and from 1e6 up (1e+06). */
export function goFloat(n: number): string {
  if (Number.isNaN(n)) return "NaN";
  if (!Number.isFinite(n)) return n > 0 ? "+Inf" : "-Inf";
  if (n === 0) return Object.is(n, -0) ? "-0" : "0";
  const [mant, expStr] = Math.abs(n).toExponential().split("e") as [string, string];
  const exp = Number(expStr);
  if (exp < -4 || exp >= 6) {
    const sign = exp < 0 ? "-" : "+";
    const digits = String(Math.abs(exp)).padStart(2, "0");
    return `${n < 0 ? "-" : ""}${mant}e${sign}${digits}`;
  }
  return String(n);
}

/** How Go's fmt prints a value with %v (what `{{ x }}` writes and sprig's toString returns). */
export function goPrint(v: Value): string {
  if (v === undefined || v === null) return "<nil>";
  if (typeof v === "string") return v;
  if (typeof v === "boolean") return v ? "true" : "false";
  if (v instanceof GoInt) return String(v.value);
  if (typeof v === "number") return goFloat(v);
  if (Array.isArray(v)) return `[${v.map(goPrint).join(" ")}]`;
  if (isMap(v)) {
    const keys = Object.keys(v).sort();
    return `map[${keys.map((k) => `${k}:${goPrint(v[k])}`).join(" ")}]`;
  }
  return String(v);
}

/** Go's truth: false, 0, nil and empty strings, lists and maps are false. */
export function truth(v: Value): boolean {
  if (isNil(v)) return false;
  if (typeof v === "boolean") return v;
  if (typeof v === "string") return v.length > 0;
  if (Array.isArray(v)) return v.length > 0;
  const n = num(v);
  if (n !== undefined) return n !== 0;
  if (isMap(v)) return Object.keys(v).length > 0;
  return true;
}

/** Go's strconv.Quote: double quotes, backslash escapes for quotes, controls and invalid text. */
export function goQuote(s: string): string {
  let out = '"';
  for (const ch of s) {
    const c = ch.codePointAt(0)!;
    if (ch === '"') out += '\\"';
    else if (ch === "\\") out += "\\\\";
    else if (ch === "\n") out += "\\n";
    else if (ch === "\t") out += "\\t";
    else if (ch === "\r") out += "\\r";
    else if (c === 7) out += "\\a";
    else if (c === 8) out += "\\b";
    else if (c === 12) out += "\\f";
    else if (c === 11) out += "\\v";
    else if (c < 0x20 || c === 0x7f) out += `\\x${c.toString(16).padStart(2, "0")}`;
    else if (c >= 0xd800 && c <= 0xdfff) out += "\\ufffd";
    else if ((c >= 0x80 && c < 0xa0) || c === 0xad || c === 0xfeff) out += `\\u${c.toString(16).padStart(4, "0")}`;
    else out += ch;
  }
  return `${out}"`;
}

function strval(v: Value): string {
  return goPrint(v);
}

function strslice(v: Value): string[] {
  if (Array.isArray(v)) return v.filter((x) => !isNil(x)).map(strval);
  if (isNil(v)) return [];
  return [strval(v)];
}

/** sprig's empty: nil, false, 0, "" and empty lists and maps. */
function empty(v: Value): boolean {
  return !truth(v);
}

function kindName(v: Value): string {
  if (isNil(v)) return "nil";
  if (typeof v === "string") return "string";
  if (typeof v === "boolean") return "bool";
  if (v instanceof GoInt) return "int";
  if (typeof v === "number") return "float64";
  if (Array.isArray(v)) return "list";
  if (isMap(v)) return "map";
  return typeof v;
}

function wantString(fn: string, v: Value): string {
  if (typeof v !== "string") throw new FuncError(`${fn}: expected a string, got ${kindName(v)}`);
  return v;
}

function wantInt(fn: string, v: Value): number {
  const n = num(v);
  if (n === undefined || !Number.isInteger(n)) throw new FuncError(`${fn}: expected an integer, got ${kindName(v)}`);
  return n;
}

type BasicKind = "bool" | "number" | "string" | "nil" | "other";
const basicKind = (v: Value): BasicKind => {
  if (isNil(v)) return "nil";
  if (typeof v === "boolean") return "bool";
  if (typeof v === "string") return "string";
  if (num(v) !== undefined) return "number";
  return "other";
};

// Numbers are one kind here: Deckhouse's data holds float64 and a literal `110` is an int, which
// Go refuses to compare; comparing by value is what the template's author meant.
function eq(a: Value, ...rest: Value[]): boolean {
  if (!rest.length) throw new FuncError("eq: missing argument for comparison");
  const ka = basicKind(a);
  for (const b of rest) {
    const kb = basicKind(b);
    if (ka === "other" || kb === "other") {
      throw new FuncError(`eq: cannot compare ${kindName(a)} with ${kindName(b)} (only strings, numbers and bools)`);
    }
    if (ka !== kb) {
      if (ka !== "nil" && kb !== "nil") {
        throw new FuncError(`eq: incompatible types for comparison: ${kindName(a)} and ${kindName(b)}`);
      }
      continue;
    }
    if (ka === "nil" || (ka === "number" ? num(a) === num(b) : a === b)) return true;
  }
  return false;
}

function compare(fn: string, a: Value, b: Value): number {
  const ka = basicKind(a);
  const kb = basicKind(b);
  if (ka !== kb || (ka !== "number" && ka !== "string")) {
    throw new FuncError(`${fn}: incompatible types for comparison: ${kindName(a)} and ${kindName(b)}`);
  }
  const x = ka === "number" ? num(a)! : (a as string);
  const y = kb === "number" ? num(b)! : (b as string);
  return x < y ? -1 : x > y ? 1 : 0;
}

function goLen(v: Value): GoInt {
  if (typeof v === "string") return new GoInt(Buffer.byteLength(v, "utf8"));
  if (Array.isArray(v)) return new GoInt(v.length);
  if (isMap(v)) return new GoInt(Object.keys(v).length);
  throw new FuncError(`len of ${kindName(v)}`);
}

function index(v: Value, ...keys: Value[]): Value {
  let cur = v;
  for (const k of keys) {
    if (isNil(cur)) throw new FuncError("index of untyped nil");
    if (Array.isArray(cur)) {
      const i = num(k);
      if (i === undefined || !Number.isInteger(i)) throw new FuncError(`cannot index list with ${kindName(k)}`);
      if (i < 0 || i >= cur.length) throw new FuncError(`index out of range: ${i}`);
      cur = cur[i];
    } else if (isMap(cur)) {
      if (typeof k !== "string") throw new FuncError(`cannot index map with ${kindName(k)}`);
      cur = Object.hasOwn(cur, k) ? cur[k] : undefined;
    } else if (typeof cur === "string") {
      throw new FuncError("index of a string is not supported here");
    } else {
      throw new FuncError(`can't index item of type ${kindName(cur)}`);
    }
  }
  return cur;
}

/** Go's fmt.Sprint: a space between operands when neither side is a string. */
function sprint(args: Value[]): string {
  let out = "";
  args.forEach((a, i) => {
    if (i > 0 && typeof a !== "string" && typeof args[i - 1] !== "string") out += " ";
    out += goPrint(a);
  });
  return out;
}

function printf(format: string, args: Value[]): string {
  let i = 0;
  return format.replace(/%([-+# 0]*\d*(?:\.\d+)?)?([a-zA-Z%])/g, (whole, flags: string | undefined, verb: string) => {
    if (verb === "%") return "%";
    if (flags) throw new FuncError(`printf: '${whole}' is not supported (use %s, %d, %v or %q without flags)`);
    if (i >= args.length) return `%!${verb}(MISSING)`;
    const a = args[i++];
    switch (verb) {
      case "s":
      case "v":
        return goPrint(a);
      case "q":
        return goQuote(strval(a));
      case "d": {
        const n = num(a);
        if (n === undefined || !Number.isInteger(n)) throw new FuncError(`printf: %d of ${kindName(a)}`);
        return String(n);
      }
      default:
        throw new FuncError(`printf: verb %${verb} is not supported (use %s, %d, %v or %q)`);
    }
  });
}

/** JSON as Go's encoding/json writes it: map keys sorted, <, > and & escaped. */
function goJson(v: Value): string {
  const norm = (x: Value): Value => {
    if (x instanceof GoInt) return x.value;
    if (Array.isArray(x)) return x.map(norm);
    if (isMap(x)) {
      const out: Record<string, Value> = {};
      for (const k of Object.keys(x).sort()) out[k] = norm(x[k]);
      return out;
    }
    return x === undefined ? null : x;
  };
  return JSON.stringify(norm(v))
    .replace(/</g, "\\u003c")
    .replace(/>/g, "\\u003e")
    .replace(/&/g, "\\u0026")
    .replace(/\u2028/g, "\\u2028")
    .replace(/\u2029/g, "\\u2029");
}

// go-yaml (v2, under sigs.k8s.io/yaml) double-quotes a string that YAML 1.1 would read back as
// something else: bools (yes, off, y, …), nulls, numbers, timestamps, the empty string.
const YAML11_OTHER = [
  /^(y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$/,
  /^(|~|null|Null|NULL)$/,
  /^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$/,
  /^[-+]?(0b[01_]+|0x[0-9a-fA-F_]+|0o?[0-7_]+|[0-9][0-9_]*)$/,
  /^[-+]?(\.[0-9]+|[0-9][0-9_]*(\.[0-9_]*)?)([eE][-+]?[0-9]+)?$/,
  /^[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?$/,
  /^\d{4}-\d\d?-\d\d?([Tt ].*)?$/,
  /\t/,
];

/** YAML in the shape sigs.k8s.io/yaml writes it: sorted keys, lists not indented under their key. */
function goYaml(v: Value): string {
  const doc = new Document(JSON.parse(goJson(v === undefined ? null : v)), { sortMapEntries: true });
  visit(doc, {
    Scalar(_key, node) {
      if (typeof node.value === "string" && YAML11_OTHER.some((re) => re.test(node.value as string))) {
        node.type = Scalar.QUOTE_DOUBLE;
      }
    },
  });
  const text = doc.toString({ indentSeq: false, lineWidth: 0, singleQuote: true }).replace(/\n$/, "");
  // A multi-line string on its own: go-yaml indents the block scalar's lines.
  if (typeof v === "string" && /^[|>]/.test(text)) return text.replace(/\n/g, "\n  ");
  return text;
}

function b64dec(s: string): string {
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(s) || s.length % 4 !== 0) throw new FuncError("b64dec: input is not base64");
  return Buffer.from(s, "base64").toString("utf8");
}

function dict(args: Value[]): Record<string, Value> {
  const out: Record<string, Value> = {};
  for (let i = 0; i < args.length; i += 2) out[strval(args[i])] = i + 1 < args.length ? args[i + 1] : "";
  return out;
}

function list(v: Value, fn: string): Value[] {
  if (Array.isArray(v)) return v;
  if (isNil(v)) return [];
  throw new FuncError(`${fn}: expected a list, got ${kindName(v)}`);
}

// Semantic versions as Masterminds/semver compares them, for `semverCompare`: one or more
// comparisons joined by `,`/space (all must hold) or `||` (any group may hold).
function parseVersion(s: string, fn: string): [number, number, number] {
  const m = /^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:[-+].*)?$/.exec(s.trim());
  if (!m) throw new FuncError(`${fn}: '${s}' is not a version`);
  return [Number(m[1]), Number(m[2] ?? 0), Number(m[3] ?? 0)];
}
const cmpVersion = (a: number[], b: number[]) => {
  for (let i = 0; i < 3; i++) if (a[i] !== b[i]) return a[i]! < b[i]! ? -1 : 1;
  return 0;
};
function semverCompare(constraint: string, version: string): boolean {
  const v = parseVersion(version, "semverCompare");
  return constraint.split("||").some((group) => {
    const parts = group
      .trim()
      .split(/\s*,\s*|\s+(?=[<>=!~^])/)
      .filter(Boolean);
    if (!parts.length) throw new FuncError(`semverCompare: empty constraint '${constraint}'`);
    return parts.every((p) => {
      const m = /^(>=|<=|!=|=>|=<|>|<|=|~|\^)?\s*(.+)$/.exec(p.trim())!;
      const op = m[1] ?? "=";
      const text = m[2]!;
      if (/[xX*]/.test(text)) throw new FuncError(`semverCompare: wildcards ('${p}') are not supported`);
      const c = parseVersion(text, "semverCompare");
      const given = text.replace(/^v/, "").split(/[-+]/)[0]!.split(".").length;
      const r = cmpVersion(v, c);
      switch (op) {
        case "=":
          return given === 3 ? r === 0 : v[0] === c[0] && (given === 1 || v[1] === c[1]);
        case "!=":
          return r !== 0;
        case ">":
          return r > 0;
        case "<":
          return r < 0;
        case ">=":
        case "=>":
          return r >= 0;
        case "<=":
        case "=<":
          return r <= 0;
        case "~": {
          const upper = given === 1 ? [c[0] + 1, 0, 0] : [c[0], c[1] + 1, 0];
          return r >= 0 && cmpVersion(v, upper) < 0;
        }
        default: {
          const upper = c[0] > 0 ? [c[0] + 1, 0, 0] : c[1] > 0 ? [0, c[1] + 1, 0] : [0, 0, c[2] + 1];
          return r >= 0 && cmpVersion(v, upper) < 0;
        }
      }
    });
  });
}

export type Func = (...args: Value[]) => Value;

/** Every function a template may call. `and`/`or` are evaluated lazily by the executor. */
export const FUNCS: Readonly<Record<string, Func>> = {
  // text/template builtins
  not: (v) => !truth(v),
  eq,
  ne: (a, b) => !eq(a, b),
  lt: (a, b) => compare("lt", a, b) < 0,
  le: (a, b) => compare("le", a, b) <= 0,
  gt: (a, b) => compare("gt", a, b) > 0,
  ge: (a, b) => compare("ge", a, b) >= 0,
  len: goLen,
  index,
  print: (...a) => sprint(a),
  println: (...a) => `${a.map(goPrint).join(" ")}\n`,
  printf: (f, ...a) => printf(wantString("printf", f), a),
  // sprig
  quote: (...a) =>
    a
      .filter((x) => !isNil(x))
      .map((x) => goQuote(strval(x)))
      .join(" "),
  squote: (...a) =>
    a
      .filter((x) => !isNil(x))
      .map((x) => `'${strval(x)}'`)
      .join(" "),
  default: (d, ...given) => (given.length === 0 || empty(given[0]) ? d : given[0]),
  empty,
  coalesce: (...a) => a.find((x) => !empty(x)) ?? null,
  ternary: (a, b, cond) => (cond === true ? a : b),
  required: (msg, v) => {
    if (isNil(v) || v === "") throw new FuncError(strval(msg));
    return v;
  },
  toString: (v: Value) => strval(v),
  toYaml: goYaml,
  toJson: goJson,
  b64enc: (v) => Buffer.from(strval(v), "utf8").toString("base64"),
  b64dec: (v) => b64dec(wantString("b64dec", v)),
  join: (sep, v) => strslice(v).join(strval(sep)),
  splitList: (sep, s) => wantString("splitList", s).split(wantString("splitList", sep)),
  upper: (s) => wantString("upper", s).toUpperCase(),
  lower: (s) => wantString("lower", s).toLowerCase(),
  trim: (s) => wantString("trim", s).trim(),
  trimSuffix: (suf, s) => {
    const str = wantString("trimSuffix", s);
    const x = wantString("trimSuffix", suf);
    return x && str.endsWith(x) ? str.slice(0, -x.length) : str;
  },
  trimPrefix: (pre, s) => {
    const str = wantString("trimPrefix", s);
    const x = wantString("trimPrefix", pre);
    return str.startsWith(x) ? str.slice(x.length) : str;
  },
  replace: (old, neu, s) => wantString("replace", s).split(wantString("replace", old)).join(wantString("replace", neu)),
  contains: (sub, s) => wantString("contains", s).includes(wantString("contains", sub)),
  hasPrefix: (pre, s) => wantString("hasPrefix", s).startsWith(wantString("hasPrefix", pre)),
  hasSuffix: (suf, s) => wantString("hasSuffix", s).endsWith(wantString("hasSuffix", suf)),
  indent: (n, s) => {
    const pad = " ".repeat(wantInt("indent", n));
    return pad + wantString("indent", s).split("\n").join(`\n${pad}`);
  },
  nindent: (n, s) => {
    const pad = " ".repeat(wantInt("nindent", n));
    return `\n${pad}${wantString("nindent", s).split("\n").join(`\n${pad}`)}`;
  },
  list: (...a) => a,
  dict: (...a) => dict(a),
  get: (d, k) => {
    if (!isMap(d)) throw new FuncError(`get: expected a map, got ${kindName(d)}`);
    const key = wantString("get", k);
    return Object.hasOwn(d, key) ? d[key] : "";
  },
  hasKey: (d, k) => {
    if (!isMap(d)) throw new FuncError(`hasKey: expected a map, got ${kindName(d)}`);
    return Object.hasOwn(d, wantString("hasKey", k));
  },
  has: (needle, hay) => list(hay, "has").some((x) => basicKind(x) === basicKind(needle) && eq(x, needle)),
  first: (l) => list(l, "first")[0] ?? null,
  last: (l) => {
    const a = list(l, "last");
    return a.length ? a[a.length - 1] : null;
  },
  keys: (...ds) => ds.flatMap((d) => (isMap(d) ? Object.keys(d) : [])).sort(),
  sortAlpha: (l) => strslice(list(l, "sortAlpha")).sort(),
  semverCompare: (c, v) => semverCompare(wantString("semverCompare", c), wantString("semverCompare", v)),
};

/** Functions that exist in Go or sprig but are refused here, with the reason given to the user. */
export const REFUSED_FUNCS: Readonly<Record<string, string>> = {
  include: "named templates are not supported",
  tpl: "rendering strings as templates is not supported",
  template: "named templates are not supported",
  lookup: "reading cluster objects from a template is not supported",
  env: "reading the server's environment is not allowed",
  expandenv: "reading the server's environment is not allowed",
  call: "calling function values is not supported",
  html: "HTML escaping is not supported in shell scripts",
  js: "JavaScript escaping is not supported in shell scripts",
  urlquery: "URL escaping is not supported",
  slice: "'slice' is not supported",
  fail: "'fail' is not supported; use 'required'",
};
