// Kubernetes resource quantities ("128Mi", "1.5G", "1e9", "500m") as plain numbers.

const SUFFIX: Record<string, number> = {
  "": 1,
  n: 1e-9,
  u: 1e-6,
  m: 1e-3,
  k: 1e3,
  M: 1e6,
  G: 1e9,
  T: 1e12,
  P: 1e15,
  E: 1e18,
  Ki: 2 ** 10,
  Mi: 2 ** 20,
  Gi: 2 ** 30,
  Ti: 2 ** 40,
  Pi: 2 ** 50,
  Ei: 2 ** 60,
};

const QUANTITY = /^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$/;

/** The quantity's value (bytes for memory); NaN when the string is not a quantity. */
export function parseQuantity(q: string | number | undefined): number {
  if (typeof q === "number") return q;
  if (typeof q !== "string") return Number.NaN;
  const m = QUANTITY.exec(q.trim());
  if (!m) return Number.NaN;
  const base = Number(m[1]);
  if (m[2]) return base * 10 ** Number(m[2].slice(1));
  return base * (SUFFIX[m[3] ?? ""] ?? Number.NaN);
}
