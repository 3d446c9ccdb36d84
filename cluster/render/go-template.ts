// Go text/template, the part Deckhouse's NodeGroupConfiguration scripts use: actions with
// field access, variables, pipes and parenthesised pipelines; if / else if / else, range (with
// `$i, $v :=`, else, break, continue), with / else with; comments; `{{-` and `-}}` trimming; and
// the functions in go-template-funcs.ts. Everything else (define, template, block, unknown
// functions, method calls, character constants, …) is refused with the line and the construct,
// before any output exists, so a script is never rendered differently from what its author
// meant. Two deliberate differences from Go: printing a missing or nil value is an error here
// (Go writes "<no value>" into the script), and numbers compare by value whatever their type.
import { FuncError, FUNCS, GoInt, goPrint, isNil, REFUSED_FUNCS, truth, type Value } from "./go-template-funcs.ts";

export class TemplateError extends Error {
  override name = "TemplateError";
  readonly line: number;
  /** The action as written, e.g. `{{ template "x" }}` (empty for errors outside actions). */
  readonly construct: string;
  readonly reason: string;
  constructor(line: number, construct: string, reason: string) {
    super(`line ${line}: ${construct ? `${construct}: ` : ""}${reason}`);
    this.line = line;
    this.construct = construct;
    this.reason = reason;
  }
}

// ---- tokens -------------------------------------------------------------------------------

type TokType =
  | "field"
  | "dot"
  | "var"
  | "ident"
  | "string"
  | "number"
  | "bool"
  | "nil"
  | "lparen"
  | "rparen"
  | "pipe"
  | "comma"
  | "declare"
  | "assign";

interface Tok {
  type: TokType;
  text: string;
  value?: Value;
  /** Whitespace separates it from the previous token (operands need it). */
  space: boolean;
}

type Item = { k: "text"; s: string } | { k: "action"; toks: Tok[]; line: number; src: string };

const isSpace = (c: string | undefined) => c === " " || c === "\t" || c === "\r" || c === "\n";
// ASCII first: these run for every character of every action.
const isIdentStart = (c: string | undefined) =>
  c !== undefined &&
  ((c >= "a" && c <= "z") || (c >= "A" && c <= "Z") || c === "_" || (c > "\x7f" && /\p{L}/u.test(c)));
const isIdentChar = (c: string | undefined) =>
  c !== undefined && (isIdentStart(c) || (c >= "0" && c <= "9") || (c > "\x7f" && /\p{N}/u.test(c)));
const KEYWORDS = new Set(["if", "else", "end", "range", "with", "define", "template", "block", "break", "continue"]);

function shown(src: string): string {
  const one = src.replace(/\s+/g, " ");
  return one.length > 80 ? `${one.slice(0, 77)}...}}` : one;
}

class Lexer {
  private readonly src: string;
  private readonly lineStarts: number[] = [0];

  constructor(src: string) {
    this.src = src;
    for (let i = 0; i < src.length; i++) if (src[i] === "\n") this.lineStarts.push(i + 1);
  }

