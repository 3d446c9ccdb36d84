// The registry-packages proxy: nodes ask `GET /package?digest=sha256:…&repository=…` with a
// bearer token, where the digest names the package's image manifest (as in Deckhouse). The proxy
// pulls that manifest from an OCI distribution registry, verifies its sha256, then the manifest's
// last layer, verifies that too, caches both on disk by digest, and streams the layer with the
// manifest in header X-Package-Manifest (base64), so the node can verify the whole chain itself.
// One upstream fetch per digest however many nodes ask at once (in-flight fetches are shared).
// Bytes that do not hash to their digest (tampered, truncated) are never cached and never
// served: 502.
//
// The proxy serves a blob only after the whole of it is verified and cached, so no node ever
// receives bytes that the proxy has not checked (nodes check again: the design trusts no hop).
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import { createReadStream } from "node:fs";
import { mkdir, open, readFile, rename, rm, stat } from "node:fs/promises";
import type { IncomingMessage, ServerResponse } from "node:http";
import https from "node:https";
import type { AddressInfo } from "node:net";
import path from "node:path";
import got, { HTTPError, RequestError } from "got";
import type { Logger } from "../../lib/log/log.ts";
import { fsyncDir } from "../../lib/atomic-write.ts";
import { PACKAGE_MANIFEST_HEADER } from "../../bundles/names.ts";
import {
  DEFAULT_LISTENER_LIMITS,
  hasBody,
  limitConnections,
  type ListenerLimits,
  refuseBody,
  tlsServerOptions,
} from "../listener-limits.ts";

export const DIGEST_RE = /^sha256:[0-9a-f]{64}$/;
/**
 * An image manifest is a few hundred bytes; registries accept up to 4 MiB (the OCI distribution
 * spec's floor). More is not a package's manifest, and is never read past this.
 */
export const MAX_MANIFEST_BYTES = 4 << 20;
/** OCI distribution repository name (path components of lowercase alphanumerics and separators). */
export const REPOSITORY_RE = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:\/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$/;

export interface UpstreamOptions {
  /** Registry base URL, e.g. https://registry.example.com or http://127.0.0.1:5000. */
  url: string;
  /** PEM bundle to verify the registry's certificate (https only). */
  ca?: string | undefined;
  username?: string | undefined;
  /** A secret: never logged. */
  password?: string | undefined;
  /** Deadline per upstream attempt (default 10 min: packages can be large). */
  timeoutMs?: number;
  /** Attempts per fetch on network errors and 408/429/5xx (default 3). */
  attempts?: number;
}

export interface ProxyOptions {
  upstream: UpstreamOptions;
  cacheDir: string;
  /** The bearer token nodes present; a secret. */
  token: string;
  tls: { cert: string; key: string };
  /** Used when a request names no repository. */
  defaultRepository?: string | undefined;
  log: Logger;
  /** Connection cap and timeouts (cluster/listener-limits.ts); the defaults when not given. */
  limits?: Partial<ListenerLimits>;
}

export interface ProxyStats {
  requests: number;
  /** 200 answers. */
  served: number;
  upstreamFetches: number;
  cacheHits: number;
  notModified: number;
  /** 401 answers (no or wrong token). */
  refused: number;
  /** Blobs not served: upstream error, verification failure, not found. */
  failed: number;
}

export interface PackagesProxy {
  url: string;
  port: number;
  /** A snapshot of the counters. */
  readonly stats: ProxyStats;
  close(): Promise<void>;
}

/** The upstream answered, but not with the blob asked for. */
export class UpstreamError extends Error {
  override name = "UpstreamError";
  readonly status: number;
  constructor(message: string, status = 502) {
    super(message);
    this.status = status;
  }
}

const RETRY_STATUS = new Set([408, 429, 500, 502, 503, 504]);
const MANIFEST_TYPES = [
  "application/vnd.oci.image.manifest.v1+json",
  "application/vnd.docker.distribution.manifest.v2+json",
].join(", ");
const RETRY_CODES = new Set(["ETIMEDOUT", "ECONNRESET", "ECONNREFUSED", "EPIPE", "EAI_AGAIN", "ENETUNREACH"]);

function sameSecret(a: string, b: string): boolean {
  const ha = createHash("sha256").update(a).digest();
  const hb = createHash("sha256").update(b).digest();
  return timingSafeEqual(ha, hb) && a.length === b.length;
}

