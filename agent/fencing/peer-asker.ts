// Asking the group's other agents, one round at a time: at most `maxPeers` of them (a random
// choice when there are more), in parallel, over connections kept open between rounds (a TLS
// handshake per peer per round costs CPU). peers.ts has the protocol.
import https from "node:https";
import type { Clock } from "./clock.ts";
import { askPeer, type Peer, type PeerAnswer, type PeerTls } from "./peers.ts";

export interface PeerAskerOptions {
  tls: () => PeerTls | undefined;
  port: number;
  /** Source address (the node's own peer address). */
  localAddress: string | undefined;
  maxPeers: number;
  timeoutMs: number;
  /** A report older than this does not count. */
  maxReportAgeMs: number;
  now: Clock;
}

export class PeerAsker {
  private readonly o: PeerAskerOptions;
  private kept: { tls: PeerTls; agent: https.Agent } | undefined;

  constructor(o: PeerAskerOptions) {
    this.o = o;
  }

  /** One answer per peer asked; never throws (every failure is an answer of its own kind). */
  async ask(peers: Peer[]): Promise<PeerAnswer[]> {
    const o = this.o;
    const tls = o.tls();
    const chosen = peers.length > o.maxPeers ? [...peers].sort(() => Math.random() - 0.5).slice(0, o.maxPeers) : peers;
    if (!tls)
      return chosen.map((p) => ({ node: p.name, outcome: "no-answer", detail: "no client certificate to ask with" }));
    const agent = this.agentFor(tls);
    return Promise.all(
      chosen.map((p) =>
        askPeer(p, {
          port: o.port,
          tls,
          timeoutMs: o.timeoutMs,
          localAddress: o.localAddress,
          maxReportAgeMs: o.maxReportAgeMs,
          agent,
          now: o.now,
        }),
      ),
    );
  }

  /** Closes the kept connections. */
  close(): void {
    this.kept?.agent.destroy();
    this.kept = undefined;
  }

  private agentFor(tls: PeerTls): https.Agent {
    if (this.kept?.tls === tls) return this.kept.agent;
    this.kept?.agent.destroy();
    const agent = new https.Agent({
      keepAlive: true,
      maxSockets: 1,
      // A resumed TLS session carries no peer certificate to check: full handshakes only.
      maxCachedSessions: 0,
      cert: tls.cert,
      ca: tls.ca,
      key: tls.key,
      rejectUnauthorized: false,
    });
    this.kept = { tls, agent };
    return agent;
  }
}
