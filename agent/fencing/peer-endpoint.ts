// The peer endpoint: answers the other agents of the group with this node's last API check
// (peers.ts has the protocol and the mutual TLS). It starts once the node has a client
// certificate, takes a rotated one for new connections, and retries a failed listen next round.
import type { Logger } from "../../lib/log/log.ts";
import type { Clock } from "./clock.ts";
import type { ApiCheck } from "./health.ts";
import { type PeerReport, PeerServer, type PeerTls } from "./peers.ts";

/**
 * What this node tells a peer: its last check and how old it is. A check hanging for more than
 * half its deadline says more than an older success: the API is hanging here.
 */
export function peerReport(
  node: string,
  last: ApiCheck | undefined,
  inFlightSince: number | undefined,
  apiTimeoutMs: number,
  now: number,
): PeerReport {
  const pending = inFlightSince === undefined ? 0 : now - inFlightSince;
  if (pending > apiTimeoutMs / 2) return { node, reachedApi: false, result: "pending", ageMs: 0 };
  return {
    node,
    reachedApi: last?.reached ?? false,
    result: last?.result ?? "no-client",
    ageMs: last ? Math.max(0, now - last.at) : Number.MAX_SAFE_INTEGER,
  };
}

export interface PeerEndpointOptions {
  nodeName: string;
  /** The node's current TLS material (the kubelet client certificate and the cluster CA). */
  tls: () => PeerTls | undefined;
  /** Address to listen on (default: all). */
  host: string | undefined;
  port: number;
  /** Nodes of the group, from the last Node list. */
  allowed: (node: string) => boolean;
  lastCheck: () => ApiCheck | undefined;
  /** When the API check in flight started, if one is. */
  inFlightSince: () => number | undefined;
  apiTimeoutMs: number;
  now: Clock;
  log: Logger;
}

export class PeerEndpoint {
  private readonly o: PeerEndpointOptions;
  private server: PeerServer | undefined;
  private tlsUsed: PeerTls | undefined;

  constructor(o: PeerEndpointOptions) {
    this.o = o;
  }

  /** Listening with the current certificate, or a warning and another try next round. */
  async ensure(): Promise<void> {
    const o = this.o;
    const tls = o.tls();
    if (!tls) return;
    if (this.server) {
      if (tls !== this.tlsUsed) {
        this.server.updateTls(tls);
        this.tlsUsed = tls;
      }
      return;
    }
    const host = o.host ?? "0.0.0.0";
    const server = new PeerServer({
      host,
      port: o.port,
      tls,
      allowed: o.allowed,
      report: () => peerReport(o.nodeName, o.lastCheck(), o.inFlightSince(), o.apiTimeoutMs, o.now()),
      onError: (msg) => o.log.warn(msg),
      now: o.now,
    });
    try {
      await server.start();
      this.server = server;
      this.tlsUsed = tls;
      o.log.info({ address: host, port: server.port }, "peer endpoint listening");
    } catch (err) {
      o.log.warn({ err: (err as Error).message }, "peer endpoint cannot listen; retrying next round");
    }
  }

  async stop(): Promise<void> {
    const s = this.server;
    this.server = undefined;
    this.tlsUsed = undefined;
    await s?.stop();
  }
}
