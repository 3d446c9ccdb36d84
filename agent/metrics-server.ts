// The resident agent's local metrics endpoint: Prometheus text from one Registry that every job
// of the agent (converge, fencing, early OOM) registers its series in, plus small JSON status
// documents (/early-oom). Served twice:
//
// - on TCP (127.0.0.1:9650 by default), for Prometheus. Loopback: the figures name pods and
//   namespaces, and nothing here needs to be reachable from off the node. Any local user can
//   bind that port before the agent does, so nothing of the agent's trusts what answers there;
//   when the port is taken the agent says who holds it, keeps retrying with backoff and records
//   the state for `bashible status`. It does not stop: a local user who could stop the agent by
//   holding a port would stop converge and fencing with it.
// - on a unix socket in the root-only /run/bashible (METRICS_SOCKET, mode 0600), which only root
//   can create or reach: what `bashible early-oom status` reads.
//
// Both listeners cap and time out what they hold (guardConnections): idle or slow clients are
// closed, and at the cap the oldest connection without a request in progress makes way for the
// new one, so a scrape is answered however many sockets a local user holds open.
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import type { Server as HttpsServer } from "node:https";
import { lstat, mkdir, readFile, readdir, readlink, chmod, unlink } from "node:fs/promises";
import { connect, type Socket } from "node:net";
import path from "node:path";
import type { Logger } from "../lib/log/log.ts";
import { Backoff } from "../lib/backoff.ts";
import { writeAtomic } from "../lib/atomic-write.ts";
import { CONTENT_TYPE, type Registry } from "../lib/prometheus.ts";

export const DEFAULT_METRICS_ADDRESS = "127.0.0.1:9650";
/** The endpoint on a unix socket only root can reach (under --root). */
export const METRICS_SOCKET = "/run/bashible/metrics.sock";
/** The TCP listener's state, for `bashible status` (under --root). */
export const METRICS_STATE = "/run/bashible/metrics.json";

/** What a listener holds at most, and for how long. */
export const LISTENER_LIMITS = {
  /** Open connections; at the cap the oldest without a request in progress is closed. */
  maxConnections: 32,
  /** A connection with no traffic for this long is closed (keep-alive included). */
  idleMs: 5000,
  /** A request's headers must arrive within this... */
  headersMs: 5000,
  /** ...and the whole request within this. */
  requestMs: 10_000,
};

// Not `import ... from "node:http"`: an ES module namespace of node:http evaluates its lazy
// getters, and http.WebSocket/CloseEvent/MessageEvent load undici, +8 MB RSS in the resident
// process (measured: 56.3 vs 47.9 MB for a lite-mode process with one server listening).
// Loaded when a server starts, so `bashible status` reading the state file does not load it.
const http = () => process.getBuiltinModule("node:http");

export class MetricsAddressError extends Error {
  override name = "MetricsAddressError";
}

/** "HOST:PORT", "[v6]:PORT" or ":PORT" (loopback). */
export function parseAddress(addr: string): { host: string; port: number } {
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:[\]]*)):(\d{1,5})$/.exec(addr.trim());
  const port = Number(m?.[3]);
  if (!m || !Number.isInteger(port) || port > 65535)
    throw new MetricsAddressError(`metrics address must be HOST:PORT (e.g. ${DEFAULT_METRICS_ADDRESS}), got '${addr}'`);
  return { host: m[1] ?? (m[2] || "127.0.0.1"), port };
}

