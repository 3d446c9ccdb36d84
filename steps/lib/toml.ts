// TOML for containerd's configuration: a parser and a writer (TOML 1.0: tables, arrays of
// tables, dotted and quoted keys, inline tables, the four string forms, integers in every
// base, floats, booleans, dates kept as written), and the merge Deckhouse's `toml-merge` does
// when it lays /etc/containerd/conf.d/*.toml over its own configuration.
//
// Integers are bigint and floats number, so a value keeps its type through parse, merge and
// write (containerd decodes `pause_threshold = 0.02` into a float and `max_recv_message_size`
// into an integer: writing one as the other would make containerd refuse the file).
// Tables are objects without a prototype, so a key such as "__proto__" is just a key.

export class TomlDateTime {
  readonly raw: string;
  constructor(raw: string) {
    this.raw = raw;
  }
}

export type TomlValue = string | bigint | number | boolean | TomlDateTime | TomlValue[] | TomlTable;
export interface TomlTable {
  [key: string]: TomlValue;
}

export class TomlError extends Error {
  override name = "TomlError";
  readonly permanent = true;
}

export const table = (): TomlTable => Object.create(null) as TomlTable;

export const isTable = (v: unknown): v is TomlTable =>
  typeof v === "object" && v !== null && !Array.isArray(v) && !(v instanceof TomlDateTime);

// ---- parse -----------------------------------------------------------------------------------

const BARE = /[A-Za-z0-9_-]/;
const DATE_TIME =
  /^(\d{4}-\d{2}-\d{2}([Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})?)?|\d{2}:\d{2}:\d{2}(\.\d+)?)$/;
const DEC_INT = /^[+-]?(0|[1-9](_?\d)*)$/;
const FLOAT = /^[+-]?(0|[1-9](_?\d)*)(\.\d(_?\d)*)?([eE][+-]?\d(_?\d)*)?$/;

class Parser {
  private i = 0;
  private line = 1;
  /** Tables given a [header] (or made by one), and inline tables and arrays, which are closed. */
  private readonly defined = new Set<TomlTable>();
  private readonly closed = new Set<unknown>();

  private readonly s: string;
  private readonly name: string;

  constructor(s: string, name: string) {
    this.s = s;
    this.name = name;
  }

  fail(msg: string): never {
    throw new TomlError(`${this.name}: line ${this.line}: ${msg}`);
  }

  private peek(n = 0): string {
    return this.s[this.i + n] ?? "";
  }
  private startsWith(t: string): boolean {
    return this.s.startsWith(t, this.i);
  }
  private next(): string {
    const c = this.s[this.i++] ?? "";
    if (c === "\n") this.line++;
    return c;
  }

  private skipSpace(): void {
    while (this.peek() === " " || this.peek() === "\t") this.i++;
  }
  private skipComment(): void {
    if (this.peek() !== "#") return;
    while (this.i < this.s.length && this.peek() !== "\n") {
      const c = this.peek();
      if (c < " " && c !== "\t" && c !== "\r") this.fail("a control character in a comment");
      this.i++;
    }
  }
  /** Whitespace, comments and newlines (between array items). */
  private skipAll(): void {
    for (;;) {
      this.skipSpace();
      this.skipComment();
      if (this.peek() === "\n") this.next();
      else if (this.startsWith("\r\n")) {
        this.i++;
        this.next();
      } else return;
    }
  }
  private endOfLine(): void {
    this.skipSpace();
    this.skipComment();
    if (this.i >= this.s.length) return;
    if (this.startsWith("\r\n")) this.i++;
    if (this.peek() !== "\n") this.fail(`expected the end of the line, found ${JSON.stringify(this.peek())}`);
    this.next();
  }

  parse(): TomlTable {
    const root = table();
    let current = root;
    for (;;) {
      this.skipAll();
      if (this.i >= this.s.length) return root;
      if (this.startsWith("[[")) {
        this.i += 2;
        const keys = this.key();
        this.skipSpace();
        if (!this.startsWith("]]")) this.fail("expected ]] to end the array-of-tables header");
        this.i += 2;
        current = this.arrayTable(root, keys);
      } else if (this.peek() === "[") {
        this.i++;
        const keys = this.key();
        this.skipSpace();
        if (this.peek() !== "]") this.fail("expected ] to end the table header");
        this.i++;
        current = this.headerTable(root, keys);
      } else {
        this.keyValue(current);
      }
      this.endOfLine();
    }
  }