export class BlobCache {
  readonly dir: string;
  private readonly inflight = new Map<string, Promise<string>>();
  private readonly upstream: UpstreamOptions;
  private readonly log: Logger;
  private bearer = new Map<string, string>();
  fetches = 0;
  /** Digests whose cache file this process has hashed (fetched, or served whole once). */
  readonly verified = new Set<string>();

  constructor(dir: string, upstream: UpstreamOptions, log: Logger) {
    this.dir = dir;
    this.upstream = upstream;
    this.log = log;
  }

  file(digest: string): string {
    const hex = digest.slice("sha256:".length);
    return path.join(this.dir, "sha256", hex.slice(0, 2), hex);
  }

  /**
   * The verified manifest's bytes and its last layer (the package's layer): digest and the size
   * the manifest declares, which is all of the layer the proxy will ever read.
   */
  async manifest(
    repository: string,
    digest: string,
  ): Promise<{ bytes: Buffer; layer: string; layerSize: number; hit: boolean }> {
    let got = await this.get(repository, digest, "manifest", MAX_MANIFEST_BYTES);
    let bytes = await readFile(got.file);
    if (!this.verified.has(digest) && `sha256:${createHash("sha256").update(bytes).digest("hex")}` !== digest) {
      // Rotted on disk since an earlier run cached it: fetch it again.
      this.log.error({ digest, file: got.file }, "cached manifest does not match its digest; fetching it again");
      await rm(got.file, { force: true });
      got = await this.get(repository, digest, "manifest", MAX_MANIFEST_BYTES);
      bytes = await readFile(got.file);
    }
    this.verified.add(digest);
    let layers: { digest?: unknown; size?: unknown }[] | undefined;
    try {
      layers = (JSON.parse(bytes.toString("utf8")) as { layers?: { digest?: unknown; size?: unknown }[] }).layers;
    } catch {
      throw new UpstreamError(`${repository}@${digest} is not a JSON image manifest`, 422);
    }
    const last = layers?.[layers.length - 1];
    const layer = last?.digest;
    if (typeof layer !== "string" || !DIGEST_RE.test(layer)) {
      throw new UpstreamError(`${repository}@${digest} names no layer (an image index? a package is one image)`, 422);
    }
    const layerSize = last?.size;
    if (typeof layerSize !== "number" || !Number.isSafeInteger(layerSize) || layerSize < 0) {
      throw new UpstreamError(`${repository}@${digest}: its layer ${layer} declares no size`, 422);
    }
    return { bytes, layer, layerSize, hit: got.hit };
  }

  /** Path of the verified cached blob or manifest, fetching it once (shared by concurrent callers). */
  async get(
    repository: string,
    digest: string,
    kind: "blob" | "manifest",
    maxBytes: number,
  ): Promise<{ file: string; hit: boolean }> {
    const file = this.file(digest);
    if (
      await stat(file).then(
        (s) => s.isFile(),
        () => false,
      )
    )
      return { file, hit: true };
    let p = this.inflight.get(digest);
    if (!p) {
      p = this.fetch(repository, digest, file, kind, maxBytes).finally(() => this.inflight.delete(digest));
      this.inflight.set(digest, p);
    }
    return { file: await p, hit: false };
  }

  private async fetch(
    repository: string,
    digest: string,
    file: string,
    kind: "blob" | "manifest",
    maxBytes: number,
  ): Promise<string> {
    this.fetches++;
    const attempts = this.upstream.attempts ?? 3;
    let last: unknown;
    for (let attempt = 1; attempt <= attempts; attempt++) {
      try {
        return await this.fetchOnce(repository, digest, file, kind, maxBytes);
      } catch (err) {
        last = err;
        if (!retryable(err) || attempt === attempts) break;
        const delay = Math.min(2 ** (attempt - 1) * 500, 5000);
        this.log.warn({ digest, repository, attempt, err: (err as Error).message }, "upstream fetch failed, retrying");
        await new Promise((r) => setTimeout(r, delay));
      }
    }
    if (last instanceof UpstreamError) throw last;
    const notFound = last instanceof HTTPError && last.response.statusCode === 404;
    throw new UpstreamError(describe(last, this.url(repository, digest, kind)), notFound ? 404 : 502);
  }