  lineAt(pos: number): number {
    let lo = 0;
    let hi = this.lineStarts.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (this.lineStarts[mid]! <= pos) lo = mid;
      else hi = mid - 1;
    }
    return lo + 1;
  }

  items(): Item[] {
    const src = this.src;
    const items: Item[] = [];
    let pos = 0;
    let trimNext = false;
    const pushText = (s: string) => {
      const text = trimNext ? s.replace(/^[ \t\r\n]+/, "") : s;
      trimNext = false;
      if (text) items.push({ k: "text", s: text });
    };
    for (;;) {
      const open = src.indexOf("{{", pos);
      if (open < 0) {
        pushText(src.slice(pos));
        return items;
      }
      let text = src.slice(pos, open);
      let j = open + 2;
      if (src[j] === "-" && isSpace(src[j + 1])) {
        text = text.replace(/[ \t\r\n]+$/, "");
        j += 2;
      }
      pushText(text);
      const line = this.lineAt(open);
      if (src.startsWith("/*", j)) {
        const close = src.indexOf("*/", j + 2);
        if (close < 0) throw new TemplateError(line, "{{/*", "unclosed comment");
        let k = close + 2;
        if (isSpace(src[k]) && src.startsWith("-}}", k + 1)) {
          trimNext = true;
          k += 4;
        } else if (src.startsWith("}}", k)) k += 2;
        else throw new TemplateError(line, shown(src.slice(open, k + 2)), "comment ends before closing delimiter");
        pos = k;
        continue;
      }
      const { toks, end, trimRight } = this.action(j, open, line);
      items.push({ k: "action", toks, line, src: src.slice(open, end) });
      trimNext = trimRight;
      pos = end;
    }
  }

  private action(start: number, open: number, line: number): { toks: Tok[]; end: number; trimRight: boolean } {
    const src = this.src;
    const toks: Tok[] = [];
    let i = start;
    const fail = (reason: string, upto = i + 1): never => {
      const close = src.indexOf("}}", upto);
      throw new TemplateError(this.lineAt(i), shown(src.slice(open, close < 0 ? upto : close + 2)), reason);
    };
    for (;;) {
      let space = i === start ? isSpace(src[i - 1]) : false;
      while (isSpace(src[i])) {
        space = true;
        i++;
      }
      if (i >= src.length) throw new TemplateError(line, shown(src.slice(open, open + 40)), "unclosed action");
      if (space && src.startsWith("-}}", i)) return { toks, end: i + 3, trimRight: true };
      if (src.startsWith("}}", i)) return { toks, end: i + 2, trimRight: false };
      const c = src[i]!;
      const push = (type: TokType, text: string, value?: Value) => toks.push({ type, text, value, space });
      if (c === '"') {
        let j = i + 1;
        let out = "";
        for (;;) {
          const ch = src[j];
          if (ch === undefined || ch === "\n") fail("unterminated quoted string");
          if (ch === '"') break;
          if (ch === "\\") {
            const e = src[j + 1];
            const simple: Record<string, string> = {
              n: "\n",
              t: "\t",
              r: "\r",
              a: "\x07",
              b: "\b",
              f: "\f",
              v: "\v",
              "\\": "\\",
              '"': '"',
            };
            if (e !== undefined && simple[e] !== undefined) {
              out += simple[e];
              j += 2;
            } else if (e === "x" && /^[0-9a-fA-F]{2}$/.test(src.slice(j + 2, j + 4))) {
              out += String.fromCharCode(Number.parseInt(src.slice(j + 2, j + 4), 16));
              j += 4;
            } else if (e === "u" && /^[0-9a-fA-F]{4}$/.test(src.slice(j + 2, j + 6))) {
              out += String.fromCodePoint(Number.parseInt(src.slice(j + 2, j + 6), 16));
              j += 6;
            } else if (e === "U" && /^[0-9a-fA-F]{8}$/.test(src.slice(j + 2, j + 10))) {
              out += String.fromCodePoint(Number.parseInt(src.slice(j + 2, j + 10), 16));
              j += 10;
            } else if (e !== undefined && /^[0-7]{3}$/.test(src.slice(j + 1, j + 4))) {
              out += String.fromCharCode(Number.parseInt(src.slice(j + 1, j + 4), 8));
              j += 4;
            } else fail(`invalid escape '\\${e ?? ""}' in quoted string`);
          } else {
            out += ch;
            j++;
          }
        }
        push("string", src.slice(i, j + 1), out);
        i = j + 1;
      } else if (c === "`") {
        const close = src.indexOf("`", i + 1);
        if (close < 0) fail("unterminated raw string");
        push("string", src.slice(i, close + 1), src.slice(i + 1, close).replace(/\r/g, ""));
        i = close + 1;
      } else if (c === "'") {
        fail("character constants are not supported; use a quoted string");
      } else if (/[0-9]/.test(c) || ((c === "-" || c === "+" || c === ".") && /[0-9]/.test(src[i + 1] ?? ""))) {
        const m = /^[+-]?(?:0[xX][0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)/.exec(
          src.slice(i),
        )!;
        const text = m[0];
        if (isIdentChar(src[i + text.length]) || src[i + text.length] === ".") {
          fail(`'${src.slice(i).split(/[\s})|]/)[0]}' is not a number this renderer supports (decimal or 0x hex)`);
        }
        const isInt = /^[+-]?(0[xX][0-9a-fA-F]+|\d+)$/.test(text);
        const n = /0[xX]/.test(text)
          ? Number.parseInt(text.replace(/0[xX]/, ""), 16) * (text[0] === "-" ? -1 : 1)
          : Number(text);
        push("number", text, isInt ? new GoInt(n) : n);
        i += text.length;
      } else if (c === ".") {
        if (isIdentStart(src[i + 1])) {
          let j = i + 1;
          while (isIdentChar(src[j])) j++;
          push("field", src.slice(i, j));
          i = j;
        } else {
          push("dot", ".");
          i++;
        }
      } else if (c === "$") {
        let j = i + 1;
        while (isIdentChar(src[j])) j++;
        push("var", src.slice(i, j));
        i = j;
      } else if (isIdentStart(c)) {
        let j = i;
        while (isIdentChar(src[j])) j++;
        const word = src.slice(i, j);
        if (word === "true" || word === "false") push("bool", word, word === "true");
        else if (word === "nil") push("nil", word);
        else push("ident", word);
        i = j;
      } else if (c === "(") {
        push("lparen", c);
        i++;
      } else if (c === ")") {
        push("rparen", c);
        i++;
      } else if (c === "|") {
        push("pipe", c);
        i++;
      } else if (c === ",") {
        push("comma", c);
        i++;
      } else if (c === ":" && src[i + 1] === "=") {
        push("declare", ":=");
        i += 2;
      } else if (c === "=") {
        push("assign", "=");
        i++;
      } else {
        fail(`unexpected '${c}' in action`);
      }
    }
  }
}

