// A small Kubernetes API client over node:https. Every call has an explicit deadline and
// fails with one KubeError class per failure kind; there is no retry here, because the right
// retry differs between converge, fencing and the cluster controllers.
import https from "node:https";
import type { IncomingHttpHeaders, IncomingMessage } from "node:http";
import {
  classifyTransportError,
  KubeError,
  KubeStatusError,
  KubeTimeoutError,
  ResponseTooLargeError,
} from "./errors.ts";
import type { KubeConnection } from "./kubeconfig.ts";

export type Query = Record<string, string | number | boolean | undefined>;

export interface RequestOptions {
  query?: Query;
  body?: unknown;
  /** Defaults to application/json; PATCH defaults to a JSON merge patch. */
  contentType?: string;
  headers?: Record<string, string>;
  /** Deadline for the whole exchange; defaults to the client's. */
  timeoutMs?: number;
  signal?: AbortSignal;
  /** Read at most this many body bytes (ResponseTooLargeError beyond). */
  maxBytes?: number;
}

export interface RawResponse {
  status: number;
  headers: IncomingHttpHeaders;
  body: Buffer;
}

export interface WatchEvent<T = Record<string, unknown>> {
  type: "ADDED" | "MODIFIED" | "DELETED" | "BOOKMARK";
  object: T;
}

export interface WatchOptions {
  resourceVersion?: string;
  allowWatchBookmarks?: boolean;
  /** Server-side end of the watch; the server closes the stream after this many seconds. */
  timeoutSeconds?: number;
  labelSelector?: string;
  fieldSelector?: string;
  /** Fail with KubeTimeoutError when nothing (not even a bookmark) arrives for this long. */
  idleTimeoutMs?: number;
  signal?: AbortSignal;
}

export interface KubeClientOptions {
  timeoutMs?: number;
  userAgent?: string;
  /** Connections at once (default 8). Each open watch holds one for as long as it runs. */
  maxSockets?: number;
}

const DEFAULT_TIMEOUT_MS = 10_000;

export class KubeClient {
  readonly connection: KubeConnection;
  readonly timeoutMs: number;
  private readonly agent: https.Agent;
  private readonly userAgent: string;

  constructor(connection: KubeConnection, opts: KubeClientOptions = {}) {
    this.connection = connection;
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.userAgent = opts.userAgent ?? "bashible";
    this.agent = new https.Agent({
      keepAlive: true,
      maxSockets: opts.maxSockets ?? 8,
      ca: connection.ca,
      cert: connection.cert,
      key: connection.key,
      servername: connection.tlsServerName,
    });
  }

  close(): void {
    this.agent.destroy();
  }

  url(path: string, query?: Query): string {
    const qs = new URLSearchParams();
    for (const [k, v] of Object.entries(query ?? {})) if (v !== undefined) qs.set(k, String(v));
    const s = qs.toString();
    return `${this.connection.server}${path}${s ? `?${s}` : ""}`;
  }

  /** Sends a request and resolves once the response headers arrived (or rejects with a KubeError). */
  private open(
    method: string,
    path: string,
    opts: RequestOptions,
    deadlineMs: number,
  ): {
    response: Promise<IncomingMessage>;
    url: string;
    abort: (err: Error) => void;
  } {
    const url = this.url(path, opts.query);
    let payload: Buffer | undefined;
    const headers: Record<string, string> = {
      Accept: "application/json",
      "User-Agent": this.userAgent,
      ...opts.headers,
    };
    if (opts.body !== undefined) {
      payload = Buffer.isBuffer(opts.body) ? opts.body : Buffer.from(JSON.stringify(opts.body));
      headers["Content-Type"] =
        opts.contentType ?? (method === "PATCH" ? "application/merge-patch+json" : "application/json");
      headers["Content-Length"] = String(payload.length);
    }
    if (this.connection.token) headers.Authorization = `Bearer ${this.connection.token}`;
    const req = https.request(url, { method, headers, agent: this.agent });
    // The first error settles the promise below; a later one (a timeout after the answer began,
    // an abort racing a reset) must not become an uncaught exception that ends the process.
    req.on("error", () => undefined);
    const abort = (err: Error) => req.destroy(err);
    const response = new Promise<IncomingMessage>((resolve, reject) => {
      const timer = setTimeout(
        () => abort(new KubeTimeoutError(`${method} ${url}: no answer within ${deadlineMs} ms`, url)),
        deadlineMs,
      );
      const onAbort = () => abort(new KubeTimeoutError(`${method} ${url}: aborted`, url));
      opts.signal?.addEventListener("abort", onAbort, { once: true });
      req.once("response", (res) => {
        clearTimeout(timer);
        resolve(res);
      });
      req.once("error", (err: NodeJS.ErrnoException) => {
        clearTimeout(timer);
        opts.signal?.removeEventListener("abort", onAbort);
        reject(err instanceof KubeError ? err : classifyTransportError(err, url));
      });
      req.once("close", () => opts.signal?.removeEventListener("abort", onAbort));
    });
    req.end(payload);
    return { response, url, abort };
  }