  private url(repository: string, digest: string, kind: "blob" | "manifest"): string {
    return `${this.upstream.url.replace(/\/+$/, "")}/v2/${repository}/${kind === "blob" ? "blobs" : "manifests"}/${digest}`;
  }

  private async fetchOnce(
    repository: string,
    digest: string,
    file: string,
    kind: "blob" | "manifest",
    maxBytes: number,
  ): Promise<string> {
    const url = this.url(repository, digest, kind);
    const tooLarge = (what: string) =>
      new UpstreamError(
        `upstream ${kind} ${repository}@${digest} ${what}, more than the ${maxBytes} bytes ${kind === "blob" ? "its manifest declares" : "a manifest may have"}; not cached, not served`,
      );
    const accept = kind === "manifest" ? { accept: MANIFEST_TYPES } : {};
    const started = Date.now();
    let auth = this.bearer.get(repository) ?? this.basicAuth();
    for (let round = 0; round < 2; round++) {
      const dir = path.dirname(file);
      await mkdir(dir, { recursive: true });
      const tmp = path.join(dir, `.${path.basename(file)}.part-${randomBytes(4).toString("hex")}`);
      const fh = await open(tmp, "w", 0o644);
      const hash = createHash("sha256");
      let bytes = 0;
      try {
        const stream = got.stream(url, {
          headers: { ...accept, ...(auth ? { authorization: auth } : {}) },
          https: { certificateAuthority: this.upstream.ca },
          retry: { limit: 0 },
          timeout: { request: this.upstream.timeoutMs ?? 600_000 },
        });
        stream.once("response", (res: { headers: Record<string, string | string[] | undefined> }) => {
          const announced = Number(res.headers["content-length"] ?? Number.NaN);
          if (announced > maxBytes) stream.destroy(tooLarge(`announces ${announced} bytes`));
        });
        // Stop at the declared size: a registry that sends more is cut off there, before the
        // excess reaches the disk.
        for await (const chunk of stream) {
          bytes += (chunk as Buffer).length;
          if (bytes > maxBytes) {
            stream.destroy();
            throw tooLarge(`sent more than ${maxBytes} bytes`);
          }
          hash.update(chunk as Buffer);
          await fh.write(chunk as Buffer);
        }
        const got_ = `sha256:${hash.digest("hex")}`;
        if (got_ !== digest) {
          throw new UpstreamError(
            `upstream ${kind} ${repository}@${digest} failed verification: its ${bytes} bytes hash to ${got_}; not cached, not served (tampered or corrupted registry storage?)`,
          );
        }
        await fh.sync();
        await fh.close();
        await rename(tmp, file);
        await fsyncDir(dir);
        this.log.info(
          { digest, repository, kind, bytes, ms: Date.now() - started },
          `fetched and verified upstream ${kind}`,
        );
        this.verified.add(digest);
        return file;
      } catch (err) {
        await fh.close().catch(() => undefined);
        await rm(tmp, { force: true });
        if (round === 0 && err instanceof HTTPError && err.response.statusCode === 401) {
          const challenge = String(err.response.headers["www-authenticate"] ?? "");
          const next = await this.authorize(challenge, repository);
          if (next) {
            auth = next;
            continue;
          }
        }
        throw err;
      }
    }
    throw new UpstreamError(`upstream ${url} refused our credentials (401)`);
  }

  private basicAuth(): string | undefined {
    const { username, password } = this.upstream;
    if (!username) return undefined;
    return `Basic ${Buffer.from(`${username}:${password ?? ""}`).toString("base64")}`;
  }

  /** Answers a 401 challenge: Basic → credentials; Bearer → a token from the realm. */
  private async authorize(challenge: string, repository: string): Promise<string | undefined> {
    if (/^basic/i.test(challenge)) return this.basicAuth();
    if (!/^bearer/i.test(challenge)) return undefined;
    const params: Record<string, string> = {};
    for (const m of challenge.matchAll(/(\w+)="([^"]*)"/g)) params[m[1] as string] = m[2] as string;
    if (!params.realm) return undefined;
    const u = new URL(params.realm);
    if (params.service) u.searchParams.set("service", params.service);
    u.searchParams.set("scope", params.scope ?? `repository:${repository}:pull`);
    const basic = this.basicAuth();
    const body = await got(u, {
      headers: basic ? { authorization: basic } : {},
      https: { certificateAuthority: this.upstream.ca },
      retry: { limit: 2 },
      timeout: { request: 30_000 },
    }).json<{ token?: string; access_token?: string }>();
    const token = body.token ?? body.access_token;
    if (!token) return undefined;
    const bearer = `Bearer ${token}`;
    this.bearer.set(repository, bearer);
    return bearer;
  }
}

