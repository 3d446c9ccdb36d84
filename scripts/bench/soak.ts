// npm run bench -- soak [--minutes N] [--interval S] [--modes local,api] [--cases LIST]
//                       [--dist DIR]... [--slope-from F] [--keep]
//
// The resident agent at steady state: the shipped dist/bashible daemon (`bashible run`, default
// 60 s tick) idling on a converged sandbox for --minutes (default 10; 60 for the hour), side by
// side with a bare Node 24 process, every agent against the same real cluster side
// (scripts/lib/stack.ts: kube-apiserver + etcd, the bundle server as the aggregated API, the
// registry-packages proxy), each as its own Node in its own node group, with a kubelet identity.
//
// Modes: local (`--bundle FILE --kubeconfig`: the bundle from a file, the Node watch, fencing and
// early OOM through the API) and api (`--kubeconfig` only: the bundle from the aggregated API,
// its watch and the minute's conditional GET, the production path).
// Cases (each job off in turn):
//   all          converge + fencing (Watchdog, a FIFO for the device) + early OOM (dry run on this
//                machine's real /proc and cgroups) + the metrics endpoint (on by default)
//   no-early-oom --early-oom off
//   no-fencing   the node group without spec.fencing (fencing's code is never loaded)
//   no-tick      --tick 3600: the minute's check off (what the older benches ran)
//   daemon-only  converge alone: early OOM, fencing and the metrics endpoint off
//
// Every --interval seconds (default 10): VmRSS, RssAnon and RssFile (/proc/PID/status), PSS
// (/proc/PID/smaps_rollup), CPU (utime + stime and the children's, /proc/PID/stat). Printed per
// process: RSS at 60 s, at 10 min and at the end; PSS at the end; the RSS slope in MB per hour
// (least squares over the samples after --slope-from of the run, default the last half, with its
// standard error); CPU per idle minute from 60 s to the end; converges started after 60 s.
// --dist DIR (repeatable) runs the cases for each given build side by side instead of building;
// --keep leaves the agents' roots and logs for a look afterwards.
import { spawn, type ChildProcess } from "node:child_process";
import { closeSync, openSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { buildDist, nodeBinary } from "../build.ts";
import { makeBundle, sandbox, script, writeBundle } from "../lib/bundle.ts";
import { freePort, type ControlPlane } from "../lib/control-plane.ts";
import { applyFencingRbac, createNode, loopbackNet } from "../lib/fencing.ts";
import { type FakeWatchdog, fakeWatchdog } from "../lib/watchdog.ts";
import { until } from "../lib/until.ts";
import { loadAverage } from "../lib/proc-stats.ts";
import type { Stack } from "../lib/stack.ts";

const CASES = ["all", "no-early-oom", "no-fencing", "no-tick", "daemon-only"] as const;
type Case = (typeof CASES)[number];
type Mode = "local" | "api";

const { values } = parseArgs({
  options: {
    minutes: { type: "string", default: "10" },
    interval: { type: "string", default: "10" },
    modes: { type: "string", default: "local,api" },
    cases: { type: "string", default: CASES.join(",") },
    dist: { type: "string", multiple: true },
    "slope-from": { type: "string", default: "0.5" },
    keep: { type: "boolean", default: false },
  },
});
const MINUTES = Number(values.minutes);
const INTERVAL = Number(values.interval);
const SLOPE_FROM = Number(values["slope-from"]);
const modes = values.modes.split(",") as Mode[];
const cases = values.cases.split(",") as Case[];
for (const m of modes) if (m !== "local" && m !== "api") throw new Error(`--modes: '${m}' is not local or api`);
for (const c of cases) if (!CASES.includes(c)) throw new Error(`--cases: '${c}' is not one of ${CASES.join(", ")}`);
if (!(MINUTES > 0) || !(INTERVAL > 0) || !(SLOPE_FROM >= 0 && SLOPE_FROM < 1))
  throw new Error("--minutes and --interval must be positive, --slope-from in [0, 1)");

const work = await mkdtemp(path.join(os.tmpdir(), "bench-soak-"));
let dists = values.dist?.map((d) => path.resolve(d));
if (!dists?.length) {
  await buildDist(path.join(work, "dist"));
  dists = [path.join(work, "dist")];
}

interface Sample {
  t: number;
  rss: number;
  anon: number;
  file: number;
  pss: number;
  cpuMs: number;
  childCpuMs: number;
}

interface Proc {
  name: string;
  argv: string[];
  proc?: ChildProcess;
  started: number;
  samples: Sample[];
  /** The agent's log file (agents only). */
  log?: string;
  watchdog?: FakeWatchdog;
  metricsPort?: number;
}

const kb = (text: string, field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, "m").exec(text)?.[1] ?? 0);

