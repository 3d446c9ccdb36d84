// Time for early OOM, injectable: the daemon uses the monotonic clock and timers; tests drive a
// manual clock, so no decision depends on how fast the machine runs the test.

export interface Clock {
  /** Milliseconds on a monotonic scale. */
  now(): number;
  /** Runs fn once after ms. fn's promise tells a manual clock when the tick is done. */
  timer(ms: number, fn: () => Promise<void>): { cancel(): void };
}

export const monotonicClock: Clock = {
  now: () => performance.now(),
  timer(ms, fn) {
    const t = setTimeout(() => void fn(), ms);
    return { cancel: () => clearTimeout(t) };
  },
};
