// One retry rhythm for every loop that talks to a server: exponential from `baseMs`, capped at
// `maxMs`, with ±50 % jitter so a thousand nodes that lost the API at once do not come back in
// step. `reset()` after a success.
export class Backoff {
  private failures = 0;
  private readonly baseMs: number;
  private readonly maxMs: number;

  constructor(o: { baseMs?: number; maxMs?: number } = {}) {
    this.baseMs = o.baseMs ?? 500;
    this.maxMs = o.maxMs ?? 30_000;
  }

  /** The delay before the next attempt; each call counts one more failure. */
  next(): number {
    const ms = Math.min(this.maxMs, this.baseMs * 2 ** Math.min(this.failures, 16));
    this.failures++;
    return Math.round(ms * (0.5 + Math.random()));
  }

  reset(): void {
    this.failures = 0;
  }

  get attempts(): number {
    return this.failures;
  }
}
