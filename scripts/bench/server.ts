// npm run bench -- server [--nodes N] [--window S] [--rounds R]
//
// One bundle server process (spawned, so its RSS and CPU come from /proc) on loopback in
// front-proxy mode, inputs from a config dir holding one NodeGroup "worker" and N Node objects.
// N simulated nodes in 2 worker processes each hold a watch on nodegroupbundles/worker and poll
// the bundle with If-None-Match once per window (time compressed: the real interval is 60 s).
// Then the NodeGroup changes and we time until every watcher has the new checksum. Also times
// render + checksum of a 60-step group in this process.
//
// Transport (--transport):
//   h2      (default) what the server sees behind the Kubernetes aggregator, which speaks HTTP/2
//           to it (checked in test/integration/cluster-aggregated.test.ts): watches are streams,
//           at most 1000 per connection (the server's limit; Go then opens another connection),
//           polls go over two further connections per worker, all with the front-proxy cert.
//   direct  every node its own HTTP/1.1 TLS connection for its watch, polls over a keep-alive
//           pool: what standalone mode would see if 10,000 nodes talked to it directly.
import { fork, spawn, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import { cp as copyDir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import http2 from "node:http2";
import https from "node:https";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

const SELF = fileURLToPath(import.meta.url);
const REPO = path.resolve(path.dirname(SELF), "../..");
const API = "/apis/bashible.deckhouse.io/v1alpha1";

interface WorkerInit {
  transport: "h2" | "direct";
  port: number;
  ca: string;
  cert: string;
  key: string;
  first: number;
  count: number;
  windowMs: number;
  rounds: number;
}
type ToWorker =
  | { kind: "init"; init: WorkerInit }
  | { kind: "poll" }
  | { kind: "expect"; checksum: string }
  | { kind: "stop" };
type FromWorker =
  | { kind: "watching"; ms: number; failed: number }
  | { kind: "polled"; latencies: number[]; notModified: number; errors: number }
  | { kind: "seen"; at: number; missing: number };

const lower = (h: Record<string, string>) =>
  Object.fromEntries(Object.entries(h).map(([k, v]) => [k.toLowerCase(), v]));

// ---------- worker: simulated nodes ----------
async function worker(): Promise<void> {
  const send = (m: FromWorker) => process.send?.(m);
  let init: WorkerInit | undefined;
  let expected = "";
  let seenCount = 0;
  let lastSeenAt = 0;
  const sockets: import("node:http").ClientRequest[] = [];
  const seen = new Set<number>();
  const etag = new Map<number, string>();
  const pool = new https.Agent({ keepAlive: true, maxSockets: 256 });

  const headers = (n: number) => ({ "X-Remote-User": `system:node:node-${n}`, "X-Remote-Group": "system:nodes" });
  const watchSessions: http2.ClientHttp2Session[] = [];
  const pollSessions: http2.ClientHttp2Session[] = [];
  const connect = () => {
    const i = init!;
    const s = http2.connect(`https://127.0.0.1:${i.port}`, {
      ca: i.ca,
      cert: i.cert,
      key: i.key,
      servername: "localhost",
    });
    s.on("error", () => {});
    return s;
  };
  const watchPath = `${API}/nodegroupbundles?watch=1&fieldSelector=metadata.name%3Dworker&allowWatchBookmarks=true`;

  function onLines(n: number, resolve: () => void) {
    let buf = "";
    let first = true;
    return (chunk: string) => {
      buf += chunk;
      let nl = buf.indexOf("\n");
      while (nl >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        nl = buf.indexOf("\n");
        const at = line.indexOf('"checksum":"');
        const checksum = at >= 0 ? line.slice(at + 12, at + 76) : "";
        if (first) {
          first = false;
          resolve();
        }
        if (expected && checksum === expected && !seen.has(n)) {
          seen.add(n);
          seenCount++;
          lastSeenAt = Date.now();
          if (seenCount === init!.count) send({ kind: "seen", at: lastSeenAt, missing: 0 });
        }
      }
    };
  }

  function watchOneH2(n: number, k: number): Promise<void> {
    const idx = Math.floor(k / 1000);
    while (watchSessions.length <= idx) watchSessions.push(connect());
    const stream = watchSessions[idx]!.request({ ":path": watchPath, ...lower(headers(n)) });
    return new Promise((resolve, reject) => {
      stream.on("response", (h) => {
        if (h[":status"] !== 200) reject(new Error(`watch ${n}: HTTP ${h[":status"]}`));
      });
      stream.setEncoding("utf8");
      stream.on("data", onLines(n, resolve));
      stream.on("error", reject);
    });
  }

  function pollH2(n: number): Promise<{ ms: number; status: number }> {
    const started = performance.now();
    if (!pollSessions.length) pollSessions.push(connect(), connect());
    const h: Record<string, string> = lower(headers(n));
    const e = etag.get(n);
    if (e) h["if-none-match"] = e;
    const stream = pollSessions[n % pollSessions.length]!.request({ ":path": `${API}/nodegroupbundles/worker`, ...h });
    return new Promise((resolve) => {
      let status = 0;
      stream.on("response", (hd) => {
        status = Number(hd[":status"]);
        if (hd.etag) etag.set(n, String(hd.etag));
      });
      stream.resume();
      stream.on("end", () => resolve({ ms: performance.now() - started, status }));
      stream.setTimeout(10_000, () => stream.close());
      stream.on("error", () => resolve({ ms: performance.now() - started, status: 0 }));
    });
  }

  function watchOne(n: number, k: number): Promise<void> {
    if (init!.transport === "h2") return watchOneH2(n, k);
    const i = init!;
    return new Promise((resolve, reject) => {
      const req = https.get(
        `https://127.0.0.1:${i.port}${API}/nodegroupbundles?watch=1&fieldSelector=metadata.name%3Dworker&allowWatchBookmarks=true`,
        { ca: i.ca, cert: i.cert, key: i.key, agent: false, servername: "localhost", headers: headers(n) },
        (res) => {
          if (res.statusCode !== 200) return reject(new Error(`watch ${n}: HTTP ${res.statusCode}`));
          res.setEncoding("utf8");
          res.on("data", onLines(n, resolve));
          res.on("error", () => {});
        },
      );
      req.on("error", reject);
      sockets.push(req);
    });
  }

  function poll(n: number): Promise<{ ms: number; status: number }> {
    const i = init!;
    if (i.transport === "h2") return pollH2(n);
    const started = performance.now();
    return new Promise((resolve) => {
      const h: Record<string, string> = { ...headers(n) };
      const e = etag.get(n);
      if (e) h["If-None-Match"] = e;
      const req = https.get(
        `https://127.0.0.1:${i.port}${API}/nodegroupbundles/worker`,
        { ca: i.ca, cert: i.cert, key: i.key, agent: pool, servername: "localhost", headers: h },
        (res) => {
          res.resume();
          res.on("end", () => {
            if (res.headers.etag) etag.set(n, String(res.headers.etag));
            resolve({ ms: performance.now() - started, status: res.statusCode ?? 0 });
          });
        },
      );
      req.setTimeout(10_000, () => req.destroy());
      req.on("error", () => resolve({ ms: performance.now() - started, status: 0 }));
    });
  }

  process.on("message", async (m: ToWorker) => {
    if (m.kind === "init") {
      init = m.init;
      const started = Date.now();
      let failed = 0;
      // Ramp: a bounded number of handshakes in flight.
      const ids = Array.from({ length: init.count }, (_, k) => init!.first + k);
      const lanes = Array.from({ length: 64 }, async () => {
        for (let id = ids.shift(); id !== undefined; id = ids.shift()) {
          await watchOne(id, id - init!.first).catch(() => failed++);
        }
      });
      await Promise.all(lanes);
      send({ kind: "watching", ms: Date.now() - started, failed });
    } else if (m.kind === "poll") {
      const i = init!;
      // Warm-up: each node fetches once to learn its ETag (not measured).
      const warm = Array.from({ length: i.count }, (_, k) => i.first + k);
      await Promise.all(
        Array.from({ length: 64 }, async () => {
          for (let id = warm.shift(); id !== undefined; id = warm.shift()) await poll(id);
        }),
      );
      const latencies: number[] = [];
      let notModified = 0;
      let errors = 0;
      const pending: Promise<void>[] = [];
      const t0 = Date.now();
      for (let r = 0; r < i.rounds; r++) {
        for (let k = 0; k < i.count; k++) {
          // Each node polls at its own offset in the window: evenly spread load.
          const at = t0 + r * i.windowMs + Math.floor(((k + 0.5) / i.count) * i.windowMs);
          const delay = at - Date.now();
          if (delay > 0) await new Promise((res) => setTimeout(res, delay));
          pending.push(
            poll(i.first + k).then((p) => {
              if (p.status === 304) {
                notModified++;
                latencies.push(p.ms);
              } else errors++;
            }),
          );
        }
      }
      await Promise.all(pending);
      send({ kind: "polled", latencies, notModified, errors });
    } else if (m.kind === "expect") {
      expected = m.checksum;
    } else if (m.kind === "stop") {
      send({ kind: "seen", at: lastSeenAt, missing: init!.count - seenCount });
      for (const s of sockets) s.destroy();
      for (const s of [...watchSessions, ...pollSessions]) s.destroy();
      pool.destroy();
      process.exit(0);
    }
  });
}

// ---------- driver ----------
function quantile(sorted: number[], q: number): number {
  if (!sorted.length) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!;
}

function procStats(pid: number): { rssMB: number; cpuSeconds: number } {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  const rssKB = Number(status.match(/VmRSS:\s+(\d+)/)?.[1] ?? 0);
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  const ticks = Number(fields[11]) + Number(fields[12]);
  return { rssMB: rssKB / 1024, cpuSeconds: ticks / 100 };
}

function once<T extends FromWorker["kind"]>(
  w: ChildProcess,
  kind: T,
  timeoutMs: number,
): Promise<Extract<FromWorker, { kind: T }>> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`worker: no '${kind}' within ${timeoutMs} ms`)), timeoutMs);
    const on = (m: FromWorker) => {
      if (m.kind !== kind) return;
      clearTimeout(timer);
      w.off("message", on);
      resolve(m as Extract<FromWorker, { kind: T }>);
    };
    w.on("message", on);
  });
}

