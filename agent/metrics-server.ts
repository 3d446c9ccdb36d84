// The resident agent's local metrics endpoint: Prometheus text from one Registry that every job
// of the agent (converge, fencing, early OOM) registers its series in, plus small JSON status
// documents (`bashible early-oom status` reads /early-oom). Loopback by default: the figures
// name pods and namespaces, and nothing here needs to be reachable from off the node.
import type { Server } from "node:http";
import type { Logger } from "../lib/log/log.ts";
import { CONTENT_TYPE, type Registry } from "../lib/prometheus.ts";

export const DEFAULT_METRICS_ADDRESS = "127.0.0.1:9650";

// Not `import ... from "node:http"`: an ES module namespace of node:http evaluates its lazy
// getters, and http.WebSocket/CloseEvent/MessageEvent load undici, +8 MB RSS in the resident
// process (measured: 56.3 vs 47.9 MB for a lite-mode process with one server listening).
const { createServer } = process.getBuiltinModule("node:http");

export class MetricsAddressError extends Error {
  override name = "MetricsAddressError";
}

/** "HOST:PORT", "[v6]:PORT" or ":PORT" (loopback). */
export function parseAddress(addr: string): { host: string; port: number } {
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:[\]]*)):(\d{1,5})$/.exec(addr.trim());
  const port = Number(m?.[3]);
  if (!m || !Number.isInteger(port) || port > 65535)
    throw new MetricsAddressError(`metrics address must be HOST:PORT (e.g. ${DEFAULT_METRICS_ADDRESS}), got '${addr}'`);
  return { host: m[1] ?? (m[2] || "127.0.0.1"), port };
}

export interface MetricsServerOptions {
  registry: Registry;
  address: string;
  log: Logger;
  /** JSON documents by path, computed per request. */
  json?: Record<string, () => unknown>;
}

export interface MetricsServer {
  /** The address actually bound (port 0 picks one). */
  readonly host: string;
  readonly port: number;
  close(): Promise<void>;
}

export async function startMetricsServer(o: MetricsServerOptions): Promise<MetricsServer> {
  const { host, port } = parseAddress(o.address);
  const server: Server = createServer((req, res) => {
    const url = (req.url ?? "/").split("?")[0] ?? "/";
    if (req.method !== "GET" && req.method !== "HEAD") {
      res.writeHead(405, { allow: "GET, HEAD" }).end();
      return;
    }
    try {
      if (url === "/metrics") {
        res.writeHead(200, { "content-type": CONTENT_TYPE }).end(req.method === "HEAD" ? undefined : o.registry.text());
        return;
      }
      const doc = o.json?.[url];
      if (doc) {
        res
          .writeHead(200, { "content-type": "application/json" })
          .end(req.method === "HEAD" ? undefined : `${JSON.stringify(doc(), null, 2)}\n`);
        return;
      }
      res.writeHead(404, { "content-type": "text/plain" }).end(`not found; try /metrics\n`);
    } catch (err) {
      o.log.error(`metrics endpoint ${url}: ${(err as Error).message}`);
      if (!res.headersSent) res.writeHead(500).end();
      else res.destroy();
    }
  });
  // A slow or idle client must not hold sockets in the resident process.
  server.requestTimeout = 5000;
  server.headersTimeout = 5000;
  server.keepAliveTimeout = 5000;
  server.maxConnections = 16;
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const bound = server.address();
  const actualPort = typeof bound === "object" && bound ? bound.port : port;
  return {
    host,
    port: actualPort,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