  /** One request, whole body read, any status; transport failures reject with a KubeError. */
  async raw(method: string, path: string, opts: RequestOptions = {}): Promise<RawResponse> {
    const deadlineMs = opts.timeoutMs ?? this.timeoutMs;
    const started = Date.now();
    const { response, url, abort } = this.open(method, path, opts, deadlineMs);
    const res = await response;
    const left = Math.max(1, deadlineMs - (Date.now() - started));
    const timer = setTimeout(() => {
      const err = new KubeTimeoutError(`${method} ${url}: body not complete within ${deadlineMs} ms`, url);
      abort(err);
      res.destroy(err);
    }, left);
    try {
      const chunks: Buffer[] = [];
      let size = 0;
      for await (const chunk of res) {
        size += (chunk as Buffer).length;
        // Stop reading at the caller's limit: an oversized answer never sits in memory whole.
        if (opts.maxBytes !== undefined && size > opts.maxBytes) {
          res.destroy();
          throw new ResponseTooLargeError(`${method} ${url}: the answer is larger than ${opts.maxBytes} bytes`);
        }
        chunks.push(chunk as Buffer);
      }
      return { status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) };
    } catch (err) {
      if (err instanceof ResponseTooLargeError) throw err;
      throw err instanceof KubeError ? err : classifyTransportError(err as NodeJS.ErrnoException, url);
    } finally {
      clearTimeout(timer);
    }
  }

  /** A JSON request; non-2xx answers throw KubeStatusError with the Status reason. */
  async request<T = Record<string, unknown>>(method: string, path: string, opts: RequestOptions = {}): Promise<T> {
    const res = await this.raw(method, path, opts);
    if (res.status < 200 || res.status >= 300) throw statusError(method, this.url(path, opts.query), res);
    return (res.body.length ? JSON.parse(res.body.toString("utf8")) : {}) as T;
  }

  /**
   * Watches a collection path. Yields ADDED/MODIFIED/DELETED/BOOKMARK events until the server
   * ends the stream (return) or the watch fails (throw; a 410 Gone means relist).
   */
  async *watch<T = Record<string, unknown>>(path: string, opts: WatchOptions = {}): AsyncGenerator<WatchEvent<T>> {
    const query: Query = {
      watch: 1,
      resourceVersion: opts.resourceVersion,
      allowWatchBookmarks: opts.allowWatchBookmarks ?? true,
      timeoutSeconds: opts.timeoutSeconds,
      labelSelector: opts.labelSelector,
      fieldSelector: opts.fieldSelector,
    };
    const method = "GET";
    const { response, url, abort } = this.open(method, path, { query, signal: opts.signal }, this.timeoutMs);
    const res = await response;
    if ((res.statusCode ?? 0) >= 300) {
      const chunks: Buffer[] = [];
      for await (const c of res) chunks.push(c as Buffer);
      throw statusError(method, url, { status: res.statusCode ?? 0, body: Buffer.concat(chunks) });
    }
    const idleMs = opts.idleTimeoutMs;
    let idleTimer: NodeJS.Timeout | undefined;
    const armIdle = () => {
      if (!idleMs) return;
      clearTimeout(idleTimer);
      idleTimer = setTimeout(() => {
        const err = new KubeTimeoutError(`watch ${url}: nothing received for ${idleMs} ms`, url);
        abort(err);
        res.destroy(err);
      }, idleMs);
    };
    armIdle();
    let pending = "";
    try {
      for await (const chunk of res) {
        armIdle();
        pending += (chunk as Buffer).toString("utf8");
        let nl = pending.indexOf("\n");
        while (nl >= 0) {
          const line = pending.slice(0, nl).trim();
          pending = pending.slice(nl + 1);
          nl = pending.indexOf("\n");
          if (!line) continue;
          const ev = JSON.parse(line) as { type: string; object: Record<string, unknown> };
          if (ev.type === "ERROR") {
            const st = ev.object as { code?: number; reason?: string; message?: string };
            throw new KubeStatusError(
              st.code ?? 500,
              st.reason ?? "",
              `watch ${url}: ${st.message ?? "error"}`,
              url,
              st.message ?? "error",
            );
          }
          yield ev as WatchEvent<T>;
        }
      }
    } catch (err) {
      if (opts.signal?.aborted) return;
      throw err instanceof KubeError ? err : classifyTransportError(err as NodeJS.ErrnoException, url);
    } finally {
      clearTimeout(idleTimer);
      res.destroy();
    }
  }
}

/** A non-2xx answer as a KubeStatusError: the Status object's reason and message when it is one. */
export function statusError(method: string, url: string, res: Pick<RawResponse, "status" | "body">): KubeStatusError {
  let reason = "";
  let message = res.body.toString("utf8").slice(0, 500);
  try {
    const st = JSON.parse(res.body.toString("utf8")) as { reason?: string; message?: string };
    reason = st.reason ?? "";
    message = st.message ?? message;
  } catch {
    // not a Status object; keep the raw text
  }
  return new KubeStatusError(
    res.status,
    reason,
    `${method} ${url}: ${res.status} ${reason || "error"}: ${message}`,
    url,
    message,
  );
}
