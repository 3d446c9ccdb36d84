// Who is asking, and what they may read.
//
// Authentication: behind the Kubernetes aggregator, the caller is the front proxy (a client
// certificate issued by the request-header CA, with an allowed CN) and the user and groups are
// in X-Remote-User / X-Remote-Group. Standalone, the caller presents its own client certificate
// (issued by --client-ca-file): CN = user, O = groups, as Kubernetes reads them.
//
// Authorization (stricter than Deckhouse, where any node reads any group):
//   system:masters                                  → every group
//   system:node:<n> in system:nodes                  → the group of Node <n> (its label)
//   system:bootstrappers:d8-node-manager:<group>     → that group (the extra group our bootstrap
//                                                      tokens carry next to Deckhouse's)
//   system:bootstrap:<id> in system:bootstrappers:d8-node-manager
//                                                    → the group in label
//                                                      node-manager.deckhouse.io/node-group of
//                                                      kube-system/bootstrap-token-<id> (tokens
//                                                      Deckhouse's own hook made)
//   anyone else                                      → nothing (403)
import type { X509Certificate } from "node:crypto";
import type { IncomingMessage } from "node:http";
import type { TLSSocket } from "node:tls";
import { tokenScope } from "../bootstrap-scope.ts";

export interface Identity {
  user: string;
  groups: string[];
  /** How the identity was established, for logs. */
  via: "front-proxy" | "client-certificate";
}

export { BOOTSTRAP_GROUP, BOOTSTRAP_GROUP_PREFIX } from "../bootstrap-scope.ts";

export interface AuthConfig {
  /** CAs whose direct leaf certificates may act as the front proxy. */
  requestHeaderCAs: X509Certificate[];
  /** Allowed front-proxy CNs; empty = any certificate from the request-header CA. */
  allowedNames: string[];
  /** CAs for end-user client certificates (standalone use). */
  clientCAs: X509Certificate[];
}

export class AuthError extends Error {
  override name = "AuthError";
}

function issuedBy(cert: X509Certificate, cas: X509Certificate[]): boolean {
  const now = Date.now();
  if (Date.parse(cert.validFrom) > now || Date.parse(cert.validTo) < now) return false;
  return cas.some((ca) => cert.checkIssued(ca) && cert.verify(ca.publicKey));
}

function subjectField(subject: string, key: string): string[] {
  return subject
    .split("\n")
    .filter((l) => l.startsWith(`${key}=`))
    .map((l) => l.slice(key.length + 1));
}

/** Peer certificates are parsed once per TLS connection, not per request. */
const peerCache = new WeakMap<TLSSocket, X509Certificate | null>();

function peerCertificate(socket: TLSSocket): X509Certificate | null {
  let cert = peerCache.get(socket);
  if (cert === undefined) {
    const raw = socket.getPeerX509Certificate?.();
    cert = raw ?? null;
    peerCache.set(socket, cert);
  }
  return cert;
}

const verdictCache = new WeakMap<object, "front-proxy" | Identity | null>();

/** What identifies the TLS connection: the HTTP/2 session (its socket proxy is new per stream) or the socket. */
const connectionOf = (req: IncomingMessage): object =>
  (req as unknown as { stream?: { session?: object } }).stream?.session ?? req.socket;

/**
 * The identity behind a request, or undefined when it presented nothing usable.
 * Throws AuthError when a certificate was presented but is not acceptable.
 */
export function authenticate(req: IncomingMessage, cfg: AuthConfig): Identity | undefined {
  const socket = req.socket as TLSSocket;
  const conn = connectionOf(req);
  let verdict = verdictCache.get(conn);
  if (verdict === undefined) {
    const cert = peerCertificate(socket);
    verdict = null;
    if (cert) {
      const cn = subjectField(cert.subject, "CN")[0] ?? "";
      if (cfg.requestHeaderCAs.length && issuedBy(cert, cfg.requestHeaderCAs)) {
        if (cfg.allowedNames.length && !cfg.allowedNames.includes(cn)) {
          throw new AuthError(`front-proxy certificate CN '${cn}' is not in the allowed names`);
        }
        verdict = "front-proxy";
      } else if (cfg.clientCAs.length && issuedBy(cert, cfg.clientCAs)) {
        verdict = { user: cn, groups: subjectField(cert.subject, "O"), via: "client-certificate" };
      } else {
        throw new AuthError(`client certificate '${cn}' is not issued by a trusted CA`);
      }
    }
    verdictCache.set(conn, verdict);
  }
  if (verdict === null) return undefined;
  if (verdict !== "front-proxy") return verdict;
  const user = req.headers["x-remote-user"];
  if (typeof user !== "string" || !user) return { user: "", groups: [], via: "front-proxy" };
  // The aggregator sends one X-Remote-Group header per group; rawHeaders keeps them apart
  // under both HTTP/1.1 and HTTP/2. A value is one group, commas and all, as Kubernetes reads
  // it: splitting would turn a group named "dev,system:masters" into system:masters.
  const groups: string[] = [];
  const raw = req.rawHeaders;
  for (let i = 0; i + 1 < raw.length; i += 2) {
    if (raw[i]!.toLowerCase() === "x-remote-group" && raw[i + 1]) groups.push(raw[i + 1]!);
  }
  return { user, groups, via: "front-proxy" };
}

/** Which groups an identity may read: "all", or a set (possibly empty). */
export type Scope = "all" | ReadonlySet<string>;

export async function scopeOf(
  id: Identity,
  nodeGroupOf: (node: string) => Promise<string | undefined>,
  tokenGroupOf?: (tokenId: string) => Promise<string | undefined>,
): Promise<Scope> {
  if (id.groups.includes("system:masters")) return "all";
  const token = tokenScope(id.user, id.groups);
  const groups = token.groups;
  if (token.lookupTokenId && tokenGroupOf) {
    const group = await tokenGroupOf(token.lookupTokenId);
    if (group) groups.add(group);
  }
  if (id.user.startsWith("system:node:") && id.groups.includes("system:nodes")) {
    const group = await nodeGroupOf(id.user.slice("system:node:".length));
    if (group) groups.add(group);
  }
  return groups;
}

export const inScope = (scope: Scope, group: string): boolean => scope === "all" || scope.has(group);
