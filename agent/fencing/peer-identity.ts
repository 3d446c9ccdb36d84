// Who is at the other end of a peer connection, from its certificate, checked by hand against
// the cluster CA on fencing's one clock (OpenSSL's own check would use another clock, and would
// refuse the kubelet client certificates the askers present: they carry clientAuth only).
//
// - An answer counts only from the Node that was asked, proven by its kubelet *serving*
//   certificate: signed by the cluster CA, valid now, for server use, subject
//   system:node:<that Node> in system:nodes, and naming the address that was asked. The
//   cluster's serving approver signs such a certificate only for addresses that Node alone
//   reports and that are not the API server's (cluster/controllers/kubelet-serving.ts), so it
//   binds the name to the address: a Node that reports another machine's address gets no
//   certificate for it, and a machine at an address cannot answer as another Node. The kubelet
//   client certificate does not do that: it names a node but no address, and any holder of a
//   bootstrap token can have one made for a new name.
// - An asker shows its kubelet client certificate (system:node:<name>), and the endpoint lets
//   in the Nodes of its group. What it learns (whether this node reached the API) is no secret;
//   the check keeps strangers from using the endpoint at all.
import { isIPv4, isIPv6 } from "node:net";
import { X509Certificate } from "node:crypto";

const PEM_CERT = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g;
const SERVER_AUTH = "1.3.6.1.5.5.7.3.1";
const NODE_PREFIX = "system:node:";

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

/**
 * One spelling per IP address, as the serving approver compares them: IPv4 dotted (an
 * IPv4-mapped IPv6 address is the IPv4 address it maps), IPv6 compressed lowercase. Undefined
 * for anything else (a host name, an IPv6 zone): a peer is asked at an IP address only.
 */
export function canonicalIp(a: string): string | undefined {
  const s = a.trim().toLowerCase();
  if (isIPv4(s)) return s;
  if (!isIPv6(s) || s.includes("%")) return undefined;
  let h: string;
  try {
    h = new URL(`http://[${s}]/`).hostname.slice(1, -1);
  } catch {
    return undefined;
  }
  const mapped = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(h);
  if (!mapped) return h;
  const hi = Number.parseInt(mapped[1] ?? "0", 16);
  const lo = Number.parseInt(mapped[2] ?? "0", 16);
  return `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`;
}

const oneLine = (subject: string) => subject.replace(/\n/g, ",");

/** Signed by the cluster CA and valid at `nowMs`, or why not. */
function chainProblem(cert: X509Certificate, cas: X509Certificate[], nowMs: number): string | undefined {
  if (!cas.some((ca) => cert.checkIssued(ca) && cert.verify(ca.publicKey)))
    return `certificate of ${oneLine(cert.subject)} is not signed by the cluster CA`;
  if (Date.parse(cert.validFrom) > nowMs || Date.parse(cert.validTo) < nowMs)
    return `certificate not valid now (valid ${cert.validFrom} to ${cert.validTo})`;
  return undefined;
}

/** The node a certificate's subject names (CN=system:node:<name>, O=system:nodes), or undefined. */
export function nodeOfSubject(cert: X509Certificate): string | undefined {
  const cn = /^CN=(.*)$/m.exec(cert.subject)?.[1];
  const orgs = [...cert.subject.matchAll(/^O=(.*)$/gm)].map((m) => m[1]);
  if (!cn?.startsWith(NODE_PREFIX) || !orgs.includes("system:nodes")) return undefined;
  return cn.slice(NODE_PREFIX.length);
}

/** The node an asker's certificate proves (its kubelet client certificate), or why it proves none. */
export function askerIdentity(
  cert: X509Certificate | undefined,
  cas: X509Certificate[],
  nowMs: number,
): { node: string } | { error: string } {
  if (!cert) return { error: "no certificate presented" };
  const problem = chainProblem(cert, cas, nowMs);
  if (problem) return { error: problem };
  const node = nodeOfSubject(cert);
  if (node === undefined)
    return { error: `certificate subject ${oneLine(cert.subject)} is not a node (system:node:<name>, O=system:nodes)` };
  return { node };
}

/** Whether the certificate names `ip` (either spelling of an IPv4 address). */
export function namesIp(cert: X509Certificate, ip: string): boolean {
  if (cert.checkIP(ip) !== undefined) return true;
  return isIPv4(ip) && cert.checkIP(`::ffff:${ip}`) !== undefined;
}

/**
 * Why an answering peer's certificate does not prove it is Node `peer.name` at `peer.address`
 * (its kubelet serving certificate), or undefined when it does.
 */
export function servingIdentityProblem(
  cert: X509Certificate | undefined,
  cas: X509Certificate[],
  nowMs: number,
  peer: { name: string; address: string },
): string | undefined {
  if (!cert) return "no certificate presented";
  // First what an asker's certificate must show (the cluster CA, valid now, a node's subject).
  const who = askerIdentity(cert, cas, nowMs);
  if ("error" in who) return who.error;
  if (who.node !== peer.name) return `answered as ${who.node}`;
  if (!(cert.keyUsage ?? []).includes(SERVER_AUTH))
    return "not a serving certificate (no serverAuth usage): a kubelet client certificate proves no address";
  if (!namesIp(cert, peer.address))
    return `its serving certificate does not name ${peer.address} (names ${cert.subjectAltName ?? "nothing"})`;
  return undefined;
}