function retryable(err: unknown): boolean {
  if (err instanceof UpstreamError) return false;
  if (err instanceof HTTPError) return RETRY_STATUS.has(err.response.statusCode);
  if (err instanceof RequestError) return true; // network, premature close, timeout
  const code = (err as NodeJS.ErrnoException)?.code;
  return code !== undefined && RETRY_CODES.has(code);
}

function describe(err: unknown, url: string): string {
  if (err instanceof HTTPError) {
    return `upstream ${url} answered ${err.response.statusCode}${err.response.statusCode === 404 ? " (no such blob in that repository)" : ""}`;
  }
  if (err instanceof RequestError) return `upstream ${url}: ${err.code ?? ""} ${err.message}`.trim();
  return `upstream ${url}: ${(err as Error)?.message ?? String(err)}`;
}

function etagMatches(header: string | undefined, digest: string): boolean {
  if (!header) return false;
  return header
    .split(",")
    .map((s) => s.trim().replace(/^W\//, "").replace(/^"|"$/g, ""))
    .some((t) => t === "*" || t === digest);
}

const METRICS: [keyof ProxyStats, string][] = [
  ["requests", "HTTP requests received"],
  ["served", "package blobs served (200)"],
  ["upstreamFetches", "blob fetches from the upstream registry"],
  ["cacheHits", "requests answered from the disk cache"],
  ["notModified", "requests answered 304 Not Modified"],
  ["refused", "requests refused for a missing or wrong token"],
  ["failed", "requests whose blob could not be served (upstream error, verification, not found)"],
];

/** Prometheus text exposition of the counters. */
function metricsText(stats: ProxyStats): string {
  return METRICS.map(([k, help]) => {
    const name = `registry_packages_proxy_${k.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`)}_total`;
    return `# HELP ${name} ${help}\n# TYPE ${name} counter\n${name} ${stats[k]}\n`;
  }).join("");
}

function send(res: ServerResponse, status: number, message: string): void {
  res.writeHead(status, { "Content-Type": "text/plain; charset=utf-8" });
  res.end(`${message}\n`);
}

export function createHandler(opts: ProxyOptions, cache: BlobCache, stats: ProxyStats) {
  const log = opts.log;
  return async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    stats.requests++;
    const url = new URL(req.url ?? "/", "https://proxy");
    if (url.pathname === "/healthz") return send(res, 200, "ok");
    if (url.pathname === "/metrics") {
      res.writeHead(200, { "Content-Type": "text/plain; version=0.0.4" });
      return void res.end(metricsText({ ...stats, upstreamFetches: cache.fetches }));
    }
    if (hasBody(req)) return refuseBody(req, res, "a request takes no body\n", "text/plain; charset=utf-8");
    if (url.pathname !== "/package") return send(res, 404, `no such path ${url.pathname}; use GET /package?digest=…`);
    if (req.method !== "GET" && req.method !== "HEAD") {
      res.setHeader("Allow", "GET, HEAD");
      return send(res, 405, `method ${req.method} not allowed`);
    }
    const authz = req.headers.authorization ?? "";
    const presented = authz.startsWith("Bearer ") ? authz.slice("Bearer ".length) : "";
    if (!presented || !sameSecret(presented, opts.token)) {
      stats.refused++;
      res.setHeader("WWW-Authenticate", 'Bearer realm="registry-packages-proxy"');
      return send(res, 401, "a valid bearer token is required");
    }
    const digest = url.searchParams.get("digest") ?? "";
    const repository = url.searchParams.get("repository") || opts.defaultRepository || "";
    if (!DIGEST_RE.test(digest)) return send(res, 400, `digest must be sha256:<64 hex>, got '${digest.slice(0, 80)}'`);
    if (!REPOSITORY_RE.test(repository)) {
      return send(res, 400, `repository must be an OCI repository name, got '${repository.slice(0, 200)}'`);
    }
    const etag = `"${digest}"`;
    if (etagMatches(req.headers["if-none-match"], digest)) {
      stats.notModified++;
      res.writeHead(304, { ETag: etag });
      return void res.end();
    }
    let file: string;
    let layer: string;
    let manifest: Buffer;
    try {
      const m = await cache.manifest(repository, digest);
      manifest = m.bytes;
      layer = m.layer;
      const got = await cache.get(repository, layer, "blob", m.layerSize);
      file = got.file;
      if (got.hit && m.hit) stats.cacheHits++;
    } catch (err) {
      stats.failed++;
      const status = err instanceof UpstreamError ? err.status : 502;
      log.error({ digest, repository, err: (err as Error).message }, "package not served");
      return send(res, status, (err as Error).message);
    }
    const size = (await stat(file)).size;
    stats.served++;
    res.writeHead(200, {
      "Content-Type": "application/octet-stream",
      "Content-Length": String(size),
      ETag: etag,
      "Docker-Content-Digest": layer,
      [PACKAGE_MANIFEST_HEADER]: manifest.toString("base64"),
      "Cache-Control": "public, max-age=31536000, immutable",
    });
    if (req.method === "HEAD") return void res.end();
    if (cache.verified.has(layer)) {
      const rs = createReadStream(file);
      rs.once("error", (err) => res.destroy(err));
      rs.pipe(res);
      return;
    }
    if (await serveVerified(res, file, layer, log)) cache.verified.add(layer);
  };
}