/** HOST:PORT as an address is written (an IPv6 host in brackets). */
export const hostPort = (host: string, port: number) => (host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`);

/** The port a listening server is bound to (`fallback` when it reports none: a unix socket). */
export function boundPort(server: Server | HttpsServer, fallback: number): number {
  const bound = server.address();
  return typeof bound === "object" && bound ? bound.port : fallback;
}

const asEscape = (c: string) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`;

/**
 * Text safe to print on a terminal: control characters (C0, DEL, C1, bidi overrides) as \u
 * escapes, so text from outside (a pod name in a saved list, a process's name) cannot move the
 * cursor, retitle the window or reorder what a person reads.
 */
export const printable = (s: string): string =>
  // biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is the point
  s.replace(/[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g, asEscape);

/** The same for JSON text (JSON.stringify escapes C0 itself; its own newlines stay). */
export const printableJson = (json: string): string =>
  json.replace(/[\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g, asEscape);

export interface MetricsServerOptions {
  registry: Registry;
  log: Logger;
  /** JSON documents by path, computed per request. */
  json?: Record<string, () => unknown>;
  limits?: typeof LISTENER_LIMITS;
}

/** The endpoint's answers (/metrics, the JSON documents), shared by every listener. */
export function metricsHandler(o: MetricsServerOptions) {
  return (req: IncomingMessage, res: ServerResponse) => {
    const url = (req.url ?? "/").split("?")[0] ?? "/";
    if (req.method !== "GET" && req.method !== "HEAD") {
      res.writeHead(405, { allow: "GET, HEAD" }).end();
      return;
    }
    try {
      if (url === "/metrics") {
        res.writeHead(200, { "content-type": CONTENT_TYPE }).end(req.method === "HEAD" ? undefined : o.registry.text());
        return;
      }
      const doc = o.json?.[url];
      if (doc) {
        res
          .writeHead(200, { "content-type": "application/json" })
          .end(req.method === "HEAD" ? undefined : `${JSON.stringify(doc(), null, 2)}\n`);
        return;
      }
      res.writeHead(404, { "content-type": "text/plain" }).end(`not found; try /metrics\n`);
    } catch (err) {
      o.log.error(`metrics endpoint ${url}: ${(err as Error).message}`);
      if (!res.headersSent) res.writeHead(500).end();
      else res.destroy();
    }
  };
}

/**
 * Caps and times out what the server holds: sockets idle for idleMs are closed, a request's
 * headers must arrive within headersMs of the connection (or of the last answer on it), and
 * beyond maxConnections the oldest connection without a request in progress (idle, or still
 * sending its headers) is closed to make way. A new connection is never the one refused while an
 * older one only sits there. The timers are per connection: a listener nobody talks to costs no
 * wake-ups (Node's own sweep of headersTimeout/requestTimeout, a timer per server, stays at its
 * default 30 s as a backstop). On a TLS server the connections counted are the ones past their
 * handshake (the socket a request arrives on); the handshake itself is bounded by the server's
 * handshakeTimeout and net's maxConnections (see metrics-secure.ts).
 */
export function guardConnections(server: Server | HttpsServer, limits = LISTENER_LIMITS): void {
  const opened = "setSecureContext" in server ? "secureConnection" : "connection";
  server.headersTimeout = limits.headersMs;
  server.requestTimeout = limits.requestMs;
  server.keepAliveTimeout = limits.idleMs;
  server.setTimeout(limits.idleMs, (socket) => socket.destroy());
  const open = new Set<Socket>(); // insertion order: oldest first
  const busy = new Set<Socket>();
  const deadlines = new Map<Socket, NodeJS.Timeout>();
  const awaitHeaders = (socket: Socket) =>
    deadlines.set(
      socket,
      setTimeout(() => socket.destroy(), limits.headersMs),
    );
  server.on(opened, (socket: Socket) => {
    open.add(socket);
    awaitHeaders(socket);
    socket.once("close", () => {
      open.delete(socket);
      busy.delete(socket);
      clearTimeout(deadlines.get(socket));
      deadlines.delete(socket);
    });
    if (open.size <= limits.maxConnections) return;
    for (const s of open)
      if (s !== socket && !busy.has(s)) {
        s.destroy();
        return;
      }
    socket.destroy(); // every other one is being answered
  });
  server.on("request", (req: IncomingMessage, res: ServerResponse) => {
    const s = req.socket;
    busy.add(s);
    clearTimeout(deadlines.get(s));
    res.once("close", () => {
      busy.delete(s);
      if (!s.destroyed) awaitHeaders(s); // keep-alive: the next request's headers, in time too
    });
  });
}

function newServer(o: MetricsServerOptions): Server {
  const server = http().createServer(metricsHandler(o));
  guardConnections(server, o.limits ?? LISTENER_LIMITS);
  return server;
}

export function listen(
  server: Server | HttpsServer,
  where: { port: number; host: string } | { path: string },
): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(where, () => {
      server.off("error", reject);
      resolve();
    });
  });
}