// ---- syntax tree --------------------------------------------------------------------------

type Arg =
  | { t: "func"; name: string }
  | { t: "field"; chain: string[] }
  | { t: "dot" }
  | { t: "var"; name: string; chain: string[] }
  | { t: "pipe"; pipe: Pipe; chain: string[] }
  | { t: "lit"; value: Value }
  | { t: "nil" };

interface Pipe {
  decl: string[];
  assign: boolean;
  cmds: Arg[][];
}

interface Where {
  line: number;
  /** The action as written (shortened only when an error shows it). */
  src: string;
}

type Node =
  | { t: "text"; s: string }
  | ({ t: "action"; pipe: Pipe } & Where)
  | ({ t: "if" | "with"; branches: { pipe: Pipe; body: Node[]; at: Where }[]; otherwise?: Node[] } & Where)
  | ({ t: "range"; pipe: Pipe; body: Node[]; otherwise?: Node[] } & Where)
  | ({ t: "break" | "continue" } & Where);

type ActionItem = Extract<Item, { k: "action" }>;
const keyword = (item: ActionItem): string => item.toks[0]?.text ?? "";

class Parser {
  private readonly items: Item[];
  private pos = 0;
  /** Variables in scope, innermost last; `$` always exists. */
  private readonly vars: string[] = ["$"];
  private rangeDepth = 0;

  constructor(items: Item[]) {
    this.items = items;
  }

  parse(): Node[] {
    const { nodes, stop } = this.list();
    if (stop) throw new TemplateError(stop.line, shown(stop.src), `unexpected {{${stop.toks[0]!.text}}}`);
    return nodes;
  }

  private refuse(item: ActionItem, reason: string): never {
    throw new TemplateError(item.line, shown(item.src), reason);
  }

