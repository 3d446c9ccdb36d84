// Failures that waiting cannot fix (a program not installed, a link refused, a spec refused)
// carry `permanent = true`; retry loops fail them at once instead of 10 times, 2 s apart.
export function isPermanent(err: unknown): boolean {
  return typeof err === "object" && err !== null && (err as { permanent?: unknown }).permanent === true;
}

/** A refusal with a message that says what to fix; never retried. */
export class RefusedError extends Error {
  override name = "RefusedError";
  readonly permanent = true;
}
