// npm run bench -- converge [--samples N] [--ticks N] [--idle-seconds N] [--skip-api]
//
// 1. Change latency: from a new checksum being published to the agent starting to apply it
//    (the converge child's "converge starts" line), with the shipped dist/bashible daemon.
//    Local mode: a bundle file rewritten. API mode: a NodeGroupConfiguration edited on a real
//    kube-apiserver, the bundle server re-renders, the daemon's watch sees the new checksum.
// 2. No-op tick (API mode): daemon CPU time and bytes on the wire per tick while in sync,
//    through a byte-counting TCP relay in front of the API server.
// 3. Idle RSS after --idle-seconds, side by side with a bare Node 24 process.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, readFile, writeFile, rm } from "node:fs/promises";
import { createServer, connect, type Server } from "node:net";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { buildDist, nodeBinary } from "../build.ts";
import { makeBundle, sandbox, script, writeBundle } from "../lib/bundle.ts";
import { cpuMs, rssKb } from "../lib/proc-stats.ts";

const { values } = parseArgs({
  options: {
    samples: { type: "string", default: "20" },
    ticks: { type: "string", default: "30" },
    "idle-seconds": { type: "string", default: "300" },
    "skip-api": { type: "boolean", default: false },
  },
});
const SAMPLES = Number(values.samples);
const TICKS = Number(values.ticks);
const IDLE = Number(values["idle-seconds"]);

const work = await mkdtemp(path.join(os.tmpdir(), "bench-converge-"));
const dist = path.join(work, "dist");
await buildDist(dist);
const BIN = path.join(dist, "bashible");

const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? Number.NaN;
};
const ms = (x: number) => `${x.toFixed(0)} ms`;

interface Daemon {
  proc: ChildProcess;
  lines: { t: number; rec: Record<string, unknown> }[];
  waitLine(pred: (r: Record<string, unknown>) => boolean, after: number, timeoutMs?: number): Promise<number>;
}

function startDaemon(args: string[]): Daemon {
  const proc = spawn(BIN, ["run", "--log-format", "json", ...args], { stdio: ["ignore", "pipe", "inherit"] });
  const lines: Daemon["lines"] = [];
  let buf = "";
  proc.stdout?.on("data", (d: Buffer) => {
    buf += d.toString();
    let nl = buf.indexOf("\n");
    while (nl >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      nl = buf.indexOf("\n");
      try {
        const rec = JSON.parse(line) as Record<string, unknown>;
        lines.push({ t: typeof rec.time === "number" ? rec.time : Date.now(), rec });
      } catch {
        // not a log line
      }
    }
  });
  return {
    proc,
    lines,
    async waitLine(pred, after, timeoutMs = 30_000) {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const hit = lines.find((l) => l.t >= after && pred(l.rec));
        if (hit) return hit.t;
        if (Date.now() > deadline) {
          const tail = lines
            .slice(-10)
            .map((l) => JSON.stringify(l.rec))
            .join("\n");
          throw new Error(`daemon: expected log line did not come; last lines:\n${tail}`);
        }
        await new Promise((r) => setTimeout(r, 20));
      }
    },
  };
}

const starts = (r: Record<string, unknown>) => r.msg === "converge starts";
const finished = (r: Record<string, unknown>) => r.msg === "converge finished";

// ---------- 1a. local mode latency
const report: string[] = [];
{
  const root = await sandbox();
  const file = path.join(work, "local.json");
  const hello = (i: number) => makeBundle([script("050_hello", `echo ${i} > "$BASHIBLE_ROOT/hello"`)]);
  await writeFile(file, JSON.stringify(hello(0)));
  const d = startDaemon(["--root", root, "--bundle", file, "--tick", "3600"]);
  await d.waitLine(finished, 0);
  const lat: number[] = [];
  for (let i = 1; i <= SAMPLES; i++) {
    const t0 = Date.now();
    await writeFile(`${file}.tmp`, JSON.stringify(hello(i)));
    await import("node:fs/promises").then((fs) => fs.rename(`${file}.tmp`, file));
    lat.push((await d.waitLine(starts, t0)) - t0);
    await d.waitLine(finished, t0);
  }
  d.proc.kill("SIGTERM");
  report.push(
    `change latency, local mode (bundle file replaced → converge starts), ${SAMPLES} samples: p50 ${ms(pct(lat, 50))}, p99 ${ms(pct(lat, 99))}, max ${ms(Math.max(...lat))}`,
  );
  console.log(report.at(-1));
}

