// A few Prometheus counters and gauges in the text exposition format; no client library
// needed for this many series.

type Labels = Record<string, string>;

const key = (labels: Labels) =>
  Object.keys(labels)
    .sort()
    .map((k) => `${k}="${String(labels[k]).replace(/["\\\n]/g, "_")}"`)
    .join(",");

class Series {
  readonly name: string;
  readonly help: string;
  readonly type: "counter" | "gauge";
  private readonly values = new Map<string, number>();
  constructor(name: string, help: string, type: "counter" | "gauge") {
    this.name = name;
    this.help = help;
    this.type = type;
  }
  inc(labels: Labels = {}, by = 1): void {
    const k = key(labels);
    this.values.set(k, (this.values.get(k) ?? 0) + by);
  }
  set(labels: Labels, value: number): void {
    this.values.set(key(labels), value);
  }
  get(labels: Labels = {}): number {
    return this.values.get(key(labels)) ?? 0;
  }
  text(): string {
    const lines = [`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} ${this.type}`];
    for (const [k, v] of this.values) lines.push(`${this.name}${k ? `{${k}}` : ""} ${v}`);
    return lines.join("\n");
  }
}

export class Metrics {
  readonly renders = new Series("bashible_server_renders_total", "Render passes over all node groups.", "counter");
  readonly renderErrors = new Series(
    "bashible_server_render_errors_total",
    "Node group renders that failed; the group keeps serving its last good bundle.",
    "counter",
  );
  readonly requests = new Series("bashible_server_requests_total", "Requests by resource, verb and code.", "counter");
  readonly watchers = new Series("bashible_server_watchers", "Open watches.", "gauge");
  readonly checksumWrites = new Series(
    "bashible_server_checksum_secret_writes_total",
    "Writes of Secret configuration-checksums by result.",
    "counter",
  );

  text(): string {
    return `${[this.renders, this.renderErrors, this.requests, this.watchers, this.checksumWrites].map((s) => s.text()).join("\n")}\n`;
  }
}
