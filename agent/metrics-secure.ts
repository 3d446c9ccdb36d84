// The agent's metrics for an in-cluster Prometheus (--metrics-secure-address): the same answers
// as the loopback endpoint, over TLS with the kubelet's serving certificate, to a request whose
// bearer token passes metrics-auth.ts (401 without a valid token, 403 when its user may not get
// nodes/metrics of this node; no detail in either body). Until the kubelet has its certificate
// (an approved CSR, docs/controllers.md) the listener waits and says so once; afterwards the
// file is looked at every pollMs and a rotated certificate is served to new connections.
//
// Bounds as the loopback listener's (guardConnections): counted and timed once past the
// handshake; the handshake itself must end within headersMs, and beyond maxConnections sockets
// still in their handshake the oldest of them is closed (boundHandshakes), so sockets held open
// without a handshake cannot keep a scrape out.
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Server as HttpsServer } from "node:https";
import { readFile, stat } from "node:fs/promises";
import { isIP, type Socket } from "node:net";
import path from "node:path";
import type { KubeClient } from "../lib/kube/client.ts";
import { MetricsAuthorizer, nodeMetricsAccess } from "../lib/metrics-auth.ts";
import {
  boundPort,
  closeServer,
  guardConnections,
  hostPort,
  LISTENER_LIMITS,
  listen,
  metricsHandler,
  type MetricsServerOptions,
  parseAddress,
} from "./metrics-server.ts";

/** The kubelet's current serving certificate and key, one PEM file (a symlink it rotates). */
export const KUBELET_SERVING_CERT = "/var/lib/kubelet/pki/kubelet-server-current.pem";

/** The address's host that stands for the Node's InternalIP. */
export const INTERNAL = "internal";

async function internalIP(kube: () => KubeClient | undefined, node: string): Promise<string | undefined> {
  const k = kube();
  if (!k) return undefined;
  const n = await k
    .request<{ status?: { addresses?: { type?: string; address?: string }[] } }>(
      "GET",
      `/api/v1/nodes/${encodeURIComponent(node)}`,
      { timeoutMs: 5000 },
    )
    .catch(() => undefined);
  return n?.status?.addresses?.find((a) => a.type === "InternalIP" && isIP(a.address ?? ""))?.address;
}

/**
 * At most `max` sockets in their TLS handshake; the oldest makes way for a new one. A TLS socket
 * is matched to its TCP socket by the peer's address and port (unique among live connections).
 */
function boundHandshakes(server: HttpsServer, max: number): void {
  const pending = new Map<string, Socket>(); // insertion order: oldest first
  const peer = (s: { remoteAddress?: string; remotePort?: number }) => `${s.remoteAddress}|${s.remotePort}`;
  server.on("connection", (raw: Socket) => {
    const key = peer(raw);
    pending.set(key, raw);
    raw.once("close", () => {
      if (pending.get(key) === raw) pending.delete(key);
    });
    if (pending.size > max) {
      const [oldestKey, oldest] = pending.entries().next().value as [string, Socket];
      pending.delete(oldestKey);
      oldest.destroy();
    }
  });
  server.on("secureConnection", (s: Socket) => pending.delete(peer(s)));
}

/** A file's identity: another inode, time or size is another certificate to load. */
const identity = (st: { ino: number; mtimeMs: number; size: number }) => `${st.ino}:${st.mtimeMs}:${st.size}`;

export interface SecureMetricsOptions extends MetricsServerOptions {
  address: string;
  /** Under --root. */
  root: string;
  nodeName: string;
  kube: () => KubeClient | undefined;
  certFile?: string;
  /** How often the certificate is looked for, and at for rotation (default 30 s). */
  pollMs?: number;
}

export interface SecureMetrics {
  /** Resolves once listening (never, if closed before). */
  readonly listening: Promise<{ host: string; port: number }>;
  close(): Promise<void>;
}