  /** Nodes up to an `else` or `end` action (returned as stop) or the end of input. */
  private list(): { nodes: Node[]; stop?: ActionItem } {
    const nodes: Node[] = [];
    while (this.pos < this.items.length) {
      const item = this.items[this.pos++]!;
      if (item.k === "text") {
        nodes.push({ t: "text", s: item.s });
        continue;
      }
      const first = item.toks[0];
      if (!first) this.refuse(item, "empty action");
      const kw = first.type === "ident" && KEYWORDS.has(first.text) ? first.text : "";
      const at = { line: item.line, src: item.src };
      switch (kw) {
        case "else":
        case "end":
          return { nodes, stop: item };
        case "if":
        case "with":
          nodes.push(this.conditional(item, kw));
          break;
        case "range":
          nodes.push(this.range(item));
          break;
        case "break":
        case "continue":
          if (item.toks.length > 1) this.refuse(item, `unexpected arguments to {{${kw}}}`);
          if (!this.rangeDepth) this.refuse(item, `{{${kw}}} outside {{range}}`);
          nodes.push({ t: kw, ...at });
          break;
        case "define":
        case "template":
        case "block":
          this.refuse(
            item,
            `'${kw}' is not supported: named templates cannot be used in NodeGroupConfiguration scripts`,
          );
          break;
        default: {
          const pipe = this.pipeline(item, item.toks, 0, false);
          this.declareVars(pipe);
          nodes.push({ t: "action", pipe, ...at });
        }
      }
    }
    return { nodes };
  }

  private expectEnd(stop: ActionItem | undefined, open: ActionItem, kw: string): ActionItem {
    if (!stop) throw new TemplateError(open.line, shown(open.src), `{{${kw}}} has no matching {{end}}`);
    return stop;
  }

  private conditional(item: ActionItem, kw: "if" | "with"): Node {
    const mark = this.vars.length;
    const branches: { pipe: Pipe; body: Node[]; at: Where }[] = [];
    let head = item;
    let headToks = item.toks.slice(1);
    let otherwise: Node[] | undefined;
    for (;;) {
      const pipe = this.pipeline(head, headToks, 0, false);
      if (!pipe.cmds.length) this.refuse(head, `missing value for {{${kw}}}`);
      this.declareVars(pipe);
      const { nodes, stop } = this.list();
      branches.push({ pipe, body: nodes, at: { line: head.line, src: head.src } });
      const end = this.expectEnd(stop, item, kw);
      this.vars.length = mark;
      if (end.toks[0]!.text === "end") {
        if (end.toks.length > 1) this.refuse(end, "unexpected arguments to {{end}}");
        break;
      }
      // else, else if …, else with …
      const next = end.toks[1];
      if (!next) {
        const rest = this.list();
        const close = this.expectEnd(rest.stop, item, kw);
        if (close.toks[0]!.text !== "end") this.refuse(close, `expected {{end}} after {{else}}`);
        if (close.toks.length > 1) this.refuse(close, "unexpected arguments to {{end}}");
        this.vars.length = mark;
        otherwise = rest.nodes;
        break;
      }
      if (next.type !== "ident" || next.text !== kw) {
        this.refuse(end, `{{else ${next.text} …}} is not allowed here (use {{else ${kw} …}} or {{else}})`);
      }
      head = end;
      headToks = end.toks.slice(2);
    }
    return { t: kw, branches, ...(otherwise ? { otherwise } : {}), line: item.line, src: item.src };
  }

  private range(item: ActionItem): Node {
    const mark = this.vars.length;
    const pipe = this.pipeline(item, item.toks.slice(1), 0, true);
    if (!pipe.cmds.length) this.refuse(item, "missing value for {{range}}");
    if (pipe.assign) this.refuse(item, "{{range $x = …}} is not supported; declare with :=");
    this.declareVars(pipe);
    this.rangeDepth++;
    const { nodes, stop } = this.list();
    this.rangeDepth--;
    let end = this.expectEnd(stop, item, "range");
    this.vars.length = mark;
    let otherwise: Node[] | undefined;
    if (end.toks[0]!.text === "else") {
      if (end.toks.length > 1) this.refuse(end, "{{else …}} with a condition is not allowed in {{range}}");
      const rest = this.list();
      end = this.expectEnd(rest.stop, item, "range");
      if (keyword(end) !== "end") this.refuse(end, "expected {{end}} after {{else}}");
      this.vars.length = mark;
      otherwise = rest.nodes;
    }
    if (end.toks.length > 1) this.refuse(end, "unexpected arguments to {{end}}");
    return {
      t: "range",
      pipe,
      body: nodes,
      ...(otherwise ? { otherwise } : {}),
      line: item.line,
      src: item.src,
    };
  }