export function closeServer(server: Server | HttpsServer): Promise<void> {
  return new Promise<void>((resolve) => {
    server.close(() => resolve());
    server.closeAllConnections();
  });
}

export interface MetricsServer {
  /** The address actually bound (port 0 picks one). */
  readonly host: string;
  readonly port: number;
  close(): Promise<void>;
}

/** One TCP listener, bound now or failing (EADDRINUSE...). */
export async function startMetricsServer(o: MetricsServerOptions & { address: string }): Promise<MetricsServer> {
  const { host, port } = parseAddress(o.address);
  const server = newServer(o);
  await listen(server, { port, host });
  return {
    host,
    port: boundPort(server, port),
    close: () => closeServer(server),
  };
}

/** Who holds a TCP port in LISTEN, from /proc/net/tcp{,6} and the processes' descriptors. */
export interface PortHolder {
  uid: number;
  pid?: number;
  command?: string;
}

/** The last holder found, by its socket's inode: a retry every minute does not walk /proc again. */
let lastHolder: { inode: string; holder: PortHolder } | undefined;

/** An IPv4 address as /proc/net/tcp writes it (the 32-bit word in host order: little-endian here). */
const procHex = (ip: string) =>
  ip
    .split(".")
    .reverse()
    .map((o) => Number(o).toString(16).padStart(2, "0"))
    .join("")
    .toUpperCase();

export async function portHolder(
  port: number,
  host = "127.0.0.1",
  procRoot = "/proc",
): Promise<PortHolder | undefined> {
  // Listeners on the port: the one on this address or on every address blocks it; another
  // address's listener is named only when there is no better one.
  const wanted = /^\d+\.\d+\.\d+\.\d+$/.test(host) ? procHex(host) : undefined;
  let found: { uid: number; inode: string; exact: boolean } | undefined;
  for (const table of ["net/tcp", "net/tcp6"]) {
    const text = await readFile(path.join(procRoot, table), "latin1").catch(() => "");
    for (const line of text.split("\n").slice(1)) {
      // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
      const f = line.trim().split(/\s+/);
      const [addr, hexPort] = f[1]?.split(":") ?? [];
      if (f[3] !== "0A" || Number.parseInt(hexPort ?? "", 16) !== port) continue;
      const exact = addr === wanted || /^0+$/.test(addr ?? "");
      if (!found || (exact && !found.exact)) found = { uid: Number(f[7]), inode: f[9] ?? "", exact };
    }
  }
  if (!found) return undefined;
  if (lastHolder?.inode === found.inode) return lastHolder.holder;
  const target = `socket:[${found.inode}]`;
  for (const pid of (await readdir(procRoot).catch(() => [] as string[])).filter((d) => /^\d+$/.test(d))) {
    const fds = await readdir(path.join(procRoot, pid, "fd")).catch(() => [] as string[]);
    for (const fd of fds) {
      if ((await readlink(path.join(procRoot, pid, "fd", fd)).catch(() => "")) !== target) continue;
      // The program's name (argv[0]; comm names the thread: "MainThread" for node). The holder
      // chooses it: printable, and short.
      const argv0 = (await readFile(path.join(procRoot, pid, "cmdline"), "utf8").catch(() => "")).split("\0")[0] ?? "";
      const name = path.basename(argv0) || (await readFile(path.join(procRoot, pid, "comm"), "utf8").catch(() => ""));
      const holder = { uid: found.uid, pid: Number(pid), command: printable(name.trim()).slice(0, 64) || undefined };
      lastHolder = { inode: found.inode, holder };
      return holder;
    }
  }
  return { uid: found.uid };
}