export async function startSecureMetrics(o: SecureMetricsOptions): Promise<SecureMetrics> {
  const parsed = parseAddress(o.address);
  const port = parsed.port;
  // "internal:PORT": the Node's InternalIP, read once with the kubelet's credentials (a node may
  // get its own Node), so one drop-in serves every node of a group.
  let host: string | undefined = parsed.host === INTERNAL ? undefined : parsed.host;
  let where = `${parsed.host}:${port}`;
  const certFile = path.join(o.root, o.certFile ?? KUBELET_SERVING_CERT);
  const limits = o.limits ?? LISTENER_LIMITS;
  const pollMs = o.pollMs ?? 30_000;
  const log = o.log.child({ component: "metrics-secure" });
  const authz = new MetricsAuthorizer({ kube: o.kube, access: nodeMetricsAccess(o.nodeName) });
  const serve = metricsHandler(o);
  let lastReviewError: string | undefined;
  const handle = (req: IncomingMessage, res: ServerResponse) => {
    void authz.check(req.headers.authorization).then((verdict) => {
      if (verdict === 200) return serve(req, res);
      if (verdict === 503 && authz.lastError !== lastReviewError)
        log.warn(
          `metrics on ${where}: cannot review a scrape's token with the API server (answered 503): ${authz.lastError}`,
        );
      lastReviewError = authz.lastError;
      const headers: Record<string, string> = { "content-type": "text/plain" };
      if (verdict === 401) headers["www-authenticate"] = 'Bearer realm="bashible"';
      res.writeHead(verdict, headers).end();
    });
  };

  let server: HttpsServer | undefined;
  let loaded: string | undefined; // the certificate file's identity when last read
  let timer: NodeJS.Timeout | undefined;
  let closed = false;
  let said = "";
  const once = (what: string, write: () => void) => {
    if (what !== said) write();
    said = what;
  };
  let resolveListening: (a: { host: string; port: number }) => void = () => {};
  const listening = new Promise<{ host: string; port: number }>((r) => (resolveListening = r));

  const tick = async (): Promise<void> => {
    timer = undefined;
    if (closed) return;
    try {
      if (host === undefined) {
        host = await internalIP(o.kube, o.nodeName);
        if (host === undefined) {
          once("no-ip", () =>
            log.warn(
              { address: where },
              `metrics on ${where} wait for Node ${o.nodeName}'s InternalIP (status.addresses, with the kubelet's credentials); looking again every ${Math.round(pollMs / 1000)} s`,
            ),
          );
          return;
        }
        where = hostPort(host, port);
      }
      const st = await stat(certFile).catch((err: NodeJS.ErrnoException) => {
        if (err.code === "ENOENT") return undefined;
        throw err;
      });
      if (!st) {
        once("missing", () =>
          log.warn(
            { address: where, certFile },
            `metrics on ${where} wait for the kubelet's serving certificate ${certFile} (its CSR must be approved: kubectl get csr); looking again every ${Math.round(pollMs / 1000)} s`,
          ),
        );
      } else if (identity(st) !== loaded) {
        const pem = await readFile(certFile);
        if (!server) {
          const bindTo = host;
          const s = process
            .getBuiltinModule("node:https")
            .createServer({ cert: pem, key: pem, handshakeTimeout: limits.headersMs, minVersion: "TLSv1.2" }, handle);
          guardConnections(s, limits);
          boundHandshakes(s, limits.maxConnections);
          await listen(s, { host: bindTo, port });
          if (closed) {
            await closeServer(s);
            return;
          }
          server = s;
          log.info({ address: where, certFile }, `metrics listening on ${where} (TLS, bearer token and nodes/metrics)`);
          resolveListening({ host: bindTo, port: boundPort(s, port) });
        } else {
          server.setSecureContext({ cert: pem, key: pem });
          log.info({ certFile }, "metrics: serving the kubelet's rotated certificate");
        }
        loaded = identity(st);
        said = "";
      }
    } catch (err) {
      const e = err as NodeJS.ErrnoException;
      once(e.code ?? e.message, () =>
        log.error(
          { address: where, certFile, error: e.code },
          `metrics on ${where} not served: ${e.message}; retrying every ${Math.round(pollMs / 1000)} s (change it with --metrics-secure-address IP:PORT, or off)`,
        ),
      );
    } finally {
      if (!closed) {
        timer = setTimeout(() => void tick(), pollMs);
        timer.unref();
      }
    }
  };
  const first = tick();
  return {
    listening,
    async close() {
      closed = true;
      await first;
      clearTimeout(timer);
      if (server) await closeServer(server);
    },
  };
}
