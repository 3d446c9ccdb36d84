// What every cluster-side listener (the bundle server, the registry-packages proxy) holds for a
// caller, bounded: how many connections, how long a TLS handshake may take, how long a
// connection may sit before its first request and between requests, and that no request brings
// a body (both APIs are read-only). Without these, a caller that opens connections and sends
// nothing holds them (and ~70 KB of native TLS memory each) for as long as it likes.
//
// The first-request and idle clocks are our own, driven by complete requests (HTTP/1.1 request
// headers, HTTP/2 streams), not by socket activity: a client trickling header bytes or HTTP/2
// PINGs never completes a request, so it is cut all the same.
import type { Server as HttpsServer } from "node:https";
import type { IncomingMessage, ServerResponse } from "node:http";
import http2, { type Http2SecureServer, type Http2ServerRequest, type ServerHttp2Session } from "node:http2";
import type { TLSSocket } from "node:tls";

export interface ListenerLimits {
  /** Concurrent TCP connections, handshakes included; more are closed as they arrive. */
  maxConnections: number;
  /** A TLS handshake that takes longer is dropped. */
  handshakeTimeoutMs: number;
  /** After the handshake, the first complete request (HTTP/1.1 headers or an HTTP/2 stream) within this. */
  firstRequestTimeoutMs: number;
  /** A connection with no request in flight for this long is closed (keep-alive reuse up to then). */
  idleTimeoutMs: number;
}

export const DEFAULT_LISTENER_LIMITS: ListenerLimits = {
  maxConnections: 4096,
  handshakeTimeoutMs: 10_000,
  firstRequestTimeoutMs: 10_000,
  idleTimeoutMs: 150_000,
};

/** Options for the server's constructor (the handshake clock can only be set there). */
export const tlsServerOptions = (l: ListenerLimits) => ({ handshakeTimeout: l.handshakeTimeoutMs });

/** One connection's clock: cut when it fires; stopped while a request is in flight. */
class Clock {
  private timer: NodeJS.Timeout | undefined;
  private inflight = 0;
  private served = false;
  private readonly cut: (afterRequests: boolean) => void;
  private readonly idleMs: number;
  constructor(cut: (afterRequests: boolean) => void, idleMs: number, firstMs: number) {
    this.cut = cut;
    this.idleMs = idleMs;
    this.arm(firstMs);
  }
  private arm(ms: number): void {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.cut(this.served), ms);
    this.timer.unref();
  }
  begin(): void {
    this.served = true;
    this.inflight++;
    clearTimeout(this.timer);
  }
  end(): void {
    if (--this.inflight === 0) this.arm(this.idleMs);
  }
  stop(): void {
    clearTimeout(this.timer);
  }
}

/**
 * Applies the connection cap and the first-request and idle clocks to a TLS server (HTTPS, or
 * HTTP/2 with the HTTP/1.1 fallback). Call once, right after creating it.
 */
export function limitConnections(server: HttpsServer | Http2SecureServer, l: ListenerLimits): void {
  server.maxConnections = l.maxConnections;
  const clocks = new WeakMap<object, Clock>();
  // HTTP/2: the session is the connection; its streams are the requests.
  server.on("session", (session: ServerHttp2Session) => {
    const clock = new Clock(
      (afterRequests) => {
        if (!afterRequests) return session.destroy();
        // A client that was served gets a GOAWAY, so a request it sends meanwhile is retried elsewhere.
        session.close();
        setTimeout(() => session.destroy(), 5000).unref();
      },
      l.idleTimeoutMs,
      l.firstRequestTimeoutMs,
    );
    session.on("stream", (stream) => {
      clock.begin();
      stream.once("close", () => clock.end());
    });
    session.once("close", () => clock.stop());
  });
  // HTTP/1.1 (and a TLS connection that negotiated nothing yet): the socket.
  server.on("secureConnection", (socket: TLSSocket) => {
    if (socket.alpnProtocol === "h2") return; // its session has its clock already
    const clock = new Clock(() => socket.destroy(), l.idleTimeoutMs, l.firstRequestTimeoutMs);
    clocks.set(socket, clock);
    socket.once("close", () => clock.stop());
  });
  server.on("request", (req: IncomingMessage | Http2ServerRequest, res: ServerResponse) => {
    if (req.httpVersion === "2.0") return;
    const clock = clocks.get(req.socket);
    if (!clock) return;
    clock.begin();
    res.once("close", () => clock.end());
  });
}

