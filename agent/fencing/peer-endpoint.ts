// The peer endpoint: answers the other agents of the group with this node's last API check
// (peers.ts has the protocol and the mutual TLS). It starts once the node has its kubelet
// serving certificate (what proves the answer is this Node's) and the cluster CA, takes rotated
// ones for new connections, and retries a failed listen next round.
import type { Logger } from "../../lib/log/log.ts";
import type { Clock } from "./clock.ts";
import type { ApiCheck } from "./health.ts";
import type { FencingMetrics } from "./metrics.ts";
import type { PeerLimits } from "./peer-limits.ts";
import { type PeerReport, PeerServer, type PeerTls } from "./peers.ts";
import type { ServingTls } from "./serving-cert.ts";

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
  /** This node's kubelet serving certificate, when it has one. */
  serving: () => Promise<ServingTls | undefined>;
  limits: PeerLimits;
  /** Addresses the group's Nodes report. */
  isNodeAddress: (ip: string) => boolean;
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
  metrics: FencingMetrics;
}

export class PeerEndpoint {
  private readonly o: PeerEndpointOptions;
  private server: PeerServer | undefined;
  private used: { ca: Buffer; serving: ServingTls } | undefined;

  constructor(o: PeerEndpointOptions) {
    this.o = o;
  }

  /** Listening with the current certificate, or a warning and another try next round. */
  async ensure(): Promise<void> {
    const o = this.o;
    const ca = o.tls()?.ca;
    const serving = await o.serving();
    if (!ca || !serving) return;
    if (this.server) {
      if (ca !== this.used?.ca || serving !== this.used.serving) {
        this.server.updateTls(serving, ca);
        this.used = { ca, serving };
      }
      return;
    }
    const host = o.host ?? "0.0.0.0";
    const server = new PeerServer({
      host,
      port: o.port,
      serving,
      ca,
      allowed: o.allowed,
      isNodeAddress: o.isNodeAddress,
      limits: o.limits,
      onRefused: (limit) => o.metrics.peerRefused.inc({ limit }),
      report: () => peerReport(o.nodeName, o.lastCheck(), o.inFlightSince(), o.apiTimeoutMs, o.now()),
      onError: (msg) => o.log.warn(msg),
      now: o.now,
    });
    try {
      await server.start();
      this.server = server;
      this.used = { ca, serving };
      o.log.info({ address: host, port: server.port }, "peer endpoint listening");
    } catch (err) {
      o.log.warn({ err: (err as Error).message }, "peer endpoint cannot listen; retrying next round");
    }
  }

  /** Connections the limits refused (undefined while not listening). */
  get refused(): PeerServer["refused"] | undefined {
    return this.server?.refused;
  }

  async stop(): Promise<void> {
    const s = this.server;
    this.server = undefined;
    this.used = undefined;
    await s?.stop();
  }
}
