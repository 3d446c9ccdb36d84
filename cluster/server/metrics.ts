// A few Prometheus counters and gauges in the text exposition format; no client library
// needed for this many series. The controllers' metrics (node_group_node_status and the other
// Deckhouse names, cluster/controllers/metrics.ts) follow, on the replica that leads them.

import { monitorEventLoopDelay } from "node:perf_hooks";
import { CONTROLLER_METRICS } from "../controllers/metrics.ts";

type Labels = Record<string, string>;

// Event-loop delay is what every request waits behind; exposed so a slow answer can be told
// apart from a slow network or client.
const loopDelay = monitorEventLoopDelay({ resolution: 10 });
loopDelay.enable();

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
    const m = process.memoryUsage();
    const proc = [
      `# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes ${m.rss}`,
      `# TYPE nodejs_heap_used_bytes gauge\nnodejs_heap_used_bytes ${m.heapUsed}`,
      `# TYPE nodejs_external_memory_bytes gauge\nnodejs_external_memory_bytes ${m.external + m.arrayBuffers}`,
      `# TYPE nodejs_eventloop_delay_p99_seconds gauge\nnodejs_eventloop_delay_p99_seconds ${loopDelay.percentile(99) / 1e9}`,
      `# TYPE nodejs_eventloop_delay_max_seconds gauge\nnodejs_eventloop_delay_max_seconds ${loopDelay.max / 1e9}`,
    ];
    const series = [this.renders, this.renderErrors, this.requests, this.watchers, this.checksumWrites];
    // The controllers' (Deckhouse's names): only while this replica leads them.
    return `${[...series.map((s) => s.text()), ...proc].join("\n")}\n${CONTROLLER_METRICS.text()}`;
  }
}