  private declareVars(pipe: Pipe): void {
    if (!pipe.assign) this.vars.push(...pipe.decl);
  }

  /** A pipeline from toks[start..] up to the end (or a `)` when nested). */
  private pipeline(item: ActionItem, toks: Tok[], start: number, inRange: boolean): Pipe & { next?: number } {
    let i = start;
    const decl: string[] = [];
    let assign = false;
    const t0 = toks[i];
    const t1 = toks[i + 1];
    if (t0?.type === "var" && (t1?.type === "declare" || t1?.type === "assign")) {
      decl.push(t0.text);
      assign = t1.type === "assign";
      i += 2;
    } else if (t0?.type === "var" && t1?.type === "comma" && toks[i + 2]?.type === "var" && toks[i + 3]) {
      if (!inRange) this.refuse(item, "two variables can be declared only in {{range}}");
      if (toks[i + 3]!.type !== "declare") this.refuse(item, "expected := after the range variables");
      decl.push(t0.text, toks[i + 2]!.text);
      i += 4;
    }
    if (assign && !this.vars.includes(decl[0]!)) this.refuse(item, `undefined variable "${decl[0]}"`);
    const state = { i };
    const cmds = this.commands(item, toks, state, false);
    if (state.i < toks.length) this.refuse(item, `unexpected '${toks[state.i]!.text}'`);
    if (decl.length && !cmds.length) this.refuse(item, "missing value for the declaration");
    return { decl, assign, cmds };
  }

  private commands(item: ActionItem, toks: Tok[], state: { i: number }, nested: boolean): Arg[][] {
    const cmds: Arg[][] = [];
    for (;;) {
      const args: Arg[] = [];
      while (state.i < toks.length) {
        const tok = toks[state.i]!;
        if (tok.type === "pipe" || (nested && tok.type === "rparen")) break;
        if (args.length && !tok.space && tok.type !== "rparen") this.refuse(item, `missing space before '${tok.text}'`);
        args.push(this.operand(item, toks, state));
      }
      const tok = toks[state.i];
      if (!args.length) {
        if (!cmds.length && (!tok || (nested && tok.type === "rparen"))) {
          if (nested) this.refuse(item, "missing value in parentheses");
          return cmds;
        }
        this.refuse(item, "missing command in pipeline");
      }
      const head = args[0]!;
      if (head.t !== "func" && args.length > 1) {
        this.refuse(
          item,
          `'${describe(head)}' is not a function and cannot take arguments (methods are not supported)`,
        );
      }
      if (head.t === "nil") this.refuse(item, "nil is not a command");
      cmds.push(args);
      if (tok?.type === "pipe") {
        state.i++;
        continue;
      }
      return cmds;
    }
  }

  private chain(toks: Tok[], state: { i: number }): string[] {
    const out: string[] = [];
    while (toks[state.i]?.type === "field" && !toks[state.i]!.space) out.push(toks[state.i++]!.text.slice(1));
    return out;
  }

  private operand(item: ActionItem, toks: Tok[], state: { i: number }): Arg {
    const tok = toks[state.i++]!;
    switch (tok.type) {
      case "field":
        return { t: "field", chain: [tok.text.slice(1), ...this.chain(toks, state)] };
      case "dot":
        return { t: "dot" };
      case "var":
        if (!this.vars.includes(tok.text)) this.refuse(item, `undefined variable "${tok.text}"`);
        return { t: "var", name: tok.text, chain: this.chain(toks, state) };
      case "string":
      case "number":
      case "bool":
        return { t: "lit", value: tok.value };
      case "nil":
        return { t: "nil" };
      case "lparen": {
        const cmds = this.commands(item, toks, state, true);
        if (toks[state.i]?.type !== "rparen") this.refuse(item, "unclosed '('");
        state.i++;
        return { t: "pipe", pipe: { decl: [], assign: false, cmds }, chain: this.chain(toks, state) };
      }
      case "ident": {
        const name = tok.text;
        if (KEYWORDS.has(name)) this.refuse(item, `unexpected '${name}' inside an action`);
        if (Object.hasOwn(REFUSED_FUNCS, name)) {
          this.refuse(item, `'${name}' is not supported: ${REFUSED_FUNCS[name]}`);
        }
        if (!Object.hasOwn(FUNCS, name) && name !== "and" && name !== "or") {
          this.refuse(item, `function '${name}' is not supported (see docs/deckhouse-compatibility.md for the list)`);
        }
        if (toks[state.i]?.type === "field" && !toks[state.i]!.space) {
          this.refuse(item, `'${name}${toks[state.i]!.text}': fields of a function name are not supported`);
        }
        return { t: "func", name };
      }
      default:
        return this.refuse(item, `unexpected '${tok.text}'`);
    }
  }
}

