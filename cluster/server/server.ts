// The HTTPS server itself: TLS with an optional client certificate (the front proxy's, or a
// user's in standalone mode; checked per request in auth.ts). HTTP/2 and HTTP/1.1 on one port:
// behind the aggregator, thousands of node watches arrive as streams over a few HTTP/2
// connections instead of one TLS connection each (a TLS connection costs ~70 KB of native
// memory here). HTTP/1.1 keep-alive is long, so a node polling directly once a minute reuses
// its connection instead of paying a TLS handshake each time.
import http2 from "node:http2";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import type { Logger } from "../../lib/log/log.ts";
import { createHandler, type HandlerDeps, statusBody } from "./handler.ts";
import {
  DEFAULT_LISTENER_LIMITS,
  hasBody,
  limitConnections,
  type ListenerLimits,
  refuseBody,
  tlsServerOptions,
  CONVERSION_BODY_LIMITS,
  type BodyLimits,
} from "../listener-limits.ts";
import { CONVERSION_PATH, handleConversion } from "./conversion-webhook.ts";

export interface ServeOptions extends HandlerDeps {
  cert: Buffer;
  key: Buffer;
  /** PEMs sent as acceptable client-certificate issuers (request-header and client CAs). */
  clientCAPems: Buffer[];
  host: string;
  port: number;
  /** SO_REUSEPORT: several server processes on one host share the port (each takes a share of new connections). */
  reusePort?: boolean;
  /** Connection cap and timeouts (cluster/listener-limits.ts); the defaults when not given. */
  limits?: Partial<ListenerLimits>;
  /** The NodeGroup conversion webhook (POST /convert): its body bounds, and the permanent groups' lookup. */
  conversion?: { limits?: BodyLimits; permanentGroups?: () => Promise<Set<string>> };
}

export interface RunningServer {
  port: number;
  server: http2.Http2SecureServer;
  close(): Promise<void>;
}

export async function serve(opts: ServeOptions): Promise<RunningServer> {
  const handle = createHandler(opts);
  const log: Logger = opts.log;
  const limits = { ...DEFAULT_LISTENER_LIMITS, ...opts.limits };
  const server = http2.createSecureServer(
    {
      ...tlsServerOptions(limits),
      cert: opts.cert,
      key: opts.key,
      ...(opts.clientCAPems.length ? { ca: opts.clientCAPems } : {}),
      requestCert: true,
      // Verified per request against the right CA for the right role (auth.ts).
      rejectUnauthorized: false,
      allowHTTP1: true,
      // A Go client (the aggregator) opens another connection when a server's stream limit is
      // reached, so this bounds streams per connection, not watches in total.
      settings: { maxConcurrentStreams: 1000 },
      // Watches stream for up to an hour; the default session queue cap would cut slow readers.
      maxSessionMemory: 64,
    },
    (h2req, h2res) => {
      // The HTTP/2 compatibility objects offer the same surface the handler uses.
      const req = h2req as unknown as IncomingMessage;
      const res = h2res as unknown as ServerResponse;
      // The one route with a body: the API server posts ConversionReviews here (bounded there).
      if (req.url === CONVERSION_PATH || req.url?.startsWith(`${CONVERSION_PATH}?`)) {
        return void handleConversion(req, res, {
          limits: opts.conversion?.limits ?? CONVERSION_BODY_LIMITS,
          log,
          ...(opts.conversion?.permanentGroups ? { permanentGroups: opts.conversion.permanentGroups } : {}),
        }).catch((err: Error) => {
          log.error({ err: err.message }, "conversion request failed");
          if (!res.headersSent) {
            res.writeHead(500, { "Content-Type": "text/plain" });
            res.end(`conversion failed: ${err.message}`);
          } else res.destroy();
        });
      }
      if (hasBody(req)) {
        return refuseBody(
          req,
          res,
          JSON.stringify(
            statusBody(413, "RequestEntityTooLarge", "these resources are read-only: a request takes no body"),
          ),
          "application/json",
        );
      }
      handle(req, res).catch((err: Error) => {
        log.error({ err: err.message, url: req.url }, "request failed");
        if (!res.headersSent) {
          res.writeHead(500, { "Content-Type": "application/json" });
          res.end(JSON.stringify(statusBody(500, "InternalError", err.message)));
        } else res.destroy();
      });
    },
  );
  limitConnections(server, limits);
  const sockets = new Set<Socket>();
  server.on("connection", (s: Socket) => {
    sockets.add(s);
    s.once("close", () => sockets.delete(s));
  });
  // Watches stream for an hour without a byte from the client: no socket-level timeout. Idle
  // connections are closed by limitConnections' clocks instead.
  server.setTimeout(0);
  // Read by the HTTP/1.1 fallback for its connections.
  Object.assign(server, { keepAliveTimeout: 150_000, headersTimeout: 20_000, requestTimeout: 30_000 });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen({ port: opts.port, host: opts.host, reusePort: opts.reusePort ?? false }, () => resolve());
  });
  const port = (server.address() as AddressInfo).port;
  return {
    port,
    server,
    close: () =>
      new Promise<void>((resolve) => {
        opts.hub.close();
        server.close(() => resolve());
        for (const s of sockets) s.destroy();
      }),
  };
}
