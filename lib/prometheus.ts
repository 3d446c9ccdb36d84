// Prometheus text exposition (format 0.0.4) for a handful of series: counters, gauges and
// fixed-bucket histograms, with labels. The agent and the server export few enough series that
// a client library would cost more memory than it saves code.

export type Labels = Record<string, string | number>;

const escapeValue = (v: string) => v.replace(/\\/g, "\\\\").replace(/\n/g, "\\n").replace(/"/g, '\\"');

function labelKey(labels: Labels): string {
  return Object.keys(labels)
    .sort()
    .map((k) => `${k}="${escapeValue(String(labels[k]))}"`)
    .join(",");
}

const fmt = (v: number) => (Number.isNaN(v) ? "NaN" : v === Infinity ? "+Inf" : v === -Infinity ? "-Inf" : String(v));

abstract class Metric {
  readonly name: string;
  readonly help: string;
  abstract readonly type: "counter" | "gauge" | "histogram";
  constructor(name: string, help: string) {
    this.name = name;
    this.help = help;
  }
  abstract samples(): string[];
  text(): string {
    return [
      `# HELP ${this.name} ${this.help.replace(/\n/g, " ")}`,
      `# TYPE ${this.name} ${this.type}`,
      ...this.samples(),
    ]
      .join("\n")
      .concat("\n");
  }
}

class Scalar extends Metric {
  readonly type: "counter" | "gauge";
  protected readonly values = new Map<string, number>();
  constructor(name: string, help: string, type: "counter" | "gauge") {
    super(name, help);
    this.type = type;
  }
  get(labels: Labels = {}): number {
    return this.values.get(labelKey(labels)) ?? 0;
  }
  samples(): string[] {
    return [...this.values].map(([k, v]) => `${this.name}${k ? `{${k}}` : ""} ${fmt(v)}`);
  }
}

export class Counter extends Scalar {
  constructor(name: string, help: string) {
    super(name, help, "counter");
  }
  inc(labels: Labels = {}, by = 1): void {
    const k = labelKey(labels);
    this.values.set(k, (this.values.get(k) ?? 0) + by);
  }
}

export class Gauge extends Scalar {
  constructor(name: string, help: string) {
    super(name, help, "gauge");
  }
  set(labels: Labels, value: number): void;
  set(value: number): void;
  set(a: Labels | number, b?: number): void {
    if (typeof a === "number") this.values.set("", a);
    else this.values.set(labelKey(a), b ?? 0);
  }
  inc(labels: Labels = {}, by = 1): void {
    const k = labelKey(labels);
    this.values.set(k, (this.values.get(k) ?? 0) + by);
  }
  /** Drops one labelled series (a pod that is gone, say). */
  delete(labels: Labels): void {
    this.values.delete(labelKey(labels));
  }
}

export class Histogram extends Metric {
  readonly type = "histogram" as const;
  private readonly buckets: number[];
  private readonly series = new Map<string, { counts: number[]; sum: number; count: number }>();
  constructor(name: string, help: string, buckets: number[]) {
    super(name, help);
    this.buckets = [...buckets].sort((a, b) => a - b);
  }
  observe(value: number, labels: Labels = {}): void {
    const k = labelKey(labels);
    let s = this.series.get(k);
    if (!s) {
      s = { counts: this.buckets.map(() => 0), sum: 0, count: 0 };
      this.series.set(k, s);
    }
    for (const [i, le] of this.buckets.entries()) if (value <= le) s.counts[i] = (s.counts[i] ?? 0) + 1;
    s.sum += value;
    s.count++;
  }
  samples(): string[] {
    const out: string[] = [];
    for (const [k, s] of this.series) {
      const lab = (extra: string) => `{${[k, extra].filter(Boolean).join(",")}}`;
      for (const [i, le] of this.buckets.entries())
        out.push(`${this.name}_bucket${lab(`le="${fmt(le)}"`)} ${s.counts[i]}`);
      out.push(`${this.name}_bucket${lab('le="+Inf"')} ${s.count}`);
      out.push(`${this.name}_sum${k ? `{${k}}` : ""} ${fmt(s.sum)}`);
      out.push(`${this.name}_count${k ? `{${k}}` : ""} ${s.count}`);
    }
    return out;
  }
}

/** A set of metrics rendered together; others (the process's own) can be added as text. */
export class Registry {
  private readonly metrics: Metric[] = [];
  private readonly collectors: (() => string)[] = [];

  add<M extends Metric>(m: M): M {
    this.metrics.push(m);
    return m;
  }

  counter(name: string, help: string): Counter {
    return this.add(new Counter(name, help));
  }

  gauge(name: string, help: string): Gauge {
    return this.add(new Gauge(name, help));
  }

  histogram(name: string, help: string, buckets: number[]): Histogram {
    return this.add(new Histogram(name, help, buckets));
  }

  /** Text computed at scrape time (process memory, say). */
  collect(fn: () => string): void {
    this.collectors.push(fn);
  }

  text(): string {
    return this.metrics.map((m) => m.text()).join("") + this.collectors.map((c) => c()).join("");
  }
}

/** Resident memory and heap of this process, in the names Prometheus clients use. */
export function processMetrics(): string {
  const m = process.memoryUsage();
  return [
    "# TYPE process_resident_memory_bytes gauge",
    `process_resident_memory_bytes ${m.rss}`,
    "# TYPE nodejs_heap_used_bytes gauge",
    `nodejs_heap_used_bytes ${m.heapUsed}`,
    "",
  ].join("\n");
}

export const CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8";