/**
 * Whether a request carries (or may carry) a body: a read-only API takes none, so it answers
 * 413 without reading one.
 */
export function hasBody(req: IncomingMessage): boolean {
  if (req.httpVersion === "2.0") {
    // HTTP/2: a request without a body ends its stream with its headers.
    return !(req as unknown as Http2ServerRequest).stream.endAfterHeaders;
  }
  const length = req.headers["content-length"];
  return req.headers["transfer-encoding"] !== undefined || (length !== undefined && length !== "0");
}

/** Answers 413 without reading the body: the HTTP/1.1 connection is closed, the HTTP/2 stream reset. */
export function refuseBody(req: IncomingMessage, res: ServerResponse, body: string, contentType: string): void {
  const h2 = req.httpVersion === "2.0";
  res.writeHead(413, {
    "Content-Type": contentType,
    "Content-Length": String(Buffer.byteLength(body)),
    ...(h2 ? {} : { Connection: "close" }),
  });
  res.end(body);
  res.once("finish", () => {
    if (h2) (req as unknown as Http2ServerRequest).stream.close(http2.constants.NGHTTP2_NO_ERROR);
    else {
      // A FIN lets the 413 arrive before the unread body would turn the close into a reset.
      req.socket.end();
      setTimeout(() => req.socket.destroy(), 1000).unref();
    }
  });
}

/** The one route that takes a body (the CRD conversion webhook): how much, and how fast. */
export interface BodyLimits {
  /** Bytes; a longer body is refused (413) without reading the rest. */
  maxBytes: number;
  /** The whole body must arrive within this (408 after). */
  timeoutMs: number;
}

/**
 * A ConversionReview carries every object of a list read at once (the API server converts a
 * list in one request): 16 MiB holds thousands of NodeGroups. The API server gives a
 * conversion webhook 30 s in all; the body must be in within 10 of them.
 */
export const CONVERSION_BODY_LIMITS: BodyLimits = { maxBytes: 16 * 1024 * 1024, timeoutMs: 10_000 };

export class BodyLimitError extends Error {
  override name = "BodyLimitError";
  readonly code: 408 | 413;
  constructor(code: 408 | 413, message: string) {
    super(message);
    this.code = code;
  }
}

/** Reads a request's body within `l`, or throws BodyLimitError (the caller answers with its code). */
export function readBoundedBody(req: IncomingMessage, l: BodyLimits): Promise<Buffer> {
  const declared = Number(req.headers["content-length"] ?? "");
  if (Number.isFinite(declared) && declared > l.maxBytes) {
    return Promise.reject(new BodyLimitError(413, `the body (${declared} bytes) is over ${l.maxBytes} bytes`));
  }
  return new Promise<Buffer>((resolve, reject) => {
    const chunks: Buffer[] = [];
    let bytes = 0;
    const fail = (err: BodyLimitError) => {
      clearTimeout(timer);
      req.removeListener("data", onData);
      req.pause();
      reject(err);
    };
    const timer = setTimeout(
      () => fail(new BodyLimitError(408, `the body did not arrive within ${l.timeoutMs} ms`)),
      l.timeoutMs,
    );
    timer.unref();
    const onData = (c: Buffer) => {
      bytes += c.length;
      if (bytes > l.maxBytes) return fail(new BodyLimitError(413, `the body is over ${l.maxBytes} bytes`));
      chunks.push(c);
    };
    req.on("data", onData);
    req.once("end", () => {
      clearTimeout(timer);
      if (bytes <= l.maxBytes) resolve(Buffer.concat(chunks));
    });
    req.once("error", (err) => {
      clearTimeout(timer);
      reject(err);
    });
  });
}