function describe(a: Arg): string {
  switch (a.t) {
    case "field":
      return `.${a.chain.join(".")}`;
    case "var":
      return [a.name, ...a.chain].join(".");
    case "dot":
      return ".";
    case "lit":
      return goPrint(a.value);
    case "pipe":
      return "(…)";
    case "nil":
      return "nil";
    default:
      return a.name;
  }
}

// ---- execution ----------------------------------------------------------------------------

class Break {}
class Continue {}

const isPlainMap = (v: Value): v is Record<string, Value> =>
  typeof v === "object" && v !== null && !Array.isArray(v) && !(v instanceof GoInt);

class Exec {
  private readonly out: string[] = [];
  private readonly vars: { name: string; value: Value }[] = [];

  constructor(root: Value) {
    this.vars.push({ name: "$", value: root });
  }

  result(): string {
    return this.out.join("");
  }

  private fail(at: Where, reason: string): never {
    throw new TemplateError(at.line, shown(at.src), reason);
  }

  run(nodes: Node[], dot: Value): void {
    for (const n of nodes) {
      switch (n.t) {
        case "text":
          this.out.push(n.s);
          break;
        case "action": {
          const v = this.pipe(n.pipe, dot, n);
          if (n.pipe.decl.length) break;
          if (v === undefined) this.fail(n, "the value is missing (Go would write '<no value>' into the script)");
          if (v === null) this.fail(n, "the value is nil (Go would write '<nil>' into the script)");
          this.out.push(goPrint(v));
          break;
        }
        case "if":
        case "with": {
          const mark = this.vars.length;
          let done = false;
          for (const b of n.branches) {
            const v = this.pipe(b.pipe, dot, b.at);
            if (truth(v)) {
              this.run(b.body, n.t === "with" ? v : dot);
              done = true;
              this.vars.length = mark;
              break;
            }
            this.vars.length = mark;
          }
          if (!done && n.otherwise) this.run(n.otherwise, dot);
          this.vars.length = mark;
          break;
        }
        case "range":
          this.range(n, dot);
          break;
        case "break":
          throw new Break();
        case "continue":
          throw new Continue();
      }
    }
  }

  private range(n: Extract<Node, { t: "range" }>, dot: Value): void {
    const mark = this.vars.length;
    const v = this.pipe({ ...n.pipe, decl: [] }, dot, n);
    let entries: [Value, Value][];
    if (Array.isArray(v)) entries = v.map((x, i) => [new GoInt(i), x]);
    else if (isPlainMap(v)) {
      entries = Object.keys(v)
        .sort()
        .map((k) => [k, v[k]]);
    } else if (isNil(v)) entries = [];
    else this.fail(n, `range can't iterate over ${goPrint(v)}`);
    if (!entries.length) {
      if (n.otherwise) this.run(n.otherwise, dot);
      this.vars.length = mark;
      return;
    }
    const [first, second] = n.pipe.decl;
    for (const [k, x] of entries) {
      this.vars.length = mark;
      if (second !== undefined) this.vars.push({ name: first!, value: k }, { name: second, value: x });
      else if (first !== undefined) this.vars.push({ name: first, value: x });
      try {
        this.run(n.body, x);
      } catch (e) {
        if (e instanceof Break) break;
        if (!(e instanceof Continue)) throw e;
      }
    }
    this.vars.length = mark;
  }