async function renderBench(): Promise<{ p50: number; p99: number }> {
  const { loadConfigDir } = await import("../../cluster/sources/directory.ts");
  const { renderGroup } = await import("../../cluster/render/render.ts");
  const inputs = (await loadConfigDir(path.join(REPO, "examples/cluster"))).snapshot
    .inputs as import("../../cluster/render/inputs.ts").RenderInputs;
  for (let n = 0; n < 59; n++) {
    inputs.configurations.push({
      metadata: { name: `step-${String(n).padStart(2, "0")}` },
      spec: { content: `# step ${n}\n${"echo configuring {{ .nodeGroup.name }}\n".repeat(60)}`, weight: 100 + n },
    });
  }
  const ng = inputs.nodeGroups[0]!;
  const times: number[] = [];
  for (let k = 0; k < 300; k++) {
    const t0 = performance.now();
    const r = renderGroup(ng, inputs, Date.now());
    times.push(performance.now() - t0);
    if (r.bundle.steps.length < 60) throw new Error("expected 60+ steps");
  }
  times.sort((a, b) => a - b);
  return { p50: quantile(times, 0.5), p99: quantile(times, 0.99) };
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      nodes: { type: "string" },
      window: { type: "string" },
      rounds: { type: "string" },
      transport: { type: "string" },
      from: { type: "string" },
    },
  });
  const nodes = Number(values.nodes ?? 10_000);
  const windowMs = Number(values.window ?? 20) * 1000;
  const rounds = Number(values.rounds ?? 2);
  const transport = (values.transport ?? "h2") as "h2" | "direct";
  if (transport !== "h2" && transport !== "direct") throw new Error("--transport is h2 or direct");
  // bundle (default): the esbuild bundle `npm run build` ships, as production runs it;
  // source: agent/main.ts through Node's type stripping (~17 MB more resident).
  const from = values.from ?? "bundle";
  if (from !== "bundle" && from !== "source") throw new Error("--from is bundle or source");
  const { createCA, issueCert } = await import("../lib/pki.ts");
  const tmp = await mkdtemp(path.join(os.tmpdir(), "bashible-bench-server-"));
  const children: ChildProcess[] = [];
  try {
    const configDir = path.join(tmp, "config");
    await copyDir(path.join(REPO, "examples/cluster"), configDir, { recursive: true });
    const items = Array.from({ length: nodes }, (_, n) => ({
      apiVersion: "v1",
      kind: "Node",
      metadata: { name: `node-${n}`, labels: { "node.deckhouse.io/group": "worker" } },
    }));
    await writeFile(path.join(configDir, "nodes.json"), JSON.stringify({ apiVersion: "v1", kind: "List", items }));
    const ca = await createCA(tmp, "ca");
    const serving = await issueCert(tmp, "serving", ca, {
      cn: "bashible-api",
      dnsNames: ["localhost"],
      ips: ["127.0.0.1"],
    });
    const fpCA = await createCA(tmp, "front-proxy-ca");
    const fp = await issueCert(tmp, "front-proxy-client", fpCA, { cn: "front-proxy-client", client: true });

    let entry = path.join(REPO, "agent/main.ts");
    if (from === "bundle") {
      const { bundleAgent } = await import("../build.ts");
      await bundleAgent(path.join(tmp, "app"));
      entry = path.join(tmp, "app/main.mjs");
    }
    const { freePort } = await import("../lib/control-plane.ts");
    const port = await freePort();
    const server = spawn(
      process.execPath,
      [
        // The flag the production launcher (dist/bashible) passes to every command, unless
        // BENCH_SERVER_NODE_FLAGS says otherwise (for comparing GC settings).
        ...(process.env.BENCH_SERVER_NODE_FLAGS ?? "--max-semi-space-size=1").split(" ").filter(Boolean),
        entry,
        "server",
        "--config-dir",
        configDir,
        "--address",
        "127.0.0.1",
        "--port",
        String(port),
        "--tls-cert-file",
        serving.cert,
        "--tls-private-key-file",
        serving.key,
        "--requestheader-client-ca-file",
        fpCA.cert,
        "--log-level",
        "warn",
        "--log-format",
        "json",
        // One TLS connection per node's watch: above the default connection cap (4096).
        ...(transport === "direct" ? ["--max-connections", String(nodes + 1000)] : []),
      ],
      {
        stdio: ["ignore", "inherit", "inherit"],
        env: { ...process.env, BASHIBLE_ASSETS: REPO },
      },
    );
    children.push(server);
    const ca0 = await readFile(ca.cert, "utf8");
    for (let k = 0; ; k++) {
      const ok = await new Promise<boolean>((resolve) => {
        https
          .get(`https://127.0.0.1:${port}/readyz`, { ca: ca0, servername: "localhost" }, (r) => {
            r.resume();
            resolve(r.statusCode === 200);
          })
          .on("error", () => resolve(false));
      });
      if (ok) break;
      if (k > 300) throw new Error("server did not become ready in 30 s");
      await new Promise((r) => setTimeout(r, 100));
    }
    const idle = procStats(server.pid!);
    console.log(
      `server ready: pid ${server.pid}, RSS ${idle.rssMB.toFixed(0)} MB idle, ${nodes} nodes, transport ${transport}, server from ${from}, poll window ${windowMs / 1000} s x ${rounds}`,
    );

    const workers = [0, 1].map(() =>
      fork(SELF, [], { env: { ...process.env, BENCH_SERVER_WORKER: "1" }, stdio: "inherit" }),
    );
    children.push(...workers);
    const per = Math.ceil(nodes / workers.length);
    const init = {
      transport,
      port,
      ca: ca0,
      cert: await readFile(fp.cert, "utf8"),
      key: await readFile(fp.key, "utf8"),
      windowMs,
      rounds,
    };
    const cpu0 = procStats(server.pid!);
    const t0 = Date.now();
    const watching = await Promise.all(
      workers.map((w, i) => {
        const p = once(w, "watching", 180_000);
        w.send({
          kind: "init",
          init: { ...init, first: i * per, count: Math.min(per, nodes - i * per) },
        } satisfies ToWorker);
        return p;
      }),
    );
    const failed = watching.reduce((a, w) => a + w.failed, 0);
    const afterWatch = procStats(server.pid!);
    console.log(
      `watches open: ${nodes - failed}/${nodes} in ${((Date.now() - t0) / 1000).toFixed(1)} s; server RSS ${afterWatch.rssMB.toFixed(0)} MB, CPU ${(afterWatch.cpuSeconds - cpu0.cpuSeconds).toFixed(1)} s for the handshakes`,
    );

    const metrics = () =>
      new Promise<string>((resolve) => {
        https
          .get(`https://127.0.0.1:${port}/metrics`, { ca: ca0, servername: "localhost" }, (r) => {
            let b = "";
            r.on("data", (d: Buffer) => (b += d.toString()));
            r.on("end", () => resolve(b));
          })
          .on("error", () => resolve(""));
      });
    let mem = await metrics();
    const metric = (name: string) => Number(mem.match(new RegExp(`^${name} ([0-9.e+-]+)`, "m"))?.[1] ?? 0);
    const gauge = (name: string) => metric(name) / 1048576;
    console.log(
      `  server memory: heap ${gauge("nodejs_heap_used_bytes").toFixed(0)} MB, external ${gauge("nodejs_external_memory_bytes").toFixed(0)} MB`,
    );
    let peakRss = afterWatch.rssMB;
    const sampler = setInterval(() => {
      peakRss = Math.max(peakRss, procStats(server.pid!).rssMB);
    }, 500);
    const pollStart = procStats(server.pid!);
    const pollT0 = Date.now();
    const polled = await Promise.all(
      workers.map((w) => {
        const p = once(w, "polled", windowMs * rounds + 180_000);
        w.send({ kind: "poll" } satisfies ToWorker);
        return p;
      }),
    );
    const pollEnd = procStats(server.pid!);
    mem = await metrics();
    console.log(
      `  server memory after polling: RSS ${pollEnd.rssMB.toFixed(0)} MB, heap ${gauge("nodejs_heap_used_bytes").toFixed(0)} MB, external ${gauge("nodejs_external_memory_bytes").toFixed(0)} MB`,
    );
    console.log(
      `  server event-loop delay since start: p99 ${(metric("nodejs_eventloop_delay_p99_seconds") * 1000).toFixed(1)} ms, max ${(metric("nodejs_eventloop_delay_max_seconds") * 1000).toFixed(1)} ms`,
    );
    const pollSeconds = (Date.now() - pollT0) / 1000;
    const lat = polled.flatMap((p) => p.latencies).sort((a, b) => a - b);
    const errors = polled.reduce((a, p) => a + p.errors, 0);
    const cpuPct = ((pollEnd.cpuSeconds - pollStart.cpuSeconds) / pollSeconds) * 100;

    // Fan-out: change the NodeGroup (approval mode), wait for every watcher to see the new checksum.
    const ngFile = path.join(configDir, "nodegroup-worker.yaml");
    const { renderGroup } = await import("../../cluster/render/render.ts");
    const { loadConfigDir } = await import("../../cluster/sources/directory.ts");
    await writeFile(
      ngFile,
      (await readFile(ngFile, "utf8")).replace("approvalMode: Automatic", "approvalMode: Manual"),
    );
    const changedAt = Date.now();
    const snap = (await loadConfigDir(configDir)).snapshot
      .inputs as import("../../cluster/render/inputs.ts").RenderInputs;
    const expected = renderGroup(snap.nodeGroups[0]!, snap, changedAt).checksum;
    const seen = workers.map((w) =>
      once(w, "seen", 60_000).catch(() => ({ kind: "seen" as const, at: 0, missing: -1 })),
    );
    for (const w of workers) w.send({ kind: "expect", checksum: expected } satisfies ToWorker);
    const results = await Promise.all(seen);
    const fanout = results.every((r) => r.at > 0)
      ? (Math.max(...results.map((r) => r.at)) - changedAt) / 1000
      : Number.NaN;
    clearInterval(sampler);
    const end = procStats(server.pid!);
    peakRss = Math.max(peakRss, end.rssMB);
    const render = await renderBench();

    const ok = (v: boolean) => (v ? "ok" : "MISSED");
    console.log(`
not-modified polls: ${lat.length} (errors ${errors}) over ${pollSeconds.toFixed(0)} s = ${(lat.length / pollSeconds).toFixed(0)}/s
  p50 ${quantile(lat, 0.5).toFixed(2)} ms, p90 ${quantile(lat, 0.9).toFixed(2)} ms, p99 ${quantile(lat, 0.99).toFixed(2)} ms, max ${lat.at(-1)?.toFixed(1)} ms   goal p99 <= 50 ms: ${ok(quantile(lat, 0.99) <= 50)}
server while polling with ${nodes} watches open: CPU ${cpuPct.toFixed(0)}% of one core; RSS peak ${peakRss.toFixed(0)} MB   goal <= 300 MB: ${ok(peakRss <= 300)}
fan-out: NodeGroup file changed -> all ${nodes} watchers have the new checksum in ${fanout.toFixed(2)} s   goal <= 5 s: ${ok(fanout <= 5)}
  (includes the config-dir debounce of 200 ms and the render debounce of 50 ms)
render + checksum, group with 60 steps: p50 ${render.p50.toFixed(2)} ms, p99 ${render.p99.toFixed(2)} ms   goal <= 20 ms: ${ok(render.p99 <= 20)}
`);
    for (const w of workers) w.send({ kind: "stop" } satisfies ToWorker);
  } finally {
    await new Promise((r) => setTimeout(r, 500));
    for (const c of children) if (c.exitCode === null) c.kill("SIGKILL");
    await rm(tmp, { recursive: true, force: true });
  }
}

if (process.env.BENCH_SERVER_WORKER) {
  await worker();
} else if (!process.env.BENCH_SERVER_ULIMIT) {
  // 10,000 watches need more descriptors than the usual soft limit of 1024: re-run under a raised one.
  const child = spawn(
    "bash",
    ["-c", 'ulimit -n "$(ulimit -Hn)" && exec "$0" "$@"', process.execPath, SELF, ...process.argv.slice(2)],
    {
      stdio: "inherit",
      env: { ...process.env, BENCH_SERVER_ULIMIT: "1" },
    },
  );
  child.on("exit", (code) => process.exit(code ?? 1));
} else {
  await main();
}