async function sample(p: Proc): Promise<void> {
  const pid = p.proc?.pid as number;
  const [status, rollup, stat] = await Promise.all(
    [`/proc/${pid}/status`, `/proc/${pid}/smaps_rollup`, `/proc/${pid}/stat`].map((f) => readFile(f, "utf8")),
  );
  const f = (stat as string).slice((stat as string).lastIndexOf(")") + 2).split(" ");
  const ticks = (i: number) => (Number(f[i]) * 1000) / 100; // USER_HZ = 100
  p.samples.push({
    t: (Date.now() - p.started) / 1000,
    rss: kb(status as string, "VmRSS"),
    anon: kb(status as string, "RssAnon"),
    file: kb(status as string, "RssFile"),
    pss: kb(rollup as string, "Pss"),
    cpuMs: ticks(11) + ticks(12),
    childCpuMs: ticks(13) + ticks(14),
  });
}

/** Least squares slope of RSS (kB per second) and its standard error. */
function slope(xs: Sample[]): { perHourMb: number; errMb: number } {
  const n = xs.length;
  if (n < 3) return { perHourMb: Number.NaN, errMb: Number.NaN };
  const mt = xs.reduce((a, s) => a + s.t, 0) / n;
  const mr = xs.reduce((a, s) => a + s.rss, 0) / n;
  let sxx = 0;
  let sxy = 0;
  for (const s of xs) {
    sxx += (s.t - mt) ** 2;
    sxy += (s.t - mt) * (s.rss - mr);
  }
  const b = sxy / sxx;
  const resid = xs.reduce((a, s) => a + (s.rss - mr - b * (s.t - mt)) ** 2, 0);
  const se = Math.sqrt(resid / (n - 2) / sxx);
  return { perHourMb: (b * 3600) / 1024, errMb: (se * 3600) / 1024 };
}

const mb = (k: number | undefined) => (k === undefined ? "–" : (k / 1024).toFixed(1));
const at = (p: Proc, secs: number) => p.samples.find((s) => s.t >= secs - INTERVAL / 2);

/** One agent: its Node, group, sandbox root, kubelet identity, watchdog FIFO and flags. */
async function prepareAgent(
  cp: ControlPlane,
  stack: Stack | undefined,
  o: { dist: string; mode: Mode; c: Case; name: string; label: string; address: string },
): Promise<Proc> {
  const { mode, c, name, address } = o;
  const fencing = c !== "no-fencing" && c !== "daemon-only";
  const nodeGroup = {
    nodeType: "Static" as const,
    disruptions: { approvalMode: "Automatic" as const },
    ...(fencing ? { fencing: { mode: "Watchdog" as const } } : {}),
  };
  await createNode(cp.admin, name, { group: name, address });
  const root = await sandbox("ID=debian\nVERSION_ID=12\n", name);
  roots.push(root);
  await mkdir(path.join(root, "var/lib/bashible"), { recursive: true });
  await writeFile(path.join(root, "var/lib/bashible/first_run"), "");
  const id = await cp.mintNode(name);
  const kubeconfig = await cp.writeKubeconfig(path.join(root, "kubelet.conf"), { cert: id.cert, key: id.key });
  const watchdog = fencing ? await fakeWatchdog(root) : undefined;
  const peerPort = await freePort();
  const metricsPort = await freePort();
  const args = ["run", "--root", root, "--kubeconfig", kubeconfig, "--node-name", name, "--log-format", "json"];
  if (mode === "local") {
    const bundle = makeBundle([script("050_x", "true")], {
      group: name,
      context: { nodeGroup: { name, ...nodeGroup, updateEpoch: "0" } },
    });
    // Its own directory: the daemon watches the bundle's directory, and the log is written elsewhere.
    const dir = path.join(work, name);
    await mkdir(dir);
    args.push("--bundle", await writeBundle(dir, bundle, "bundle.json"));
  } else {
    await stack?.reg.apply({ apiVersion: "deckhouse.io/v1", kind: "NodeGroup", metadata: { name }, spec: nodeGroup });
  }
  args.push(
    "--fencing-address",
    address,
    "--fencing-port",
    String(peerPort),
    "--fencing-listen-port",
    String(peerPort),
  );
  if (c === "no-tick") args.push("--tick", "3600");
  if (c === "no-early-oom" || c === "daemon-only") args.push("--early-oom", "off");
  else args.push("--early-oom", "dry-run", "--proc-root", "/proc", "--cgroup-root", "/sys/fs/cgroup");
  args.push("--metrics-address", c === "daemon-only" ? "off" : `127.0.0.1:${metricsPort}`);
  return {
    name: o.label,
    argv: [path.join(o.dist, "bashible"), ...args],
    started: 0,
    samples: [],
    log: path.join(work, `${name}.log`),
    watchdog,
    metricsPort: c === "daemon-only" ? undefined : metricsPort,
  };
}

