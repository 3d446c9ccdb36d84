// The peer protocol: one agent asks another whether *it* reached the API in its last check,
// over mutual TLS. The answerer shows its kubelet serving certificate and counts only if that
// proves it is the Node asked, at the address asked; the asker shows its kubelet client
// certificate and is let in when it is a Node of the group (peer-identity.ts has both checks,
// done by hand: OpenSSL's own check would refuse the client certificates, which carry
// clientAuth only, and would use another clock). The handshake proves each side holds its
// certificate's key; session resumption is off, since a resumed session shows no certificate.
// The port caps what it holds (peer-limits.ts). No new PKI, nothing to distribute: the kubelet
// already has both certificates.
import { constants, type X509Certificate } from "node:crypto";
import https from "node:https";
import type { IncomingMessage, ServerResponse } from "node:http";
import net from "node:net";
import type { TLSSocket } from "node:tls";
import type { ApiResult } from "./health.ts";
import { type Clock, systemClock } from "./clock.ts";
import { askerIdentity, parseCAs, servingIdentityProblem } from "./peer-identity.ts";
import { ConnectionGate, type PeerLimits } from "./peer-limits.ts";
import type { ServingTls } from "./serving-cert.ts";

/** This node's kubelet client certificate (what it asks with) and the cluster CA. */
export interface PeerTls {
  /** The kubelet client certificate and key. */
  cert: Buffer;
  key: Buffer;
  /** PEM of the cluster CA (one or more certificates). */
  ca: Buffer;
}

export interface Peer {
  name: string;
  /** The IP address it is asked at (its Node's InternalIP, else an ExternalIP). */
  address: string;
  /** When its Node was created (ISO): a restarted agent admits the peers it takes over by the same rule. */
  createdAt?: string;
}

/** What one agent tells another. */
export interface PeerReport {
  node: string;
  /** The answering node reached the API in its last check. */
  reachedApi: boolean;
  result: ApiResult;
  /** How old that check is, in ms. */
  ageMs: number;
}

export type PeerOutcome =
  | "reaches-api"
  | "no-api"
  /** Answered, but its own last check is too old to count. */
  | "stale"
  | "no-answer"
  /** Answered without proving it is the Node asked at the address asked. */
  | "bad-identity";

export interface PeerAnswer {
  node: string;
  outcome: PeerOutcome;
  detail?: string;
}

export const PEER_PATH = "/fencing/v1/api-reachability";

export interface PeerServerOptions {
  host: string;
  port: number;
  /** This node's kubelet serving certificate: what proves the answer is this Node's. */
  serving: ServingTls;
  /** The cluster CA, which askers' certificates must be signed by. */
  ca: Buffer;
  /** Nodes allowed to ask (the group's nodes from the last Node list). */
  allowed: (node: string) => boolean;
  /** Addresses the group's Nodes report (their connections have their own pool). */
  isNodeAddress: (ip: string) => boolean;
  limits: PeerLimits;
  /** A connection the limits closed at once. */
  onRefused?: (limit: string) => void;
  /** This node's last API check, as a report. */
  report: () => PeerReport;
  onError?: (msg: string) => void;
  /** The clock certificates are checked against (fencing's one clock). */
  now?: Clock;
}

export class PeerServer {
  private readonly o: PeerServerOptions;
  private listener: net.Server | undefined;
  private tls: https.Server | undefined;
  private gate: ConnectionGate;
  private cas: X509Certificate[];
  private serving: ServingTls;
  private ca: Buffer;

  constructor(o: PeerServerOptions) {
    this.o = o;
    this.serving = o.serving;
    this.ca = o.ca;
    this.cas = parseCAs(o.ca);
    this.gate = new ConnectionGate(o.limits, o.isNodeAddress, o.onRefused);
  }

  get port(): number {
    const a = this.listener?.address();
    return typeof a === "object" && a ? a.port : 0;
  }

  /** Connections refused by the limits, by reason. */
  get refused(): ConnectionGate["refused"] {
    return this.gate.refused;
  }

  async start(): Promise<void> {
    // The listener is a plain TCP server: the gate decides before any TLS state exists, and
    // the TLS server behind it is made when the first connection is let in (peers ask only
    // while their API fails, so an idle node need not carry it).
    const listener = net.createServer((sock) => {
      if (this.gate.admit(sock)) this.tlsServer().emit("connection", sock);
    });
    await new Promise<void>((resolve, reject) => {
      listener.once("error", reject);
      listener.listen(this.o.port, this.o.host, () => {
        listener.off("error", reject);
        resolve();
      });
    });
    listener.on("error", (err) => this.o.onError?.(`peer endpoint: ${err.message}`));
    this.listener = listener;
  }

  private tlsServer(): https.Server {
    if (this.tls) return this.tls;
    const { limits } = this.o;
    const tls = https.createServer(
      {
        cert: this.serving.cert,
        key: this.serving.key,
        // The cluster CA is named in the certificate request; it also spares the context the
        // system's root store (several MB of parsed certificates in a resident process).
        ca: this.ca,
        requestCert: true,
        rejectUnauthorized: false,
        minVersion: "TLSv1.2",
        // No session resumption: a resumed session presents no certificate to check.
        secureOptions: constants.SSL_OP_NO_TICKET,
        handshakeTimeout: limits.firstRequestMs,
        maxHeaderSize: limits.maxHeaderBytes,
      },
      (req, res) => this.handle(req, res),
    );
    tls.keepAliveTimeout = limits.idleMs;
    tls.on("tlsClientError", () => undefined);
    this.tls = tls;
    return tls;
  }

