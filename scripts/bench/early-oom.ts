// npm run bench -- early-oom [--runs N] [--real-runs N] [--idle-seconds N] [--skip-kill]
//   [--skip-onset] [--skip-real] [--skip-idle]
//
// 1. Trigger met → victim's tasks gone: EarlyOom (the class the agent runs) with its clock
//    stepped by the bench and PSI files it reads from a tree, against REAL cgroups of this
//    kernel (v1 memory + freezer, laid out as the kubelet's systemd driver lays them out): a
//    victim pod whose 4 tasks each hold 64 MiB, beside two pods that must survive. Measured from
//    the start of the sample that meets the trigger to the kernel listing no task in the
//    victim's cgroups. Root only. Also the v2 cgroup.kill path alone (killPod on the cgroup2
//    mount; this machine's v2 tree has no memory controller, so the agent cannot rank there).
// 2. Stall onset → kill, fixed 250 ms sampling vs the adaptive pace (pace.ts), on the stepped
//    clock: a calm node (PSI still, memory to spare) thrashes from one moment to the next, at a
//    random phase of the sampling; how long after the earliest possible kill (onset + the
//    trigger's duration) the kill comes. The worst case of the pace: no warning at all.
// 3. Real pressure onset → kill, fixed vs adaptive, alternating: a pod of real cgroups thrashes
//    (RealThrash, as the real-pressure test makes it) under real PSI read by EarlyOom on the
//    real clock, with the real-pressure test's thresholds (2% full stall for 2 s, reclaim); from
//    its readers starting to its kill. Root only.
// 4. Idle cost, side by side: the shipped dist/bashible daemon (lite mode) idling on a converged
//    sandbox, early OOM off, on with fixed 250 ms sampling (before the pace), on with the pace,
//    and on with the pace + the metrics endpoint (what ships). Early OOM in dry run, reading
//    this machine's real /proc and cgroups. CPU per minute from /proc/<pid>/stat (utime +
//    stime) and schedstat, from 60 s to the end (at least 2 min); RSS at 60 s and at the end
//    (10 min by default).
import { percentile } from "../lib/stats.ts";
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { existsSync } from "node:fs";
import { readFile, rm, mkdtemp, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { buildDist } from "../build.ts";
import { makeBundle, sandbox, script, writeBundle } from "../lib/bundle.ts";
import { cpuMs, rssKb } from "../lib/proc-stats.ts";
import {
  captureLogger,
  FakeNode,
  hasV1MemoryAndFreezer,
  podObject,
  RealCgroups,
  RealThrash,
  v2Mount,
} from "../lib/early-oom.ts";
import { sleep } from "../../lib/sleep.ts";
import { Registry } from "../../lib/prometheus.ts";
import { EarlyOom, type EarlyOomConfig } from "../../agent/early-oom/early-oom.ts";
import { StaticPods } from "../../agent/early-oom/pods.ts";
import { DEFAULT_EARLY_OOM } from "../../agent/early-oom/config.ts";
import { killPod } from "../../agent/early-oom/kill.ts";

const { values } = parseArgs({
  options: {
    runs: { type: "string", default: "20" },
    "real-runs": { type: "string", default: "5" },
    "idle-seconds": { type: "string", default: "600" },
    "skip-kill": { type: "boolean", default: false },
    "skip-onset": { type: "boolean", default: false },
    "skip-real": { type: "boolean", default: false },
    "skip-idle": { type: "boolean", default: false },
  },
});
const RUNS = Number(values.runs);
const REAL_RUNS = Number(values["real-runs"]);
const IDLE = Number(values["idle-seconds"]);
const WARMUP = 60;
if (!values["skip-idle"] && IDLE - WARMUP < 120)
  throw new Error(
    `--idle-seconds must be at least ${WARMUP + 120}: CPU is measured over at least 2 minutes after 60 s`,
  );

const pct = percentile;
const median = (xs: number[]) => pct(xs, 50);
const ms = (x: number) => `${x.toFixed(1)} ms`;
const report: string[] = [];
const say = (line: string) => {
  report.push(line);
  console.log(line);
};

// Each victim task holds 64 MiB of its own memory, so its exit has real work to do. The real
// interpreter, not a version-manager shim that forks helpers first.
const PYTHON = spawnSync("python3", ["-c", "import sys; print(sys.executable)"], { encoding: "utf8" }).stdout.trim();
const HOLDER = `exec ${PYTHON} -c 'b = bytearray(64 << 20)
for i in range(0, len(b), 4096): b[i] = 1
import time; time.sleep(100000)'`;

/** Until every holder has touched its 64 MiB. */
async function holding(procs: ChildProcess[]): Promise<void> {
  for (let i = 0; i < 1000; i++) {
    const rss = await Promise.all(procs.map((p) => rssKb(p.pid as number).catch(() => 0)));
    if (rss.every((kb) => kb >= 64 * 1024)) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error("memory holders did not allocate");
}

function podRel(qos: "besteffort" | "burstable", uid: string): string {
  const u = uid.replaceAll("-", "_");
  return `kubepods.slice/kubepods-${qos}.slice/kubepods-${qos}-pod${u}.slice`;
}

async function killLatencyV1(): Promise<number[]> {
  const out: number[] = [];
  for (let run = 0; run < RUNS; run++) {
    const cg = new RealCgroups(1);
    const node = new FakeNode({ version: 1, driver: "systemd" }); // its /proc tree only
    try {
      const victim = { name: "victim", qos: "BestEffort" as const, workingSetMi: 256, uid: randomUUID() };
      const others = [
        { name: "api", qos: "Burstable" as const, workingSetMi: 64, requestMi: 512, uid: randomUUID() },
        { name: "worker", qos: "Burstable" as const, workingSetMi: 64, requestMi: 512, uid: randomUUID() },
      ];
      const rels = new Map<string, string>();
      for (const p of [victim, ...others]) {
        const rel = podRel(p.qos === "BestEffort" ? "besteffort" : "burstable", p.uid);
        rels.set(p.name, rel);
        cg.mkdir(`${rel}/cri-containerd-sandbox.scope`);
        const started = [cg.start(`${rel}/cri-containerd-sandbox.scope`, "exec sleep 100000")];
        for (const c of ["a", "b"]) {
          cg.mkdir(`${rel}/cri-containerd-${c}.scope`);
          for (let k = 0; k < 2; k++)
            started.push(cg.start(`${rel}/cri-containerd-${c}.scope`, p === victim ? HOLDER : "exec sleep 100000"));
        }
        await cg.joined(rel, started);
        if (p === victim) await holding(started.slice(1));
      }
      const eo = new EarlyOom({
        procRoot: node.procRoot,
        cgroupRoot: cg.cgroupRoot,
        sysrqPath: node.sysrqPath,
        nodeName: "bench",
        log: captureLogger(),
        kube: () => undefined,
        metrics: new Registry(),
        clock: node.clock,
        pods: new StaticPods([victim, ...others].map((p) => podObject(p, p.uid))),
      });
      eo.configure({ fallback: "none" });
      let latency: number | undefined;
      for (let step = 0; step < 40 && latency === undefined; step++) {
        const t0 = performance.now();
        await node.run(250, { full: 0.6, some: 0.85, memAvailableMi: 200, scan: 20_000, refault: 5000 }, 250);
        if (eo.status().actions.kill) {
          if (cg.pids(rels.get("victim") ?? "").length) throw new Error("victim still has tasks after the kill");
          latency = performance.now() - t0;
        }
      }
      await eo.stop();
      if (latency === undefined) throw new Error("no kill");
      if (eo.status().lastAction?.pod !== "default/victim")
        throw new Error(`wrong victim ${eo.status().lastAction?.pod}`);
      for (const p of others) if (cg.pids(rels.get(p.name) ?? "").length < 5) throw new Error(`${p.name} lost tasks`);
      out.push(latency);
    } finally {
      node.cleanup();
      cg.cleanup();
    }
  }
  return out;
}

async function killLatencyV2(): Promise<number[]> {
  const out: number[] = [];
  for (let run = 0; run < RUNS; run++) {
    const cg = new RealCgroups(2);
    try {
      const rel = podRel("besteffort", randomUUID());
      cg.mkdir(`${rel}/cri-containerd-sandbox.scope`);
      const started = [cg.start(`${rel}/cri-containerd-sandbox.scope`, "exec sleep 100000")];
      for (const c of ["a", "b"]) {
        cg.mkdir(`${rel}/cri-containerd-${c}.scope`);
        for (let k = 0; k < 2; k++) started.push(cg.start(`${rel}/cri-containerd-${c}.scope`, HOLDER));
      }
      await cg.joined(rel, started);
      await holding(started.slice(1));
      const r = await killPod({ version: 2, memoryDir: cg.dirs(rel)[0] as string }, 5000);
      if (r.remaining) throw new Error("tasks left");
      out.push(r.durationMs);
    } finally {
      cg.cleanup();
    }
  }
  return out;
}

if (!values["skip-kill"]) {
  if (process.getuid?.() !== 0 || !hasV1MemoryAndFreezer()) {
    say("kill latency: skipped (needs root and the cgroup v1 memory + freezer controllers)");
  } else {
    const v1 = await killLatencyV1();
    say(
      `trigger met → victim's tasks gone (EarlyOom, real v1 cgroups, freeze + SIGKILL, 5 tasks / 256 MiB), ${RUNS} runs: p50 ${ms(median(v1))}, p99 ${ms(pct(v1, 99))}, max ${ms(Math.max(...v1))}  (goal p99 ≤ 1000 ms)`,
    );
    if (v2Mount()) {
      const v2 = await killLatencyV2();
      say(
        `cgroup.kill → tasks gone (killPod alone, real cgroup2, 5 tasks / 256 MiB), ${RUNS} runs: p50 ${ms(median(v2))}, p99 ${ms(pct(v2, 99))}, max ${ms(Math.max(...v2))}`,
      );
    }
  }
}

const THRASH = { full: 0.6, some: 0.85, memAvailableMi: 200, scan: 20_000, refault: 5000 };
const QUIET = { full: 0, some: 0, memAvailableMi: 6000 };
const FIXED = { calmSampleIntervalMs: 250 };

/** Node-clock ms from the earliest possible kill (onset + duration) to the kill, one per run. */
async function onsetToKill(cfg: Partial<EarlyOomConfig>): Promise<number[]> {
  const out: number[] = [];
  for (let run = 0; run < RUNS; run++) {
    const node = new FakeNode({ version: 2, driver: "systemd" });
    try {
      const victim = node.addPod({
        name: "victim",
        qos: "BestEffort",
        workingSetMi: 900,
        containers: 1,
        tasksPerContainer: 1,
      });
      const eo = new EarlyOom({
        procRoot: node.procRoot,
        cgroupRoot: node.cgroupRoot,
        sysrqPath: node.sysrqPath,
        nodeName: "bench",
        log: captureLogger(),
        kube: () => undefined,
        metrics: new Registry(),
        clock: node.clock,
        pods: new StaticPods(node.podList()),
      });
      eo.configure({ fallback: "none", ...cfg });
      // Calm long enough for the slow pace, then thrash at a random phase of the sampling.
      await node.run(10_000 + Math.floor(Math.random() * 1000), QUIET, 10);
      const onset = node.clock.now();
      while (!eo.status().actions.kill && node.clock.now() - onset < 20_000) await node.run(10, THRASH, 10);
      await eo.stop();
      if (!eo.status().actions.kill) throw new Error("no kill");
      await node.exited(victim);
      out.push(node.clock.now() - onset - (eo.status().config?.durationMs ?? 3000));
    } finally {
      node.cleanup();
    }
  }
  return out;
}

if (!values["skip-onset"]) {
  const fixed = await onsetToKill(FIXED);
  const adaptive = await onsetToKill({});
  const line = (xs: number[]) => `p50 ${ms(median(xs))}, p99 ${ms(pct(xs, 99))}, max ${ms(Math.max(...xs))}`;
  say(
    `stall onset on a calm node → kill, beyond the trigger's 3 s duration (stepped clock, 1 s window, ${RUNS} runs at random phases):`,
  );
  say(`  fixed 250 ms sampling:            ${line(fixed)}`);
  say(`  adaptive (${DEFAULT_EARLY_OOM.calmSampleIntervalMs} ms calm, 250 ms near): ${line(adaptive)}`);
}

/** Wall ms from a real thrash's readers starting to the kill, alternating fixed and adaptive. */
async function realOnsetToKill(): Promise<{ fixed: number[]; adaptive: number[] }> {
  const res = { fixed: [] as number[], adaptive: [] as number[] };
  const work = await mkdtemp(path.join(os.tmpdir(), "bench-early-oom-real-"));
  try {
    for (let run = 0; run < REAL_RUNS * 2; run++) {
      const which = run % 2 === 0 ? "fixed" : "adaptive";
      const thrash = new RealThrash(work);
      const sysrq = path.join(work, "sysrq-trigger");
      await writeFile(sysrq, "");
      const input = { name: "thrasher", qos: "BestEffort" as const, workingSetMi: 64, uid: randomUUID() };
      const eo = new EarlyOom({
        procRoot: "/proc",
        cgroupRoot: thrash.cg.cgroupRoot,
        sysrqPath: sysrq,
        nodeName: "bench",
        log: captureLogger(),
        kube: () => undefined,
        metrics: new Registry(),
        pods: new StaticPods([podObject(input, input.uid)]),
      });
      try {
        eo.configure({
          fullStallPercent: 2,
          durationMs: 2000,
          memAvailablePercent: 0,
          reclaimPagesPerSecond: 256,
          cooldownMs: 600_000,
          fallback: "none",
          ...(which === "fixed" ? FIXED : {}),
        });
        thrash.dataFile(160); // written (and its cache dropped) before the clock starts
        await sleep(3000); // calm: the adaptive pace is slow when the readers start
        const t0 = performance.now();
        await thrash.start(input, 160, 8);
        while (!eo.status().actions.kill && performance.now() - t0 < 120_000) await sleep(5);
        if (!eo.status().actions.kill) throw new Error("no kill under real pressure within 120 s");
        res[which].push(performance.now() - t0);
      } finally {
        await eo.stop();
        thrash.cleanup();
      }
    }
  } finally {
    await rm(work, { recursive: true, force: true });
  }
  return res;
}

if (!values["skip-real"]) {
  if (process.getuid?.() !== 0 || !hasV1MemoryAndFreezer() || !existsSync("/proc/pressure/memory")) {
    say("real pressure onset → kill: skipped (needs root, PSI and the cgroup v1 memory + freezer controllers)");
  } else {
    const r = await realOnsetToKill();
    const line = (xs: number[]) =>
      `p50 ${ms(median(xs))}, max ${ms(Math.max(...xs))} [${xs.map((x) => Math.round(x)).join(", ")}]`;
    say(
      `real thrash starts → pod killed (real PSI, 2% full stall held 2 s + reclaim, ${REAL_RUNS} runs each, alternating):`,
    );
    say(`  fixed 250 ms sampling: ${line(r.fixed)}`);
    say(`  adaptive pace:         ${line(r.adaptive)}`);
  }
}

/** Time on the CPU, ms (schedstat: ns resolution). */
async function schedCpuMs(pid: number): Promise<number> {
  return Number((await readFile(`/proc/${pid}/schedstat`, "utf8")).split(" ")[0]) / 1e6;
}

if (!values["skip-idle"]) {
  const work = await mkdtemp(path.join(os.tmpdir(), "bench-early-oom-"));
  const dist = path.join(work, "dist");
  await buildDist(dist);
  const BIN = path.join(dist, "bashible");
  const root = await sandbox();
  const bundleFile = await writeBundle(work, makeBundle([script("050_x", "true")]));
  const once = spawnSync(BIN, ["once", "--root", root, "--bundle", bundleFile], { encoding: "utf8" });
  if (once.status !== 0) throw new Error(`converge before measuring failed: ${once.stdout}${once.stderr}`);
  // Dry run and no sysrq fallback: real pressure elsewhere on this machine must not make the bench act.
  const config = async (name: string, c: Partial<EarlyOomConfig>) => {
    const f = path.join(work, `${name}.json`);
    await writeFile(f, JSON.stringify({ fallback: "none", ...c }));
    return f;
  };
  const fixedCfg = await config("fixed", FIXED);
  const paceCfg = await config("pace", {});
  const slowCfg = await config("pace-2s", { calmSampleIntervalMs: 2000 });
  const base = ["run", "--bundle", bundleFile, "--tick", "3600"];
  const real = ["--early-oom", "dry-run", "--proc-root", "/proc", "--cgroup-root", "/sys/fs/cgroup"];
  // Each its own root: the metrics socket and state files are per root.
  const roots: string[] = [];
  const rootFor = async () => {
    const r = await sandbox();
    roots.push(r);
    spawnSync(BIN, ["once", "--root", r, "--bundle", bundleFile]);
    return r;
  };
  const variants: [string, string[]][] = [
    ["early OOM off, metrics off", ["--early-oom", "off", "--metrics-address", "off"]],
    ["early OOM on, fixed 250 ms, metrics off", [...real, "--early-oom-config", fixedCfg, "--metrics-address", "off"]],
    ["early OOM on, adaptive pace, metrics off", [...real, "--early-oom-config", paceCfg, "--metrics-address", "off"]],
    [
      "early OOM on, pace with 2 s calm, metrics off",
      [...real, "--early-oom-config", slowCfg, "--metrics-address", "off"],
    ],
    [
      "early OOM on, adaptive pace + metrics (ships)",
      [...real, "--early-oom-config", paceCfg, "--metrics-address", "127.0.0.1:19650"],
    ],
  ];
  const procs: { name: string; p: ChildProcess }[] = [];
  for (const [name, args] of variants)
    procs.push({ name, p: spawn(BIN, [...base, "--root", await rootFor(), ...args], { stdio: "ignore" }) });
  const t0 = performance.now();
  const at = async (s: number) => {
    const wait = t0 + s * 1000 - performance.now();
    if (wait > 0) await sleep(wait);
  };
  await at(WARMUP);
  const pid = (p: ChildProcess) => p.pid as number;
  const rss60 = await Promise.all(procs.map(({ p }) => rssKb(pid(p))));
  const stat0 = await Promise.all(procs.map(({ p }) => cpuMs(pid(p))));
  const sched0 = await Promise.all(procs.map(({ p }) => schedCpuMs(pid(p))));
  const w0 = performance.now();
  await at(IDLE);
  const stat1 = await Promise.all(procs.map(({ p }) => cpuMs(pid(p))));
  const sched1 = await Promise.all(procs.map(({ p }) => schedCpuMs(pid(p))));
  const minutes = (performance.now() - w0) / 60_000;
  const rssEnd = await Promise.all(procs.map(({ p }) => rssKb(pid(p))));
  for (const { p } of procs) p.kill("SIGKILL");
  const cpuStat = procs.map((_, i) => ((stat1[i] ?? 0) - (stat0[i] ?? 0)) / minutes);
  const cpuSched = procs.map((_, i) => ((sched1[i] ?? 0) - (sched0[i] ?? 0)) / minutes);
  say(
    `idle daemon (dist/bashible run, lite mode), side by side; CPU from ${WARMUP} s to ${IDLE} s (${minutes.toFixed(1)} min), RSS at ${WARMUP} s and ${IDLE} s:`,
  );
  say(
    `  ${"".padEnd(46)} ${"RSS 60 s".padStart(9)} ${`RSS ${IDLE} s`.padStart(10)}  CPU ms/min (stat, schedstat)  early OOM's share`,
  );
  for (const [i, { name }] of procs.entries()) {
    const share = i === 0 ? "" : `${((cpuSched[i] ?? 0) - (cpuSched[0] ?? 0)).toFixed(1)} ms/min`;
    say(
      `  ${name.padEnd(46)} ${`${((rss60[i] ?? 0) / 1024).toFixed(1)} MB`.padStart(9)} ${`${((rssEnd[i] ?? 0) / 1024).toFixed(1)} MB`.padStart(10)}  ${(cpuStat[i] ?? 0).toFixed(0).padStart(5)}, ${(cpuSched[i] ?? 0).toFixed(1).padStart(6)}               ${share}`,
    );
  }
  say("  goals: the whole agent ≤ 90 ms/min idle; early OOM's share ≈ 20 ms/min or below");
  await rm(work, { recursive: true, force: true });
  for (const r of [root, ...roots]) await rm(r, { recursive: true, force: true });
}
console.log(
  `\n${new Date().toISOString()} ${os.cpus().length} CPUs, load ${os
    .loadavg()
    .map((x) => x.toFixed(1))
    .join(" ")}`,
);
