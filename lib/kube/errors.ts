// Failure kinds of a Kubernetes API call. Callers act differently on each (fencing above
// all: a refused connection is not a 503, and neither is a TLS failure), so each is a class.

export type KubeErrorKind = "timeout" | "refused" | "tls" | "network" | "status";

export abstract class KubeError extends Error {
  abstract readonly kind: KubeErrorKind;
  readonly url: string;
  constructor(message: string, url: string, options?: ErrorOptions) {
    super(message, options);
    this.url = url;
  }
}

/** No complete answer within the deadline (connect, headers or body). */
export class KubeTimeoutError extends KubeError {
  override name = "KubeTimeoutError";
  readonly kind = "timeout";
}

/** Nothing listens at the address (ECONNREFUSED). */
export class KubeRefusedError extends KubeError {
  override name = "KubeRefusedError";
  readonly kind = "refused";
}

/** The TLS handshake failed: wrong CA, bad name, expired or rejected certificate. */
export class KubeTLSError extends KubeError {
  override name = "KubeTLSError";
  readonly kind = "tls";
}

/** Any other transport failure: reset, unreachable host, DNS. */
export class KubeNetworkError extends KubeError {
  override name = "KubeNetworkError";
  readonly kind = "network";
}

/**
 * The API server answered with a non-2xx status; `reason` is the Status object's reason and
 * `statusMessage` its message (what the server said, without the method, URL and code).
 */
export class KubeStatusError extends KubeError {
  override name = "KubeStatusError";
  readonly kind = "status";
  readonly status: number;
  readonly reason: string;
  readonly statusMessage: string;
  constructor(status: number, reason: string, message: string, url: string, statusMessage = message) {
    super(message, url);
    this.status = status;
    this.reason = reason;
    this.statusMessage = statusMessage;
  }
  get isClientError(): boolean {
    return this.status >= 400 && this.status < 500;
  }
  get isServerError(): boolean {
    return this.status >= 500;
  }
}

export const isNotFound = (e: unknown): boolean => e instanceof KubeStatusError && e.status === 404;
export const isConflict = (e: unknown): boolean => e instanceof KubeStatusError && e.status === 409;
export const isForbidden = (e: unknown): boolean => e instanceof KubeStatusError && e.status === 403;
export const isUnauthorized = (e: unknown): boolean => e instanceof KubeStatusError && e.status === 401;
/** 410 Gone: a watch's resourceVersion is too old; relist. */
export const isGone = (e: unknown): boolean => e instanceof KubeStatusError && e.status === 410;
export const isTooManyRequests = (e: unknown): boolean => e instanceof KubeStatusError && e.status === 429;

const TLS_CODE = /^(ERR_TLS_|ERR_SSL_|CERT_|UNABLE_TO_|DEPTH_ZERO|SELF_SIGNED|ERR_OSSL_)|HOSTNAME_MISMATCH|EPROTO/;

/** Turns a Node.js transport error into the matching KubeError. */
export function classifyTransportError(err: NodeJS.ErrnoException, url: string): KubeError {
  const code = err.code ?? "";
  const detail = `${err.message}${code && !err.message.includes(code) ? ` (${code})` : ""}`;
  if (code === "ECONNREFUSED") return new KubeRefusedError(`connection refused by ${url}`, url, { cause: err });
  if (code === "ETIMEDOUT" || code === "ESOCKETTIMEDOUT")
    return new KubeTimeoutError(`timed out talking to ${url}: ${detail}`, url, { cause: err });
  if (TLS_CODE.test(code) || /certificate|handshake|ssl|tls alert/i.test(err.message))
    return new KubeTLSError(`TLS failure talking to ${url}: ${detail}`, url, { cause: err });
  return new KubeNetworkError(`network failure talking to ${url}: ${detail}`, url, { cause: err });
}

/** An answer larger than RequestOptions.maxBytes; reading stopped there. */
export class ResponseTooLargeError extends Error {
  override name = "ResponseTooLargeError";
}