/** The TCP listener as `bashible status` shows it (METRICS_STATE). */
export interface MetricsState {
  /** The daemon that wrote it. */
  pid: number;
  address: string;
  listening: boolean;
  since: string;
  attempts: number;
  error?: string;
  holder?: PortHolder;
  nextAttemptAt?: string;
  /** The unix socket, when served. */
  socket?: string;
}

export interface MetricsEndpoint {
  state(): MetricsState;
  /** Resolves once the TCP address has been tried once (bound or not). */
  readonly firstAttempt: Promise<void>;
  close(): Promise<void>;
}

/**
 * The endpoint on TCP and on the root-only unix socket under `root`. Never throws for a taken
 * address: it retries with backoff, logs who holds it, and records the state for `bashible status`.
 */
export async function startMetricsEndpoint(
  o: MetricsServerOptions & { address: string; root: string; retry?: { baseMs: number; maxMs: number } },
): Promise<MetricsEndpoint> {
  const { host, port } = parseAddress(o.address);
  const address = hostPort(host, port);
  const log = o.log.child({ component: "metrics" });
  const stateFile = path.join(o.root, METRICS_STATE);
  const socket = await serveSocket(o, path.join(o.root, METRICS_SOCKET), log);
  const tcp = newServer(o);
  const backoff = new Backoff(o.retry ?? { baseMs: 1000, maxMs: 60_000 });
  let state: MetricsState = {
    pid: process.pid,
    address,
    listening: false,
    since: new Date().toISOString(),
    attempts: 0,
    socket: socket ? METRICS_SOCKET : undefined,
  };
  let timer: NodeJS.Timeout | undefined;
  let closed = false;
  let lastProblem = "";
  let writing = Promise.resolve();
  const record = (next: MetricsState) => {
    state = next;
    const text = `${JSON.stringify(next)}\n`;
    writing = writing
      .then(() => writeAtomic(path.dirname(stateFile), path.basename(stateFile), [Buffer.from(text)], { mode: 0o644 }))
      .catch((err: Error) => log.warn(`cannot write ${METRICS_STATE}: ${err.message}`));
  };
  const attempt = async (): Promise<void> => {
    timer = undefined;
    if (closed) return;
    const attempts = state.attempts + 1;
    try {
      await listen(tcp, { port, host });
      if (closed) {
        await closeServer(tcp);
        return;
      }
      const where = hostPort(host, boundPort(tcp, port));
      backoff.reset();
      record({
        pid: process.pid,
        address: where,
        listening: true,
        since: new Date().toISOString(),
        attempts,
        socket: state.socket,
      });
      if (attempts > 1) log.warn({ address: where, attempts }, `metrics endpoint listening on ${where} at last`);
      else log.info({ address: where, socket: state.socket }, "metrics endpoint listening");
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code ?? (err as Error).message;
      const holder = code === "EADDRINUSE" ? await portHolder(port, host) : undefined;
      const delay = backoff.next();
      record({
        ...state,
        listening: false,
        attempts,
        error: code,
        holder,
        since: attempts === 1 ? new Date().toISOString() : state.since,
        nextAttemptAt: new Date(Date.now() + delay).toISOString(),
      });
      // One line per change of who holds it (the pid may be missed while the holder lets go).
      const problem = `${code} ${holder?.uid ?? ""}`;
      const held = holder
        ? ` is taken by ${holder.pid ? `pid ${holder.pid} (${holder.command ?? "?"}, uid ${holder.uid})` : `a process of uid ${holder.uid} (not found in /proc)`}`
        : `: ${(err as Error).message}`;
      if (problem !== lastProblem)
        log.error(
          { address, error: code, holderPid: holder?.pid, holderUid: holder?.uid, holderCommand: holder?.command },
          `metrics endpoint not listening: ${address}${held}. The agent goes on (converge, fencing, early OOM) and retries with backoff up to ${Math.round((o.retry?.maxMs ?? 60_000) / 1000)} s; choose another address with --metrics-address HOST:PORT (or off). bashible early-oom status reads ${METRICS_SOCKET}, never this port.`,
        );
      else log.debug({ address, error: code, attempts }, "metrics endpoint still not listening");
      lastProblem = problem;
      if (!closed) timer = setTimeout(() => void attempt(), delay);
    }
  };
  const firstAttempt = attempt();
  return {
    state: () => state,
    firstAttempt,
    async close() {
      closed = true;
      clearTimeout(timer);
      await firstAttempt;
      await Promise.all([state.listening ? closeServer(tcp) : undefined, socket?.close()]);
      await writing;
    },
  };
}