  private key(): string[] {
    const keys: string[] = [];
    for (;;) {
      this.skipSpace();
      const c = this.peek();
      if (c === '"') keys.push(this.basicString());
      else if (c === "'") keys.push(this.literalString());
      else {
        const start = this.i;
        while (BARE.test(this.peek())) this.i++;
        if (this.i === start) this.fail(`expected a key, found ${JSON.stringify(c || "the end")}`);
        keys.push(this.s.slice(start, this.i));
      }
      this.skipSpace();
      if (this.peek() !== ".") return keys;
      this.i++;
    }
  }

  /** Walks (and makes) the tables of a dotted key below `t`. */
  private descend(t: TomlTable, keys: string[], explicit: boolean): TomlTable {
    let cur = t;
    for (const k of keys) {
      let v = cur[k];
      if (v === undefined) {
        v = table();
        cur[k] = v;
      } else if (Array.isArray(v) && !explicit) {
        if (this.closed.has(v)) this.fail(`key ${k} is an array, not a table`);
        v = v[v.length - 1] as TomlValue;
      }
      if (!isTable(v)) this.fail(`key ${k} is already a value, not a table`);
      if (this.closed.has(v)) this.fail(`key ${k} is an inline table, which cannot be extended`);
      cur = v;
    }
    return cur;
  }

  private headerTable(root: TomlTable, keys: string[]): TomlTable {
    const parent = this.descend(root, keys.slice(0, -1), false);
    const last = keys[keys.length - 1] as string;
    let t = parent[last];
    if (t === undefined) {
      t = table();
      parent[last] = t;
    }
    if (!isTable(t)) this.fail(`[${keys.join(".")}] is already a value, not a table`);
    if (this.defined.has(t) || this.closed.has(t)) this.fail(`[${keys.join(".")}] is defined twice`);
    this.defined.add(t);
    return t;
  }

  private arrayTable(root: TomlTable, keys: string[]): TomlTable {
    const parent = this.descend(root, keys.slice(0, -1), false);
    const last = keys[keys.length - 1] as string;
    let a = parent[last];
    if (a === undefined) {
      a = [];
      parent[last] = a;
    }
    if (!Array.isArray(a) || this.closed.has(a)) this.fail(`[[${keys.join(".")}]] is not an array of tables`);
    const t = table();
    a.push(t);
    this.defined.add(t);
    return t;
  }

  private keyValue(t: TomlTable): void {
    const keys = this.key();
    if (this.peek() !== "=") this.fail(`expected = after the key ${keys.join(".")}`);
    this.i++;
    this.skipSpace();
    const value = this.value();
    const target = this.descend(t, keys.slice(0, -1), false);
    const last = keys[keys.length - 1] as string;
    if (last in target) this.fail(`key ${keys.join(".")} is defined twice`);
    target[last] = value;
  }

  private value(): TomlValue {
    const c = this.peek();
    if (c === '"') return this.startsWith('"""') ? this.multilineBasic() : this.basicString();
    if (c === "'") return this.startsWith("'''") ? this.multilineLiteral() : this.literalString();
    if (c === "[") return this.array();
    if (c === "{") return this.inlineTable();
    if (this.startsWith("true") && !BARE.test(this.peek(4))) {
      this.i += 4;
      return true;
    }
    if (this.startsWith("false") && !BARE.test(this.peek(5))) {
      this.i += 5;
      return false;
    }
    return this.scalar();
  }

  private scalar(): TomlValue {
    const start = this.i;
    while (/[0-9A-Za-z_+\-.:]/.test(this.peek())) this.i++;
    let tok = this.s.slice(start, this.i);
    // A date and a time separated by a space ("1979-05-27 07:32:00Z").
    if (/^\d{4}-\d{2}-\d{2}$/.test(tok) && this.peek() === " " && /\d/.test(this.peek(1))) {
      this.i++;
      while (/[0-9A-Za-z_+\-.:]/.test(this.peek())) this.i++;
      tok = this.s.slice(start, this.i);
    }
    if (!tok) this.fail(`expected a value, found ${JSON.stringify(this.peek() || "the end")}`);
    if (DATE_TIME.test(tok)) return new TomlDateTime(tok);
    if (/^[+-]?inf$/.test(tok)) return tok.startsWith("-") ? Number.NEGATIVE_INFINITY : Number.POSITIVE_INFINITY;
    if (/^[+-]?nan$/.test(tok)) return Number.NaN;
    const based = /^0([xob])([0-9A-Fa-f](_?[0-9A-Fa-f])*)$/.exec(tok);
    if (based) {
      const digits = (based[2] as string).replaceAll("_", "");
      const valid = { x: /^[0-9A-Fa-f]+$/, o: /^[0-7]+$/, b: /^[01]+$/ }[based[1] as "x" | "o" | "b"];
      if (!valid.test(digits)) this.fail(`${tok} is not a valid integer`);
      return BigInt(`0${based[1]}${digits}`);
    }
    if (DEC_INT.test(tok)) return BigInt(tok.replaceAll("_", ""));
    if (FLOAT.test(tok) && /[.eE]/.test(tok)) return Number(tok.replaceAll("_", ""));
    return this.fail(`${JSON.stringify(tok)} is not a TOML value`);
  }

