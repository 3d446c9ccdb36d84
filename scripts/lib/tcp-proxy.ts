// A TCP relay the test controls, standing in for the network between a node and the API server
// or another node: "pass" relays; "blackhole" cuts every open connection and holds new ones
// without an answer (what a lost route looks like: the caller times out); `drop` holds the
// connections of chosen source addresses only.
import net from "node:net";

export type ProxyMode = "pass" | "blackhole";

export class TcpProxy {
  readonly host: string;
  private readonly target: { host: string; port: number };
  private readonly listenPort: number;
  private server: net.Server | undefined;
  private mode: ProxyMode = "pass";
  private readonly dropped = new Set<string>();
  private readonly live = new Set<net.Socket>();
  private readonly keepSource: boolean;

  /**
   * `keepSource`: connect upstream from the client's own address (loopback addresses are all
   * local), so the target sees who connected, as it would without the relay.
   */
  constructor(o: { host: string; port?: number; target: { host: string; port: number }; keepSource?: boolean }) {
    this.host = o.host;
    this.listenPort = o.port ?? 0;
    this.target = o.target;
    this.keepSource = o.keepSource ?? false;
  }

  get port(): number {
    const a = this.server?.address();
    return typeof a === "object" && a ? a.port : 0;
  }

  async start(): Promise<number> {
    const server = net.createServer((client) => this.accept(client));
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(this.listenPort, this.host, () => resolve());
    });
    this.server = server;
    return this.port;
  }

  private accept(client: net.Socket): void {
    this.live.add(client);
    client.once("close", () => this.live.delete(client));
    client.on("error", () => undefined);
    if (this.mode === "blackhole" || this.dropped.has(client.remoteAddress ?? "")) return; // held, never answered
    const upstream = net.connect({
      port: this.target.port,
      host: this.target.host,
      ...(this.keepSource && client.remoteAddress ? { localAddress: client.remoteAddress } : {}),
    });
    this.live.add(upstream);
    upstream.once("close", () => {
      this.live.delete(upstream);
      client.destroy();
    });
    client.once("close", () => upstream.destroy());
    upstream.on("error", () => client.destroy());
    client.pipe(upstream);
    upstream.pipe(client);
  }

  private cutAll(): void {
    for (const s of this.live) s.destroy();
    this.live.clear();
  }

  setMode(mode: ProxyMode): void {
    this.mode = mode;
    if (mode === "blackhole") this.cutAll();
  }

  /** Holds every connection from these source addresses (existing ones are cut). */
  drop(addresses: string[]): void {
    for (const a of addresses) this.dropped.add(a);
    for (const s of this.live) if (this.dropped.has(s.remoteAddress ?? "")) s.destroy();
  }

  undrop(): void {
    this.dropped.clear();
  }

  async stop(): Promise<void> {
    this.cutAll();
    await new Promise<void>((r) => (this.server ? this.server.close(() => r()) : r()));
  }
}
