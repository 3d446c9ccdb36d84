// The API check's request, on a connection of its own: every check interval, forever, on every
// node, one GET of the node's kubelet Lease. Through Node's http client (KubeClient) that GET
// cost about 1 ms of CPU on this 2-vCPU machine, most of it the client's machinery (request and
// response objects, streams, the agent's pool), so fencing's idle cost was mostly its checks;
// on a TLS socket of its own, written and read here, it costs about a third of that. The
// connection is also the check's alone: a request of the converge daemon's or a watch holding
// KubeClient's pool never queues the check behind it.
//
// Only what that one request needs: HTTP/1.1 keep-alive, one request at a time, a body of a
// known length or chunked, at most MAX_BYTES. TLS is verified as KubeClient verifies it
// (the kubeconfig's CA, the server's name or tls-server-name). Failures are the KubeErrors the
// rest of the agent classifies (lib/kube/errors.ts).
import { isIP } from "node:net";
import tls from "node:tls";
import type { KubeConnection } from "../../lib/kube/kubeconfig.ts";
import { statusError } from "../../lib/kube/client.ts";
import { classifyTransportError, type KubeError, KubeTimeoutError } from "../../lib/kube/errors.ts";

/** A Lease is a few hundred bytes; anything this large is not the answer to this request. */
const MAX_BYTES = 64 * 1024;

export interface ProbeResponse {
  status: number;
  body: Buffer;
}

/** One parsed response, or undefined while incomplete; throws on a malformed one. */
export function parseResponse(buf: Buffer): { response: ProbeResponse; keepAlive: boolean; used: number } | undefined {
  const headEnd = buf.indexOf("\r\n\r\n");
  if (headEnd < 0) {
    if (buf.length > MAX_BYTES) throw new Error("response head too large");
    return undefined;
  }
  const head = buf.subarray(0, headEnd).toString("latin1").split("\r\n");
  const status = /^HTTP\/1\.([01]) (\d{3})/.exec(head[0] ?? "");
  if (!status) throw new Error(`not an HTTP/1.1 response: ${JSON.stringify((head[0] ?? "").slice(0, 40))}`);
  const headers = new Map<string, string>();
  for (const line of head.slice(1)) {
    const colon = line.indexOf(":");
    if (colon > 0) headers.set(line.slice(0, colon).trim().toLowerCase(), line.slice(colon + 1).trim());
  }
  const keepAlive = status[1] === "1" && !/\bclose\b/i.test(headers.get("connection") ?? "");
  const bodyStart = headEnd + 4;
  let body: Buffer;
  let used: number;
  if (/\bchunked\b/i.test(headers.get("transfer-encoding") ?? "")) {
    const parts: Buffer[] = [];
    let at = bodyStart;
    for (;;) {
      const lineEnd = buf.indexOf("\r\n", at);
      if (lineEnd < 0) return undefined;
      const size = Number.parseInt(buf.subarray(at, lineEnd).toString("latin1").split(";")[0] ?? "", 16);
      if (!Number.isFinite(size) || size < 0) throw new Error("malformed chunk size");
      if (size === 0) {
        // No trailers are sent for this request; the last chunk ends with an empty line.
        if (buf.length < lineEnd + 4) return undefined;
        used = lineEnd + 4;
        break;
      }
      if (buf.length < lineEnd + 2 + size + 2) return undefined;
      parts.push(buf.subarray(lineEnd + 2, lineEnd + 2 + size));
      at = lineEnd + 2 + size + 2;
    }
    body = Buffer.concat(parts);
  } else {
    const length = Number(headers.get("content-length"));
    if (!Number.isInteger(length) || length < 0) throw new Error("response without a length");
    if (length > MAX_BYTES) throw new Error(`response of ${length} bytes is too large`);
    if (buf.length < bodyStart + length) return undefined;
    body = Buffer.from(buf.subarray(bodyStart, bodyStart + length));
    used = bodyStart + length;
  }
  return { response: { status: Number(status[2]), body }, keepAlive, used };
}

export class LeaseProbe {
  readonly url: string;
  private readonly conn: KubeConnection;
  private readonly host: string;
  private readonly port: number;
  private readonly request: Buffer;
  private sock: tls.TLSSocket | undefined;