  private array(): TomlValue[] {
    this.i++;
    const out: TomlValue[] = [];
    for (;;) {
      this.skipAll();
      if (this.peek() === "]") break;
      out.push(this.value());
      this.skipAll();
      if (this.peek() === ",") {
        this.i++;
        continue;
      }
      if (this.peek() !== "]") this.fail("expected , or ] in an array");
      break;
    }
    this.i++;
    this.closed.add(out);
    return out;
  }

  private inlineTable(): TomlTable {
    this.i++;
    const t = table();
    this.skipSpace();
    if (this.peek() === "}") {
      this.i++;
      this.closed.add(t);
      return t;
    }
    for (;;) {
      this.skipSpace();
      this.keyValue(t);
      this.skipSpace();
      if (this.peek() === ",") {
        this.i++;
        continue;
      }
      if (this.peek() !== "}") this.fail("expected , or } in an inline table");
      this.i++;
      break;
    }
    this.closeDeep(t);
    return t;
  }

  private closeDeep(t: TomlTable): void {
    this.closed.add(t);
    for (const v of Object.values(t)) if (isTable(v)) this.closeDeep(v);
  }

  private escape(): string {
    const c = this.next();
    const simple: Record<string, string> = { b: "\b", t: "\t", n: "\n", f: "\f", r: "\r", '"': '"', "\\": "\\" };
    if (c in simple) return simple[c] as string;
    if (c === "u" || c === "U") {
      const n = c === "u" ? 4 : 8;
      const hex = this.s.slice(this.i, this.i + n);
      if (!/^[0-9A-Fa-f]+$/.test(hex) || hex.length !== n) this.fail(`bad \\${c} escape`);
      this.i += n;
      const cp = Number.parseInt(hex, 16);
      if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) this.fail(`\\${c}${hex} is not a Unicode scalar value`);
      return String.fromCodePoint(cp);
    }
    return this.fail(`unknown escape \\${c}`);
  }

  private control(c: string): void {
    if ((c < " " && c !== "\t") || c === "\x7f") this.fail("a control character in a string (escape it)");
  }

  private basicString(): string {
    this.i++;
    let out = "";
    for (;;) {
      const c = this.next();
      if (c === "" || c === "\n") this.fail("a string that does not end on its line");
      if (c === '"') return out;
      if (c === "\\") out += this.escape();
      else {
        this.control(c);
        out += c;
      }
    }
  }

  private literalString(): string {
    this.i++;
    const end = this.s.indexOf("'", this.i);
    const nl = this.s.indexOf("\n", this.i);
    if (end < 0 || (nl >= 0 && nl < end)) this.fail("a string that does not end on its line");
    const out = this.s.slice(this.i, end);
    for (const c of out) this.control(c);
    this.i = end + 1;
    return out;
  }

  private multilineBasic(): string {
    this.i += 3;
    if (this.startsWith("\r\n")) this.i++;
    if (this.peek() === "\n") this.next();
    let out = "";
    for (;;) {
      if (this.i >= this.s.length) this.fail('a """ string that never ends');
      if (this.startsWith('"""')) {
        // Up to two quotes may end the content right before the delimiter.
        let q = 3;
        while (this.peek(q) === '"' && q < 5) q++;
        out += '"'.repeat(q - 3);
        this.i += q;
        return out;
      }
      const c = this.next();
      if (c === "\\") {
        // A line-ending backslash eats the newline and the whitespace after it.
        const rest = /^[ \t]*\r?\n/.exec(this.s.slice(this.i));
        if (rest) {
          while (/[ \t\r\n]/.test(this.peek())) this.next();
          continue;
        }
        out += this.escape();
      } else {
        if (c !== "\n" && c !== "\r") this.control(c);
        out += c;
      }
    }
  }

  private multilineLiteral(): string {
    this.i += 3;
    if (this.startsWith("\r\n")) this.i++;
    if (this.peek() === "\n") this.next();
    const end = this.s.indexOf("'''", this.i);
    if (end < 0) this.fail("a ''' string that never ends");
    let q = 3;
    while (this.s[end + q] === "'" && q < 5) q++;
    const out = this.s.slice(this.i, end + q - 3);
    for (const c of out) if (c !== "\n" && c !== "\r") this.control(c);
    for (const c of out) if (c === "\n") this.line++;
    this.i = end + q;
    return out;
  }
}