/**
 * The unix socket, in a directory only this user (root) can write, mode 0600. A socket another
 * agent still answers on is left alone; a stale one is replaced; anything else there is refused.
 */
async function serveSocket(
  o: MetricsServerOptions,
  file: string,
  log: Logger,
): Promise<{ close(): Promise<void> } | undefined> {
  const refuse = (why: string) => {
    log.error(
      { socket: file },
      `not serving the local socket ${file}: ${why}; bashible early-oom status cannot reach this agent`,
    );
    return undefined;
  };
  if (Buffer.byteLength(file) > 107) return refuse("the path is longer than a unix socket address allows (107 bytes)");
  const dir = path.dirname(file);
  try {
    await mkdir(dir, { recursive: true, mode: 0o755 });
    const d = await lstat(dir);
    const me = process.geteuid?.() ?? 0;
    if (!d.isDirectory()) return refuse(`${dir} is not a directory`);
    if (d.uid !== me || d.mode & 0o022)
      return refuse(
        `${dir} is owned by uid ${d.uid} with mode ${(d.mode & 0o7777).toString(8)}; it must be ${me}'s alone`,
      );
    const existing = await lstat(file).catch(() => undefined);
    if (existing) {
      if (!existing.isSocket()) return refuse("something other than a socket is there");
      if (await answers(file)) return refuse("another agent answers on it");
      await unlink(file);
    }
    const server = newServer(o);
    await listen(server, { path: file });
    await chmod(file, 0o600);
    return {
      async close() {
        await closeServer(server);
        await unlink(file).catch(() => undefined);
      },
    };
  } catch (err) {
    return refuse((err as Error).message);
  }
}

function answers(file: string): Promise<boolean> {
  return new Promise((resolve) => {
    const c = connect(file);
    c.once("connect", () => {
      c.destroy();
      resolve(true);
    });
    c.once("error", () => resolve(false));
  });
}

/** The state the running daemon `pid` recorded, for `bashible status`; undefined when none (or another's). */
export async function readMetricsState(root: string, pid: number): Promise<MetricsState | undefined> {
  try {
    const s = JSON.parse(await readFile(path.join(root, METRICS_STATE), "utf8")) as MetricsState;
    return s.pid === pid ? s : undefined;
  } catch {
    return undefined;
  }
}

/** One line for `bashible status`. */
export function metricsStatusLine(s: MetricsState): string {
  if (s.listening) return printable(`http://${s.address}/metrics${s.socket ? ` (and ${s.socket})` : ""}`);
  const h = s.holder;
  const holder = h
    ? h.pid
      ? `held by pid ${h.pid} (${h.command ?? "?"}, uid ${h.uid})`
      : `held by uid ${h.uid}`
    : s.error;
  return printable(
    `NOT listening on ${s.address} since ${s.since}: ${holder}; retry ${s.attempts + 1} at ${s.nextAttemptAt}; change it with --metrics-address${s.socket ? `; ${s.socket} serves` : ""}`,
  );
}