  /** `path`: the request path on the server (the node's Lease). */
  constructor(conn: KubeConnection, path: string) {
    const u = new URL(conn.server);
    this.conn = conn;
    this.host = u.hostname.replace(/^\[(.*)\]$/, "$1");
    this.port = Number(u.port || 443);
    const fullPath = `${u.pathname.replace(/\/+$/, "")}${path}`;
    this.url = `${conn.server}${path}`;
    this.request = Buffer.from(
      `GET ${fullPath} HTTP/1.1\r\nHost: ${u.host}\r\nAccept: application/json\r\nUser-Agent: bashible-fencing\r\n` +
        (conn.token ? `Authorization: Bearer ${conn.token}\r\n` : "") +
        "\r\n",
      "latin1",
    );
  }

  /** One GET with a deadline for all of it (connect, TLS, answer); rejects with a KubeError. */
  async get(timeoutMs: number): Promise<ProbeResponse> {
    const started = Date.now();
    const first = await this.attempt(timeoutMs);
    if (!("retry" in first)) return first;
    // A kept-alive connection the server had closed meanwhile (an idle timeout, a restart): it
    // answered nothing, so ask once more on a new one, within what is left of the deadline.
    const left = timeoutMs - (Date.now() - started);
    if (left <= 0) throw first.retry;
    const second = await this.attempt(left);
    if ("retry" in second) throw second.retry;
    return second;
  }

  private attempt(timeoutMs: number): Promise<ProbeResponse | { retry: KubeError }> {
    return new Promise((resolve, reject) => {
      const reused = this.sock !== undefined;
      const sock = this.sock ?? this.connect();
      this.sock = sock;
      let buf: Buffer = Buffer.alloc(0);
      const finish = (err: KubeError | undefined, res?: ProbeResponse, keepAlive = false) => {
        clearTimeout(timer);
        sock.off("data", onData);
        sock.off("error", onError);
        sock.off("close", onClose);
        if (!keepAlive || err) this.drop(sock);
        if (!err) resolve(res as ProbeResponse);
        else if (reused && buf.length === 0 && err.kind !== "timeout") resolve({ retry: err });
        else reject(err);
      };
      const onData = (d: Buffer) => {
        buf = buf.length ? Buffer.concat([buf, d]) : d;
        try {
          const parsed = parseResponse(buf);
          if (!parsed) return;
          // Anything after the answer is not ours: the connection is not used again.
          finish(undefined, parsed.response, parsed.keepAlive && parsed.used === buf.length);
        } catch (err) {
          finish(classifyTransportError(err as NodeJS.ErrnoException, this.url));
        }
      };
      const onError = (err: NodeJS.ErrnoException) => finish(classifyTransportError(err, this.url));
      const onClose = () =>
        finish(
          classifyTransportError(
            Object.assign(new Error("connection closed before an answer"), { code: "ECONNRESET" }),
            this.url,
          ),
        );
      const timer = setTimeout(
        () => finish(new KubeTimeoutError(`GET ${this.url}: no answer within ${timeoutMs} ms`, this.url)),
        timeoutMs,
      );
      sock.on("data", onData);
      sock.once("error", onError);
      sock.once("close", onClose);
      sock.write(this.request);
    });
  }

  close(): void {
    if (this.sock) this.drop(this.sock);
  }

  private connect(): tls.TLSSocket {
    const c = this.conn;
    const sock = tls.connect({
      host: this.host,
      port: this.port,
      ca: c.ca,
      ...(c.cert ? { cert: c.cert } : {}),
      ...(c.key ? { key: c.key } : {}),
      // As https does: SNI for a name, none for an address; the certificate is checked
      // against the server's name or address, or the kubeconfig's tls-server-name.
      ...(c.tlsServerName ? { servername: c.tlsServerName } : isIP(this.host) ? {} : { servername: this.host }),
      ALPNProtocols: ["http/1.1"],
    });
    // Between checks nothing listens: a late error must not end the process.
    sock.on("error", () => undefined);
    sock.once("close", () => {
      if (this.sock === sock) this.sock = undefined;
    });
    return sock;
  }

  private drop(sock: tls.TLSSocket): void {
    if (this.sock === sock) this.sock = undefined;
    sock.destroy();
  }
}

/** The answer as KubeClient.request would give it: the JSON body, or a KubeStatusError. */
export function jsonOf<T>(res: ProbeResponse, url: string): T {
  if (res.status < 200 || res.status >= 300) throw statusError("GET", url, res);
  return JSON.parse(res.body.toString("utf8")) as T;
}
