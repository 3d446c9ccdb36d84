// What the peer port holds, bounded: connections at once (from the group's Nodes' addresses,
// from anywhere else, from one address), new connections from elsewhere per second, and how
// long a connection may take to show a request (TLS handshake included) and may then sit idle.
// A connection over a limit is closed before its TLS handshake starts, so a flood costs an
// accept and a close, no key exchange and no TLS state. Addresses of the group's Nodes have
// their own pool: strangers filling theirs leave room for the peers (who ask from the address
// their Node reports, --fencing-address). Nothing here waits: every step is a counter or a timer.
import type { Socket } from "node:net";
import { canonicalIp } from "./peer-identity.ts";

export interface PeerLimits {
  /** Connections at once from addresses the group's Nodes report. */
  maxFromNodes: number;
  /** Connections at once from any other address. */
  maxFromOthers: number;
  /** Connections at once from one address. */
  perAddress: number;
  /** New connections per second from addresses that are not the group's Nodes'. */
  newFromOthersPerSecond: number;
  /** A new connection must finish its TLS handshake and send a whole request within this. */
  firstRequestMs: number;
  /** After an answer, the next request must come within this, or the connection is closed. */
  idleMs: number;
  /** Largest request head (request line and headers); a peer's request is one short GET. */
  maxHeaderBytes: number;
}

/**
 * Defaults for the timings in use: a peer asks once per round (a check interval, or the API
 * and peer deadlines when longer), so a kept-alive connection idles about that long between
 * two asks; a handshake and a request fit in the asker's own peer deadline.
 */
export function peerLimits(o: { peerTimeoutMs: number; roundMs: number }): PeerLimits {
  return {
    maxFromNodes: 64,
    maxFromOthers: 16,
    perAddress: 4,
    newFromOthersPerSecond: 20,
    firstRequestMs: Math.max(1_000, o.peerTimeoutMs),
    idleMs: 2 * o.roundMs + 1_000,
    maxHeaderBytes: 4096,
  };
}

interface Held {
  sock: Socket;
  address: string;
  fromNode: boolean;
  timer: NodeJS.Timeout;
}

export class ConnectionGate {
  private readonly limits: PeerLimits;
  private readonly isNodeAddress: (ip: string) => boolean;
  private readonly held = new Map<string, Held>();
  private readonly perAddress = new Map<string, number>();
  private fromNodes = 0;
  private fromOthers = 0;
  private windowStart = 0;
  private newInWindow = 0;
  /** Connections refused since start, by reason (for the log line and the tests). */
  readonly refused = { total: 0, perAddress: 0, fromNodes: 0, fromOthers: 0, rate: 0 };

  private readonly onRefused: ((limit: string) => void) | undefined;

  constructor(limits: PeerLimits, isNodeAddress: (ip: string) => boolean, onRefused?: (limit: string) => void) {
    this.limits = limits;
    this.isNodeAddress = isNodeAddress;
    this.onRefused = onRefused;
  }

  get open(): number {
    return this.held.size;
  }

  /** Takes a new connection in (true), or closes it at once (false). */
  admit(sock: Socket, now = Date.now()): boolean {
    const l = this.limits;
    const address = canonicalIp(sock.remoteAddress ?? "") ?? String(sock.remoteAddress);
    const key = keyOf(sock);
    const fromNode = this.isNodeAddress(address);
    const refuse = (why: keyof ConnectionGate["refused"]) => {
      this.refused[why]++;
      this.refused.total++;
      this.onRefused?.(why);
      sock.destroy();
      return false;
    };
    if (key === undefined) return refuse("fromOthers");
    if ((this.perAddress.get(address) ?? 0) >= l.perAddress) return refuse("perAddress");
    if (fromNode) {
      if (this.fromNodes >= l.maxFromNodes) return refuse("fromNodes");
    } else {
      if (this.fromOthers >= l.maxFromOthers) return refuse("fromOthers");
      if (now - this.windowStart >= 1000) {
        this.windowStart = now;
        this.newInWindow = 0;
      }
      if (this.newInWindow >= l.newFromOthersPerSecond) return refuse("rate");
      this.newInWindow++;
    }
    this.perAddress.set(address, (this.perAddress.get(address) ?? 0) + 1);
    if (fromNode) this.fromNodes++;
    else this.fromOthers++;
    const timer = setTimeout(() => sock.destroy(), l.firstRequestMs);
    timer.unref();
    this.held.set(key, { sock, address, fromNode, timer });
    sock.on("error", () => undefined);
    sock.once("close", () => this.release(key));
    return true;
  }

  /** A request arrived on the connection: it has this long to be answered. */
  requested(sock: Socket): void {
    this.rearm(sock, this.limits.firstRequestMs);
  }

  /** An answer went out: the connection may idle this long for the next request. */
  answered(sock: Socket): void {
    this.rearm(sock, this.limits.idleMs);
  }

  /** Closes every connection (the endpoint stops). */
  closeAll(): void {
    for (const h of [...this.held.values()]) h.sock.destroy();
  }

  private rearm(sock: Socket, ms: number): void {
    const key = keyOf(sock);
    const h = key === undefined ? undefined : this.held.get(key);
    if (!h) return;
    clearTimeout(h.timer);
    h.timer = setTimeout(() => sock.destroy(), ms);
    h.timer.unref();
  }

  private release(key: string): void {
    const h = this.held.get(key);
    if (!h) return;
    clearTimeout(h.timer);
    this.held.delete(key);
    const n = (this.perAddress.get(h.address) ?? 1) - 1;
    if (n > 0) this.perAddress.set(h.address, n);
    else this.perAddress.delete(h.address);
    if (h.fromNode) this.fromNodes--;
    else this.fromOthers--;
  }
}

/**
 * A connection's key: its remote address and port, which the raw socket and the TLS socket
 * wrapping it report alike (the gate sees the one, the request handler the other).
 */
function keyOf(sock: Socket): string | undefined {
  if (!sock.remoteAddress || sock.remotePort === undefined) return undefined;
  return `${sock.remoteAddress}|${sock.remotePort}`;
}
