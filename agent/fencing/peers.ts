// Asking the agents of the other nodes of the group whether *they* reach the API, over mutual
// TLS with the nodes' own kubelet client certificates (CN=system:node:<name>, issued by the
// cluster CA). Those certificates carry the clientAuth usage only, so OpenSSL's chain check
// would refuse them as server certificates; both sides therefore skip the library's check and
// verify the peer themselves: issued and signed by the cluster CA, valid now, and the subject
// is system:node:<the node we meant to talk to> (client side) or a node of this group (server
// side). The TLS handshake proves the peer holds the certificate's key. No new PKI, nothing to
// distribute: every node that can talk to the API already has what it needs.
import { constants, X509Certificate } from "node:crypto";
import https from "node:https";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { TLSSocket } from "node:tls";
import type { ApiResult } from "./health.ts";
import { type Clock, systemClock } from "./clock.ts";

export interface PeerTls {
  cert: Buffer;
  key: Buffer;
  /** PEM of the cluster CA (one or more certificates). */
  ca: Buffer;
}

export interface Peer {
  name: string;
  address: string;
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
  /** Answered with a certificate that is not the node we asked. */
  | "bad-identity";

export interface PeerAnswer {
  node: string;
  outcome: PeerOutcome;
  detail?: string;
}

export const PEER_PATH = "/fencing/v1/api-reachability";

const PEM_CERT = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g;

const parsed = new WeakMap<Buffer, X509Certificate[]>();

/** The CA certificates in a PEM bundle (parsed once per buffer). */
export function parseCAs(pem: Buffer): X509Certificate[] {
  let cas = parsed.get(pem);
  if (!cas) {
    cas = (pem.toString("utf8").match(PEM_CERT) ?? []).map((c) => new X509Certificate(c));
    parsed.set(pem, cas);
  }
  return cas;
}

/** The node name a certificate proves, or why it proves none. */
export function nodeOfCertificate(
  cert: X509Certificate | undefined,
  cas: X509Certificate[],
  nowMs: number,
): { node: string } | { error: string } {
  if (!cert) return { error: "no certificate presented" };
  const issuer = cas.find((ca) => cert.checkIssued(ca) && cert.verify(ca.publicKey));
  if (!issuer) return { error: `certificate of ${cert.subject.replace(/\n/g, ",")} is not signed by the cluster CA` };
  if (Date.parse(cert.validFrom) > nowMs || Date.parse(cert.validTo) < nowMs)
    return { error: `certificate not valid now (valid ${cert.validFrom} to ${cert.validTo})` };
  const cn = /^CN=(.*)$/m.exec(cert.subject)?.[1];
  const orgs = [...cert.subject.matchAll(/^O=(.*)$/gm)].map((m) => m[1]);
  if (!cn?.startsWith("system:node:") || !orgs.includes("system:nodes"))
    return {
      error: `certificate subject ${cert.subject.replace(/\n/g, ",")} is not a node (system:node:<name>, O=system:nodes)`,
    };
  return { node: cn.slice("system:node:".length) };
}

export interface PeerServerOptions {
  host: string;
  port: number;
  tls: PeerTls;
  /** Nodes allowed to ask (the group's nodes from the last Node list). */
  allowed: (node: string) => boolean;
  /** This node's last API check, as a report. */
  report: () => PeerReport;
  onError?: (msg: string) => void;
  /** The clock certificates are checked against (fencing's one clock). */
  now?: Clock;
}

export class PeerServer {
  private readonly o: PeerServerOptions;
  private server: https.Server | undefined;
  private cas: X509Certificate[];

  constructor(o: PeerServerOptions) {
    this.o = o;
    this.cas = parseCAs(o.tls.ca);
  }

  get port(): number {
    const a = this.server?.address();
    return typeof a === "object" && a ? a.port : 0;
  }

  async start(): Promise<void> {
    const { cert, key } = this.o.tls;
    const server = https.createServer(
      {
        cert,
        key,
        // The cluster CA is named in the certificate request; it also spares the context the
        // system's root store (several MB of parsed certificates in a resident process).
        ca: this.o.tls.ca,
        requestCert: true,
        rejectUnauthorized: false,
        minVersion: "TLSv1.2",
        // No session resumption: a resumed session presents no certificate to check.
        secureOptions: constants.SSL_OP_NO_TICKET,
      },
      (req, res) => this.handle(req, res),
    );
    server.headersTimeout = 5000;
    server.requestTimeout = 5000;
    server.on("tlsClientError", () => undefined);
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(this.o.port, this.o.host, () => {
        server.off("error", reject);
        resolve();
      });
    });
    server.on("error", (err) => this.o.onError?.(`peer endpoint: ${err.message}`));
    this.server = server;
  }

  /** New certificate after a rotation: new connections use it. */
  updateTls(tls: PeerTls): void {
    this.cas = parseCAs(tls.ca);
    this.server?.setSecureContext({ cert: tls.cert, key: tls.key, ca: tls.ca });
  }

  async stop(): Promise<void> {
    const s = this.server;
    this.server = undefined;
    if (!s) return;
    s.closeAllConnections();
    await new Promise<void>((r) => s.close(() => r()));
  }

  private handle(req: IncomingMessage, res: ServerResponse): void {
    const reply = (status: number, body: unknown) => {
      const text = JSON.stringify(body);
      res.writeHead(status, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(text) });
      res.end(text);
    };
    const who = nodeOfCertificate(
      (req.socket as TLSSocket).getPeerX509Certificate(),
      this.cas,
      (this.o.now ?? systemClock)(),
    );
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
 * The identity each connection proved in its handshake. A kept-alive socket is checked once,
 * when it connects: Node does not give the peer certificate again on a reused socket.
 */
const proven = new WeakMap<object, ReturnType<typeof nodeOfCertificate>>();

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
      if (proven.has(sock)) return;
      sock.once("secureConnect", () =>
        proven.set(
          sock,
          nodeOfCertificate((sock as TLSSocket).getPeerX509Certificate(), cas, (o.now ?? systemClock)()),
        ),
      );
    });
    req.once("error", (err: NodeJS.ErrnoException) =>
      done({ outcome: "no-answer", detail: err.code ?? err.message, retry: req.reusedSocket }),
    );
    req.once("response", (res) => {
      const who = proven.get(res.socket) ?? { error: "no certificate presented" };
      if ("error" in who || who.node !== peer.name) {
        res.resume();
        return done({
          outcome: "bad-identity",
          detail: "error" in who ? who.error : `answered as ${who.node}`,
        });
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
