// The HTTPS server itself: TLS with an optional client certificate (the front proxy's, or a
// user's in standalone mode; checked per request in auth.ts), long keep-alive so a node's
// once-a-minute poll reuses its connection instead of paying a TLS handshake each time.
import https from "node:https";
import type { AddressInfo } from "node:net";
import type { Logger } from "../../agent/log.ts";
import { createHandler, type HandlerDeps } from "./handler.ts";

export interface ServeOptions extends HandlerDeps {
  cert: Buffer;
  key: Buffer;
  /** PEMs sent as acceptable client-certificate issuers (request-header and client CAs). */
  clientCAPems: Buffer[];
  host: string;
  port: number;
}

export interface RunningServer {
  port: number;
  server: https.Server;
  close(): Promise<void>;
}

export async function serve(opts: ServeOptions): Promise<RunningServer> {
  const handle = createHandler(opts);
  const log: Logger = opts.log;
  const server = https.createServer(
    {
      cert: opts.cert,
      key: opts.key,
      ...(opts.clientCAPems.length ? { ca: opts.clientCAPems } : {}),
      requestCert: true,
      // Verified per request against the right CA for the right role (auth.ts).
      rejectUnauthorized: false,
      keepAliveTimeout: 150_000,
      headersTimeout: 20_000,
      requestTimeout: 30_000,
      noDelay: true,
    },
    (req, res) => {
      handle(req, res).catch((err: Error) => {
        log.error({ err: err.message, url: req.url }, "request failed");
        if (!res.headersSent) {
          res.writeHead(500, { "Content-Type": "application/json" });
          res.end(
            JSON.stringify({
              kind: "Status",
              apiVersion: "v1",
              status: "Failure",
              reason: "InternalError",
              code: 500,
              message: err.message,
            }),
          );
        } else res.destroy();
      });
    },
  );
  // Idle keep-alive sockets and watches both sit here; neither needs a socket-level timeout.
  server.setTimeout(0);
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(opts.port, opts.host, () => resolve());
  });
  const port = (server.address() as AddressInfo).port;
  return {
    port,
    server,
    close: () =>
      new Promise<void>((resolve) => {
        opts.hub.close();
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
