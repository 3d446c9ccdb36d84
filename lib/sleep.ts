/**
 * setTimeout as a promise that also ends (resolves) when the signal aborts. The abort listener
 * goes when the timer fires: loops sleep on one long-lived signal every few seconds, and a
 * listener left behind per sleep keeps its closure alive for the signal's lifetime.
 */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const onAbort = () => {
      clearTimeout(t);
      resolve();
    };
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