const logLines = async (p: Proc) =>
  (await readFile(p.log as string, "utf8").catch(() => "")).split("\n").flatMap((l) => {
    try {
      return [JSON.parse(l) as { time?: number; msg?: string }];
    } catch {
      return [];
    }
  });

const alive = (p: Proc) => p.proc?.exitCode === null && p.proc.signalCode === null;

/** Samples every process every INTERVAL seconds for MINUTES, printing a line per round. */
async function soak(procs: Proc[]): Promise<void> {
  const started = Date.now();
  // The first converge and, with fencing, the first pets happen within the first minute.
  const settled = Promise.all(
    procs
      .filter((p) => p.log)
      .map(async (p) => {
        await until(
          `${p.name}: first converge finished (${p.log})`,
          async () => (await logLines(p)).some((l) => l.msg === "converge finished"),
          120_000,
          1000,
        );
        await p.watchdog?.nextPets(1, 120_000);
      }),
  );
  settled.catch(() => undefined);
  const end = started + MINUTES * 60_000;
  for (let next = started + INTERVAL * 1000; next <= end + 1; next += INTERVAL * 1000) {
    await new Promise((r) => setTimeout(r, Math.max(0, next - Date.now())));
    for (const p of procs) {
      if (!alive(p)) throw new Error(`${p.name} exited (${p.proc?.exitCode ?? p.proc?.signalCode}); see ${p.log}`);
      await sample(p);
    }
    // An agent that did not settle within two minutes makes the figures meaningless.
    if (next - started >= 120_000) await settled;
    console.log(
      `${((next - started) / 1000).toFixed(0).padStart(5)} s  ${procs.map((p) => mb(p.samples.at(-1)?.rss)).join(" ")}`,
    );
  }
  await settled;
}