  private lookupVar(name: string, at: Where): Value {
    for (let i = this.vars.length - 1; i >= 0; i--) if (this.vars[i]!.name === name) return this.vars[i]!.value;
    return this.fail(at, `undefined variable "${name}"`);
  }

  private pipe(p: Pipe, dot: Value, at: Where): Value {
    let value: Value;
    p.cmds.forEach((cmd, i) => {
      value = this.command(cmd, dot, at, i > 0, value);
    });
    if (p.decl.length === 1) {
      const name = p.decl[0]!;
      if (p.assign) {
        for (let i = this.vars.length - 1; i >= 0; i--) {
          if (this.vars[i]!.name === name) {
            this.vars[i]!.value = value;
            return value;
          }
        }
        this.fail(at, `undefined variable "${name}"`);
      }
      this.vars.push({ name, value });
    }
    return value;
  }

  private command(args: Arg[], dot: Value, at: Where, piped: boolean, final: Value): Value {
    const head = args[0]!;
    if (head.t !== "func") {
      if (piped) this.fail(at, `can't give an argument to non-function ${describe(head)}`);
      return this.arg(head, dot, at);
    }
    const rest = args.slice(1);
    if (head.name === "and" || head.name === "or") {
      const thunks = rest.map((a) => () => this.arg(a, dot, at));
      if (piped) thunks.push(() => final);
      if (!thunks.length) this.fail(at, `${head.name}: missing arguments`);
      let v: Value;
      for (const th of thunks) {
        v = th();
        if (head.name === "and" ? !truth(v) : truth(v)) return v;
      }
      return v;
    }
    const values = rest.map((a) => this.arg(a, dot, at));
    if (piped) values.push(final);
    try {
      return FUNCS[head.name]!(...values);
    } catch (e) {
      if (e instanceof FuncError) this.fail(at, e.message);
      throw e;
    }
  }

  private arg(a: Arg, dot: Value, at: Where): Value {
    switch (a.t) {
      case "dot":
        return dot;
      case "lit":
        return a.value;
      case "nil":
        return null;
      case "field":
        return this.fields(dot, a.chain, ".", at);
      case "var":
        return this.fields(this.lookupVar(a.name, at), a.chain, a.name, at);
      case "pipe":
        return this.fields(this.pipe(a.pipe, dot, at), a.chain, "(…)", at);
      case "func":
        return this.command([a], dot, at, false, undefined);
    }
  }

  /** Go's field walk over maps: a missing key gives no value, and so does every field after it. */
  private fields(base: Value, chain: string[], from: string, at: Where): Value {
    let v = base;
    let path = from === "." ? "" : from;
    for (const name of chain) {
      if (v === undefined) return undefined;
      if (v === null) this.fail(at, `${path || "."} is nil, so .${name} cannot be read`);
      if (!isPlainMap(v)) this.fail(at, `can't read field .${name} of ${path || "."} (not a map)`);
      v = Object.hasOwn(v, name) ? v[name] : undefined;
      path += `.${name}`;
    }
    return v;
  }
}

/** Parses a template; throws TemplateError for syntax errors and refused constructs. */
export function parseGoTemplate(text: string): Node[] {
  return new Parser(new Lexer(text).items()).parse();
}

// The same content renders for every group it selects and again on every pass: parse it once.
// Trees are never changed by execution, so sharing them is safe.
const parsed = new Map<string, Node[]>();
const PARSED_MAX = 1000;

function cachedParse(text: string): Node[] {
  let tree = parsed.get(text);
  if (tree) {
    parsed.delete(text);
    parsed.set(text, tree);
    return tree;
  }
  tree = parseGoTemplate(text);
  parsed.set(text, tree);
  if (parsed.size > PARSED_MAX) parsed.delete(parsed.keys().next().value as string);
  return tree;
}

/** Renders `text` against `data` with Go text/template semantics; throws TemplateError. */
export function renderGoTemplate(text: string, data: Value): string {
  const tree = cachedParse(text);
  const exec = new Exec(data);
  exec.run(tree, data);
  return exec.result();
}