/**
 * Streams a cache file this process has not hashed yet (one left by an earlier run), hashing as
 * it goes and holding back the last chunk until the hash is known: a file that rotted on disk is
 * cut off before its last byte (the node sees a truncated transfer and retries), removed, and
 * fetched afresh by the next request. True when the file proved good.
 */
async function serveVerified(res: ServerResponse, file: string, digest: string, log: Logger): Promise<boolean> {
  const hash = createHash("sha256");
  let held: Buffer | undefined;
  try {
    for await (const chunk of createReadStream(file)) {
      if (held && !res.write(held)) await new Promise((r) => res.once("drain", r));
      if (res.destroyed) return false;
      held = chunk as Buffer;
      hash.update(held);
    }
  } catch (err) {
    res.destroy(err as Error);
    return false;
  }
  if (`sha256:${hash.digest("hex")}` !== digest) {
    log.error({ digest, file }, "cached blob does not match its digest; removed, the next request refetches it");
    await rm(file, { force: true });
    res.destroy();
    return false;
  }
  res.end(held);
  return true;
}

export async function startPackagesProxy(
  opts: ProxyOptions,
  listen: { host?: string; port?: number } = {},
): Promise<PackagesProxy> {
  const stats: ProxyStats = {
    requests: 0,
    served: 0,
    upstreamFetches: 0,
    cacheHits: 0,
    notModified: 0,
    refused: 0,
    failed: 0,
  };
  const cache = new BlobCache(opts.cacheDir, opts.upstream, opts.log);
  const handler = createHandler(opts, cache, stats);
  const limits = { ...DEFAULT_LISTENER_LIMITS, ...opts.limits };
  const server = https.createServer(
    { ...tlsServerOptions(limits), cert: opts.tls.cert, key: opts.tls.key },
    (req, res) => {
      handler(req, res).catch((err: Error) => {
        opts.log.error({ err: err.message }, "request failed");
        if (!res.headersSent) send(res, 500, "internal error");
        else res.destroy();
      });
    },
  );
  limitConnections(server, limits);
  // Node's own clocks as a second line: a request's headers within 10 s, the whole request
  // (it has no body) within 30 s; a response streaming a large package is not limited.
  server.headersTimeout = limits.firstRequestTimeoutMs;
  server.requestTimeout = 30_000;
  const host = listen.host ?? "127.0.0.1";
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(listen.port ?? 0, host, () => resolve());
  });
  const port = (server.address() as AddressInfo).port;
  return {
    url: `https://${host.includes(":") ? `[${host}]` : host}:${port}`,
    port,
    get stats() {
      return { ...stats, upstreamFetches: cache.fetches };
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
