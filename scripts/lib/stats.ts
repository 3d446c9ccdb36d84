// Figures over a benchmark's samples.

/** The nearest-rank percentile (p in 0–100): a value that was measured, never an interpolation. */
export function percentile(xs: readonly number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))] ?? Number.NaN;
}