async function report(procs: Proc[], bare: Proc, loadAtStart: string): Promise<void> {
  // The JavaScript heap at the end, from the agents' own metrics endpoint (one scrape).
  const heap = new Map<Proc, number>();
  for (const p of procs) {
    if (!p.metricsPort) continue;
    const text = await fetch(`http://127.0.0.1:${p.metricsPort}/metrics`).then(
      (r) => r.text(),
      () => "",
    );
    const used = /^nodejs_heap_used_bytes (\d+)/m.exec(text)?.[1];
    if (used) heap.set(p, Number(used) / 1024);
  }
  const bareEnd = bare.samples.at(-1)?.rss ?? 1;
  const endT = MINUTES * 60;
  const tenMin = endT > 600;
  const rows = [
    `| process | RSS 60 s | ${tenMin ? "RSS 10 min | " : ""}RSS ${MINUTES} min | × bare | PSS end | anon / file end | JS heap used end | slope MB/h (last ${Math.round((1 - SLOPE_FROM) * 100)} %) | CPU per idle minute | converges after 60 s |`,
    `|---|---|${tenMin ? "---|" : ""}---|---|---|---|---|---|---|---|`,
  ];
  for (const p of procs) {
    const last = p.samples.at(-1);
    const s = slope(p.samples.filter((x) => x.t >= endT * SLOPE_FROM));
    const a = at(p, 60);
    const idleMin = last && a ? (last.t - a.t) / 60 : Number.NaN;
    const cpu = last && a ? (last.cpuMs - a.cpuMs) / idleMin : Number.NaN;
    const childCpu = last && a ? last.childCpuMs - a.childCpuMs : 0;
    const converges = p.log
      ? String(
          (await logLines(p)).filter((l) => l.msg === "converge starts" && (l.time ?? 0) >= p.started + 60_000).length,
        )
      : "–";
    const cells = [
      p.name,
      mb(a?.rss),
      ...(tenMin ? [mb(at(p, 600)?.rss)] : []),
      `**${mb(last?.rss)}**`,
      ((last?.rss ?? 0) / bareEnd).toFixed(2),
      mb(last?.pss),
      `${mb(last?.anon)} / ${mb(last?.file)}`,
      mb(heap.get(p)),
      `${s.perHourMb >= 0 ? "+" : ""}${s.perHourMb.toFixed(2)} ± ${s.errMb.toFixed(2)}`,
      `${cpu.toFixed(0)} ms${childCpu ? ` (+${childCpu.toFixed(0)} ms children)` : ""}`,
      converges,
    ];
    rows.push(`| ${cells.join(" | ")} |`);
  }
  const load = await loadAverage();
  console.log(
    `\n--- soak, ${new Date().toISOString()}, ${MINUTES} min, samples every ${INTERVAL} s, ${os.cpus().length} cores, load average ${loadAtStart} at the start, ${load} at the end\n`,
  );
  console.log(rows.join("\n"));
}

// ---------- main: the cluster side, the agents and a bare Node 24, all started together
const roots: string[] = [];
const procs: Proc[] = [];
let stack: Stack | undefined;
let cp: ControlPlane | undefined;
try {
  if (modes.includes("api")) {
    const { startStack } = await import("../lib/stack.ts");
    stack = await startStack();
    cp = stack.cp;
  } else {
    const { startControlPlane } = await import("../lib/control-plane.ts");
    cp = await startControlPlane();
  }
  await applyFencingRbac(cp);
  const net = loopbackNet();
  for (const [di, dist] of dists.entries()) {
    for (const mode of modes) {
      for (const c of cases) {
        const name = `soak-${mode}-${c}${dists.length > 1 ? `-d${di}` : ""}`;
        const label = `${dists.length > 1 ? `${path.basename(dist)} ` : ""}${mode} ${c}`;
        const address = `${net}.${11 + procs.length}`;
        procs.push(await prepareAgent(cp, stack, { dist, mode, c, name, label, address }));
      }
    }
  }
  const bare: Proc = {
    name: "bare Node 24",
    argv: [nodeBinary(), "-e", "setInterval(() => {}, 1 << 30)"],
    started: 0,
    samples: [],
  };
  procs.push(bare);
  for (const p of procs) {
    const out = p.log ? openSync(p.log, "a") : "ignore";
    p.proc = spawn(p.argv[0] as string, p.argv.slice(1), { stdio: ["ignore", out, out] });
    if (typeof out === "number") closeSync(out);
    p.started = Date.now();
  }
  const loadAtStart = await loadAverage();
  await soak(procs);
  await report(procs, bare, loadAtStart);
} finally {
  await Promise.all(
    procs.map(
      (p) =>
        alive(p) &&
        new Promise((r) => {
          const kill = setTimeout(() => p.proc?.kill("SIGKILL"), 10_000);
          p.proc?.once("exit", () => r(clearTimeout(kill)));
          p.proc?.kill("SIGTERM");
        }),
    ),
  );
  for (const p of procs) p.watchdog?.close();
  await (stack ? stack.stop() : cp?.stop());
  if (values.keep) console.log(`kept: ${work} (the agents' logs) and their roots: ${roots.join(" ")}`);
  else for (const d of [work, ...roots]) await rm(d, { recursive: true, force: true });
}
process.exit(0);