/** Parses TOML text; `name` (a file) is in every error. */
export function parseToml(text: string, name = "TOML"): TomlTable {
  return new Parser(text.replace(/^\uFEFF/, ""), name).parse();
}

// ---- write -----------------------------------------------------------------------------------

const keyText = (k: string) => (/^[A-Za-z0-9_-]+$/.test(k) ? k : quote(k));

function quote(s: string): string {
  // JSON's escapes are TOML's; DEL is a control character TOML wants escaped too.
  return JSON.stringify(s).replaceAll("\x7f", "\\u007F");
}

function valueText(v: TomlValue): string {
  if (typeof v === "string") return quote(v);
  if (typeof v === "bigint") return v.toString();
  if (typeof v === "boolean") return String(v);
  if (typeof v === "number") {
    if (Number.isNaN(v)) return "nan";
    if (!Number.isFinite(v)) return v > 0 ? "inf" : "-inf";
    return Number.isInteger(v) && Math.abs(v) < 1e21 ? `${v}.0` : String(v);
  }
  if (v instanceof TomlDateTime) return v.raw;
  if (Array.isArray(v)) return `[${v.map(valueText).join(", ")}]`;
  const entries = Object.entries(v).map(([k, x]) => `${keyText(k)} = ${valueText(x)}`);
  return entries.length ? `{ ${entries.join(", ")} }` : "{}";
}

const isTableArray = (v: TomlValue): v is TomlTable[] => Array.isArray(v) && v.length > 0 && v.every(isTable);

/**
 * TOML text for `root`: each table's values first, then its tables (indented two spaces per
 * level, as containerd's own examples are), keys in the order they were added.
 */
export function stringifyToml(root: TomlTable): string {
  const out: string[] = [];
  const emit = (t: TomlTable, path: string[]) => {
    const pad = "  ".repeat(path.length);
    for (const [k, v] of Object.entries(t)) {
      if (!isTable(v) && !isTableArray(v)) out.push(`${pad}${keyText(k)} = ${valueText(v)}`);
    }
    for (const [k, v] of Object.entries(t)) {
      const p = [...path, keyText(k)];
      if (isTable(v)) {
        out.push(`${pad}[${p.join(".")}]`);
        emit(v, p);
      } else if (isTableArray(v)) {
        for (const item of v) {
          out.push(`${pad}[[${p.join(".")}]]`);
          emit(item, p);
        }
      }
    }
  };
  emit(root, []);
  return `${out.join("\n")}\n`;
}

// ---- merge -----------------------------------------------------------------------------------

function kindOf(v: TomlValue): string {
  if (typeof v === "bigint") return "an integer";
  if (typeof v === "number") return "a float";
  if (typeof v === "string") return "a string";
  if (typeof v === "boolean") return "a boolean";
  if (v instanceof TomlDateTime) return "a date";
  if (Array.isArray(v)) return "an array";
  return "a table";
}

function clone(v: TomlValue): TomlValue {
  if (Array.isArray(v)) return v.map(clone);
  if (isTable(v)) {
    const t = table();
    for (const [k, x] of Object.entries(v)) t[k] = clone(x);
    return t;
  }
  return v;
}

const isZero = (v: TomlValue) => v === "" || v === 0n || v === 0;

/**
 * Lays `over` onto `base` (changed in place) as Deckhouse's toml-merge does it (Talos's config
 * merge over the decoded maps): tables merge key by key; arrays are concatenated, base first
 * (an empty array changes nothing); other values replace the base's, except an empty string or
 * a zero, which leave it (false does replace true); a key whose value has another type in each
 * is an error naming the key.
 */
export function mergeToml(base: TomlTable, over: TomlTable, where = ""): void {
  for (const [k, v] of Object.entries(over)) {
    const path = where ? `${where}.${keyText(k)}` : keyText(k);
    const had = base[k];
    if (had === undefined) {
      base[k] = clone(v);
      continue;
    }
    if (kindOf(had) !== kindOf(v)) {
      throw new TomlError(`${path} is ${kindOf(had)} in the configuration and ${kindOf(v)} in the fragment`);
    }
    if (isTable(had) && isTable(v)) mergeToml(had, v, path);
    else if (Array.isArray(had) && Array.isArray(v)) {
      if (v.length) base[k] = [...had.map(clone), ...v.map(clone)];
    } else if (!isZero(v)) base[k] = clone(v);
  }
}

/** The value at a dotted path of tables, or undefined. */
export function lookup(t: TomlTable, path: string[]): TomlValue | undefined {
  let cur: TomlValue | undefined = t;
  for (const k of path) {
    if (!isTable(cur)) return undefined;
    cur = cur[k];
  }
  return cur;
}