  /** New certificates (a rotation): new connections use them. */
  updateTls(serving: ServingTls, ca: Buffer): void {
    this.cas = parseCAs(ca);
    this.serving = serving;
    this.ca = ca;
    this.tls?.setSecureContext({ cert: serving.cert, key: serving.key, ca });
  }

  async stop(): Promise<void> {
    const l = this.listener;
    this.listener = undefined;
    this.tls?.closeAllConnections();
    this.gate.closeAll();
    this.tls = undefined;
    if (l) await new Promise<void>((r) => l.close(() => r()));
  }

  private handle(req: IncomingMessage, res: ServerResponse): void {
    const sock = req.socket as TLSSocket;
    this.gate.requested(sock);
    res.once("finish", () => this.gate.answered(sock));
    const reply = (status: number, body: unknown, close = false) => {
      const text = JSON.stringify(body);
      res.writeHead(status, {
        "Content-Type": "application/json",
        "Content-Length": Buffer.byteLength(text),
        ...(close ? { Connection: "close" } : {}),
      });
      res.end(text);
    };
    // A peer's request is a GET without a body; anything else is closed, unread.
    const bodyLength = Number(req.headers["content-length"] ?? 0);
    if (req.headers["transfer-encoding"] !== undefined || bodyLength !== 0) {
      reply(413, { error: "a peer request has no body" }, true);
      return;
    }
    const who = askerIdentity(sock.getPeerX509Certificate(), this.cas, (this.o.now ?? systemClock)());
    if ("error" in who) reply(401, { error: who.error });
    else if (!this.o.allowed(who.node)) reply(403, { error: `node ${who.node} is not a peer of this group` });
    else if (req.method !== "GET" || req.url !== PEER_PATH) reply(404, { error: "not found" });
    else reply(200, this.o.report());
  }
}

export interface AskOptions {
  port: number;
  tls: PeerTls;
  timeoutMs: number;
  /** Source address for the connection (the node's own peer address). */
  localAddress?: string | undefined;
  /** A report older than this does not count. */
  maxReportAgeMs: number;
  /** A keep-alive agent with the same TLS material; without one, every ask is a new connection. */
  agent?: https.Agent;
  /** The clock certificates are checked against and the deadline is measured on (fencing's one clock). */
  now?: Clock;
}

/** Asks one peer; never throws: every failure is an answer of its own kind. */
export async function askPeer(peer: Peer, o: AskOptions): Promise<PeerAnswer> {
  const now = o.now ?? systemClock;
  const started = now();
  const first = await askOnce(peer, o);
  // A kept-alive connection the peer had closed (it restarted): ask again on a new one.
  const spent = now() - started;
  if (first.retry && spent < o.timeoutMs / 2) return askOnce(peer, { ...o, timeoutMs: o.timeoutMs - spent });
  const { retry: _retry, ...answer } = first;
  return answer;
}

/**
 * The certificate each connection showed in its handshake, checked on every answer against the
 * peer asked (Node does not give the peer certificate again on a reused socket).
 */
const shown = new WeakMap<object, X509Certificate | undefined>();

function askOnce(peer: Peer, o: AskOptions): Promise<PeerAnswer & { retry?: boolean }> {
  const cas = parseCAs(o.tls.ca);
  return new Promise((resolve) => {
    let settled = false;
    const done = (a: Omit<PeerAnswer, "node"> & { retry?: boolean }, keepSocket = false) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      if (!keepSocket) req.destroy();
      resolve({ node: peer.name, ...a });
    };
    const req = https.request({
      host: peer.address,
      port: o.port,
      path: PEER_PATH,
      method: "GET",
      cert: o.tls.cert,
      ca: o.tls.ca,
      key: o.tls.key,
      rejectUnauthorized: false,
      agent: o.agent ?? false,
      ...(o.localAddress ? { localAddress: o.localAddress } : {}),
    });
    const timer = setTimeout(
      () => done({ outcome: "no-answer", detail: `no answer within ${o.timeoutMs} ms` }),
      o.timeoutMs,
    );
    req.once("socket", (sock) => {
      if (shown.has(sock)) return;
      sock.once("secureConnect", () => shown.set(sock, (sock as TLSSocket).getPeerX509Certificate()));
    });
    req.once("error", (err: NodeJS.ErrnoException) =>
      done({ outcome: "no-answer", detail: err.code ?? err.message, retry: req.reusedSocket }),
    );
    req.once("response", (res) => {
      const problem = servingIdentityProblem(shown.get(res.socket), cas, (o.now ?? systemClock)(), peer);
      if (problem) {
        res.resume();
        return done({ outcome: "bad-identity", detail: problem });
      }
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (d: string) => {
        body += d;
        if (body.length > 4096) done({ outcome: "no-answer", detail: "answer too large" });
      });
      res.once("end", () => {
        if (res.statusCode !== 200)
          return done({ outcome: "no-answer", detail: `status ${res.statusCode}: ${body.slice(0, 200)}` });
        try {
          const r = JSON.parse(body) as PeerReport;
          if (typeof r.reachedApi !== "boolean" || typeof r.ageMs !== "number")
            return done({ outcome: "no-answer", detail: "malformed answer" });
          if (r.ageMs > o.maxReportAgeMs) return done({ outcome: "stale", detail: `last check ${r.ageMs} ms ago` });
          done({ outcome: r.reachedApi ? "reaches-api" : "no-api", detail: r.result }, true);
        } catch {
          done({ outcome: "no-answer", detail: "answer is not JSON" });
        }
      });
      res.once("error", (err) => done({ outcome: "no-answer", detail: err.message }));
    });
    req.end();
  });
}