// ---------- 1b/2/3: API mode
let apiDaemon: Daemon | undefined;
let cleanup: (() => Promise<void>) | undefined;
if (!values["skip-api"]) {
  const { startStack } = await import("../lib/stack.ts");
  const api = await import("../../lib/kube/api.ts");
  const stack = await startStack({ serverLogFile: path.join(work, "server.log") });
  const { cp } = stack;
  cleanup = () => stack.stop();
  const node = await stack.kubeletNode("bench-1");
  const id = {
    cert: path.join(path.dirname(node.kubeconfig), "kubelet-client.crt"),
    key: path.join(path.dirname(node.kubeconfig), "kubelet-client.key"),
  };
  // Every byte between the daemon and the API server goes through this relay.
  let bytes = 0;
  const upstream = new URL(cp.server);
  const relay: Server = createServer((c) => {
    const u = connect(Number(upstream.port), upstream.hostname);
    c.on("data", (d) => (bytes += d.length));
    u.on("data", (d) => (bytes += d.length));
    c.pipe(u).pipe(c);
    c.on("error", () => u.destroy());
    u.on("error", () => c.destroy());
  });
  await new Promise<void>((r) => relay.listen(0, "127.0.0.1", r));
  const relayPort = (relay.address() as { port: number }).port;
  const kubeconfig = await cp.writeKubeconfig(path.join(work, "node.kubeconfig"), { cert: id.cert, key: id.key });
  await writeFile(
    kubeconfig,
    (await readFile(kubeconfig, "utf8")).replace(cp.server, `https://127.0.0.1:${relayPort}`),
  );
  const root = node.root;
  // Approve updates as soon as they are asked for (the approval controller's job).
  const approver = new AbortController();
  void (async () => {
    while (!approver.signal.aborted) {
      try {
        for await (const ev of cp.admin.watch<{ metadata: { annotations?: Record<string, string> } }>("/api/v1/nodes", {
          fieldSelector: "metadata.name=bench-1",
          signal: approver.signal,
          timeoutSeconds: 60,
        })) {
          const a = ev.object.metadata.annotations ?? {};
          if ("update.node.deckhouse.io/waiting-for-approval" in a && !("update.node.deckhouse.io/approved" in a)) {
            await api.patchNode(cp.admin, "bench-1", {
              metadata: { annotations: { "update.node.deckhouse.io/approved": "" } },
            });
          }
        }
      } catch {
        await new Promise((r) => setTimeout(r, 200));
      }
    }
  })();
  // The moment the server publishes: our own watch on the bundle sees the new checksum.
  let published: { sum: string; t: number } | undefined;
  void (async () => {
    for await (const ev of cp.admin.watch<{ checksum: string }>(
      "/apis/bashible.deckhouse.io/v1alpha1/nodegroupbundles",
      {
        fieldSelector: "metadata.name=worker",
        signal: approver.signal,
      },
    )) {
      published = { sum: ev.object.checksum, t: Date.now() };
    }
  })().catch(() => undefined);

  const d = startDaemon(["--root", root, "--kubeconfig", kubeconfig, "--tick", "1"]);
  apiDaemon = d;
  await d.waitLine(finished, 0, 60_000);
  const lat: number[] = [];
  const endToEnd: number[] = [];
  for (let i = 1; i <= SAMPLES; i++) {
    const before = published?.sum;
    const t0 = Date.now();
    await stack.setScript(`v${i}`);
    while (published?.sum === before) await new Promise((r) => setTimeout(r, 5));
    const tPub = published?.t ?? t0;
    const tStart = await d.waitLine(starts, tPub, 30_000);
    lat.push(tStart - tPub);
    endToEnd.push(tStart - t0);
    await d.waitLine(finished, tStart, 60_000);
  }
  report.push(
    `change latency, API mode (server publishes → converge starts), ${SAMPLES} samples: p50 ${ms(pct(lat, 50))}, p99 ${ms(pct(lat, 99))}; from kubectl apply of the NodeGroupConfiguration: p50 ${ms(pct(endToEnd, 50))}, p99 ${ms(pct(endToEnd, 99))}`,
  );
  console.log(report.at(-1));

  // ---------- 2. no-op ticks: in sync, --tick 1
  await new Promise((r) => setTimeout(r, 3000));
  const pid = d.proc.pid as number;
  const cpu0 = await cpuMs(pid);
  const b0 = bytes;
  const convergesBefore = d.lines.filter((l) => starts(l.rec)).length;
  await new Promise((r) => setTimeout(r, TICKS * 1000));
  const cpu = (await cpuMs(pid)) - cpu0;
  const wire = bytes - b0;
  const extra = d.lines.filter((l) => starts(l.rec)).length - convergesBefore;
  report.push(
    `no-op tick (API mode, in sync, ${TICKS} ticks of 1 s): ${(cpu / TICKS).toFixed(1)} ms CPU and ${(wire / TICKS).toFixed(0)} bytes on the wire per tick (one conditional GET → 304, plus the open watches); converges started: ${extra}`,
  );
  console.log(report.at(-1));
  approver.abort();
  relay.close();
}

// ---------- 3. idle RSS
{
  const root = await sandbox();
  const file = await writeBundle(work, makeBundle([script("050_x", "true")]), "idle.json");
  const local = startDaemon(["--root", root, "--bundle", file, "--tick", "60"]);
  const bare = spawn(nodeBinary(), ["-e", "setInterval(() => {}, 1 << 30)"], { stdio: "ignore" });
  console.log(`idle: waiting ${IDLE} s …`);
  await new Promise((r) => setTimeout(r, IDLE * 1000));
  const bareKb = await rssKb(bare.pid as number);
  const localKb = await rssKb(local.proc.pid as number);
  const apiKb = apiDaemon ? await rssKb(apiDaemon.proc.pid as number) : 0;
  const mb = (kb: number) => `${(kb / 1024).toFixed(1)} MB`;
  report.push(
    `idle RSS after ${IDLE} s: bare node 24 ${mb(bareKb)}; bashible run (local bundle) ${mb(localKb)} = ${(localKb / bareKb).toFixed(2)}x` +
      (apiKb ? `; bashible run (cluster: TLS, watches, 1 s ticks) ${mb(apiKb)} = ${(apiKb / bareKb).toFixed(2)}x` : ""),
  );
  console.log(report.at(-1));
  local.proc.kill("SIGTERM");
  bare.kill("SIGKILL");
}
apiDaemon?.proc.kill("SIGTERM");
await cleanup?.();
await rm(work, { recursive: true, force: true });
console.log(`\n${report.join("\n")}`);
process.exit(0);
