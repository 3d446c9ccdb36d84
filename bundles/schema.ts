// A small typed schema for bundle specs: each schema parses an unknown JSON value into its
// type or throws SpecError naming the field ("spec.users[2].isSudoer: expected a boolean, got
// the string "false""). Types are inferred from the schemas, so the contract is written once.
// Strict on purpose: no coercion ("false" is not false), unknown fields refused, so a bundle
// from a newer or a tampered server is refused with a message instead of half-understood.

export class SpecError extends Error {
  override name = "SpecError";
  readonly permanent = true;
  readonly field: string;
  constructor(field: string, message: string) {
    super(`${field}: ${message}`);
    this.field = field;
  }
}

export interface Schema<T> {
  parse(value: unknown, field: string): T;
  /** Set for optional object members. */
  readonly optional?: boolean;
}

export type Infer<S> = S extends Schema<infer T> ? T : never;

function describe(v: unknown): string {
  if (v === null) return "null";
  if (Array.isArray(v)) return "an array";
  if (typeof v === "string") return `the string ${JSON.stringify(v.length > 40 ? `${v.slice(0, 40)}…` : v)}`;
  if (typeof v === "object") return "an object";
  return `${typeof v} ${String(v)}`;
}

export function str(
  o: { pattern?: RegExp; max?: number; min?: number; oneOf?: readonly string[]; what?: string } = {},
): Schema<string> {
  return {
    parse(v, field) {
      if (typeof v !== "string") throw new SpecError(field, `expected a string, got ${describe(v)}`);
      if (o.min !== undefined && v.length < o.min)
        throw new SpecError(field, `must not be shorter than ${o.min} characters`);
      if (o.max !== undefined && v.length > o.max)
        throw new SpecError(field, `is ${v.length} characters long; at most ${o.max} allowed`);
      if (o.oneOf && !o.oneOf.includes(v))
        throw new SpecError(field, `must be one of ${o.oneOf.join(", ")}, got ${describe(v)}`);
      if (o.pattern && !o.pattern.test(v))
        throw new SpecError(field, `${describe(v)} is not ${o.what ?? `a match for ${o.pattern}`}`);
      if (v.includes("\0")) throw new SpecError(field, "contains a NUL byte");
      return v;
    },
  };
}

export function oneOf<const T extends readonly string[]>(values: T): Schema<T[number]> {
  return str({ oneOf: values }) as Schema<T[number]>;
}

export function int(o: { min?: number; max?: number } = {}): Schema<number> {
  return {
    parse(v, field) {
      if (typeof v !== "number" || !Number.isInteger(v))
        throw new SpecError(field, `expected a whole number, got ${describe(v)}`);
      if (o.min !== undefined && v < o.min) throw new SpecError(field, `${v} is below the minimum ${o.min}`);
      if (o.max !== undefined && v > o.max) throw new SpecError(field, `${v} is above the maximum ${o.max}`);
      return v;
    },
  };
}

export function num(o: { min?: number; max?: number } = {}): Schema<number> {
  return {
    parse(v, field) {
      if (typeof v !== "number" || !Number.isFinite(v))
        throw new SpecError(field, `expected a number, got ${describe(v)}`);
      if (o.min !== undefined && v < o.min) throw new SpecError(field, `${v} is below the minimum ${o.min}`);
      if (o.max !== undefined && v > o.max) throw new SpecError(field, `${v} is above the maximum ${o.max}`);
      return v;
    },
  };
}

export function bool(): Schema<boolean> {
  return {
    parse(v, field) {
      if (typeof v !== "boolean") throw new SpecError(field, `expected a boolean, got ${describe(v)}`);
      return v;
    },
  };
}

export function arr<T>(of: Schema<T>, o: { max?: number; unique?: (t: T) => string } = {}): Schema<T[]> {
  return {
    parse(v, field) {
      if (!Array.isArray(v)) throw new SpecError(field, `expected an array, got ${describe(v)}`);
      if (o.max !== undefined && v.length > o.max)
        throw new SpecError(field, `has ${v.length} items; at most ${o.max} allowed`);
      const out = v.map((item, i) => of.parse(item, `${field}[${i}]`));
      if (o.unique) {
        const seen = new Set<string>();
        for (const [i, item] of out.entries()) {
          const k = o.unique(item);
          if (seen.has(k)) throw new SpecError(`${field}[${i}]`, `'${k}' is listed twice`);
          seen.add(k);
        }
      }
      return out;
    },
  };
}

export function record<T>(of: Schema<T>, o: { key?: RegExp } = {}): Schema<Record<string, T>> {
  return {
    parse(v, field) {
      if (typeof v !== "object" || v === null || Array.isArray(v))
        throw new SpecError(field, `expected an object, got ${describe(v)}`);
      const out: Record<string, T> = {};
      for (const [k, item] of Object.entries(v)) {
        if (o.key && !o.key.test(k)) throw new SpecError(`${field}.${k}`, "is not an allowed key");
        out[k] = of.parse(item, `${field}.${k}`);
      }
      return out;
    },
  };
}

/** An optional object member: absent (undefined) is allowed, null is not. */
export function opt<T>(s: Schema<T>): Schema<T | undefined> & { optional: true } {
  return {
    optional: true,
    parse(v, field) {
      return v === undefined ? undefined : s.parse(v, field);
    },
  };
}

type Shape = Record<string, Schema<unknown>>;
type OptionalKeys<S extends Shape> = { [K in keyof S]: S[K] extends { optional: true } ? K : never }[keyof S];
type RequiredKeys<S extends Shape> = Exclude<keyof S, OptionalKeys<S>>;
export type InferShape<S extends Shape> = { [K in RequiredKeys<S>]: Infer<S[K]> } & {
  [K in OptionalKeys<S>]?: Infer<S[K]>;
};

export function obj<S extends Shape>(shape: S): Schema<{ [K in keyof InferShape<S>]: InferShape<S>[K] }> {
  return {
    parse(v, field) {
      if (typeof v !== "object" || v === null || Array.isArray(v))
        throw new SpecError(field, `expected an object, got ${describe(v)}`);
      const input = v as Record<string, unknown>;
      for (const k of Object.keys(input)) {
        if (!(k in shape)) throw new SpecError(`${field}.${k}`, "is not a known field");
      }
      const out: Record<string, unknown> = {};
      for (const [k, s] of Object.entries(shape)) {
        if (input[k] === undefined && !s.optional) throw new SpecError(`${field}.${k}`, "is missing");
        const parsed = s.parse(input[k], `${field}.${k}`);
        if (parsed !== undefined) out[k] = parsed;
      }
      return out as { [K in keyof InferShape<S>]: InferShape<S>[K] };
    },
  };
}
