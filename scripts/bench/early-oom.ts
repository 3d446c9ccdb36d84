// npm run bench -- early-oom [--runs N] [--idle-seconds N] [--rounds N] [--skip-kill] [--skip-idle]
//
// 1. Trigger met → victim's tasks gone: EarlyOom (the class the agent runs) with its clock
//    stepped by the bench and PSI files it reads from a tree, against REAL cgroups of this
//    kernel (v1 memory + freezer, laid out as the kubelet's systemd driver lays them out): a
//    victim pod whose 4 tasks each hold 64 MiB, beside two pods that must survive. Measured from
//    the start of the sample that meets the trigger to the kernel listing no task in the
//    victim's cgroups. Root only. Also the v2 cgroup.kill path alone (killPod on the cgroup2
//    mount; this machine's v2 tree has no memory controller, so the agent cannot rank there).
// 2. Idle cost, side by side, the shipped dist/bashible daemon (lite mode) idling on a converged
//    sandbox: early OOM off vs on (dry run, reading this machine's real /proc and cgroups, 4
//    samples a second), and on + the metrics endpoint. CPU from /proc/<pid>/schedstat (ns) over
//    the idle window; RSS at its end. Medians of --rounds.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { readFile, rm, mkdtemp, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { buildDist } from "../build.ts";
import { makeBundle, sandbox, script, writeBundle } from "../lib/bundle.ts";
import { captureLogger, FakeNode, hasV1MemoryAndFreezer, podObject, RealCgroups, v2Mount } from "../lib/early-oom.ts";
import { Registry } from "../../lib/prometheus.ts";
import { EarlyOom } from "../../agent/early-oom/early-oom.ts";
import { StaticPods } from "../../agent/early-oom/pods.ts";
import { killPod } from "../../agent/early-oom/kill.ts";

const { values } = parseArgs({
  options: {
    runs: { type: "string", default: "20" },
    "idle-seconds": { type: "string", default: "60" },
    rounds: { type: "string", default: "3" },
    "skip-kill": { type: "boolean", default: false },
    "skip-idle": { type: "boolean", default: false },
  },
});
const RUNS = Number(values.runs);
const IDLE = Number(values["idle-seconds"]);
const ROUNDS = Number(values.rounds);

const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)] ?? Number.NaN;
};
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

async function cpuNs(pid: number): Promise<number> {
  return Number((await readFile(`/proc/${pid}/schedstat`, "utf8")).split(" ")[0]);
}
async function rssKb(pid: number): Promise<number> {
  return Number(/VmRSS:\s+(\d+)/.exec(await readFile(`/proc/${pid}/status`, "utf8"))?.[1] ?? 0);
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
  const cfg = path.join(work, "early-oom.json");
  await writeFile(cfg, JSON.stringify({ fallback: "none" }));
  const base = ["run", "--root", root, "--bundle", bundleFile, "--tick", "3600"];
  const real = ["--proc-root", "/proc", "--cgroup-root", "/sys/fs/cgroup", "--early-oom-config", cfg];
  let port = 19650;
  const variants: Record<string, () => string[]> = {
    "early OOM off, metrics off": () => [...base, "--early-oom", "off", "--metrics-address", "off"],
    "early OOM on (dry run), metrics off": () => [
      ...base,
      "--early-oom",
      "dry-run",
      ...real,
      "--metrics-address",
      "off",
    ],
    "early OOM on (dry run) + metrics endpoint": () => [
      ...base,
      "--early-oom",
      "dry-run",
      ...real,
      "--metrics-address",
      `127.0.0.1:${port++}`,
    ],
  };
  const cpu: Record<string, number[]> = Object.fromEntries(Object.keys(variants).map((k) => [k, []]));
  const rss: Record<string, number[]> = Object.fromEntries(Object.keys(variants).map((k) => [k, []]));
  const WARMUP = 10;
  for (let r = 0; r < ROUNDS; r++) {
    const procs: [string, ChildProcess][] = Object.entries(variants).map(([name, args]) => [
      name,
      spawn(BIN, args(), { stdio: "ignore" }),
    ]);
    await new Promise((res) => setTimeout(res, WARMUP * 1000));
    const c0 = await Promise.all(procs.map(([, p]) => cpuNs(p.pid as number)));
    const t0 = performance.now();
    await new Promise((res) => setTimeout(res, IDLE * 1000));
    const c1 = await Promise.all(procs.map(([, p]) => cpuNs(p.pid as number)));
    const wallNs = (performance.now() - t0) * 1e6;
    for (const [i, [name, p]] of procs.entries()) {
      cpu[name]?.push((((c1[i] ?? 0) - (c0[i] ?? 0)) / wallNs) * 100);
      rss[name]?.push(await rssKb(p.pid as number));
      p.kill("SIGKILL");
    }
  }
  const names = Object.keys(variants);
  const off = names[0] as string;
  say(
    `idle daemon (dist/bashible run, lite mode), ${IDLE} s after ${WARMUP} s warm-up, medians of ${ROUNDS} side-by-side rounds:`,
  );
  for (const n of names) {
    const dRss = (median(rss[n] ?? []) - median(rss[off] ?? [])) / 1024;
    const dCpu = median(cpu[n] ?? []) - median(cpu[off] ?? []);
    say(
      `  ${n.padEnd(42)} RSS ${(median(rss[n] ?? []) / 1024).toFixed(1)} MB${n === off ? "" : ` (${dRss >= 0 ? "+" : ""}${dRss.toFixed(1)} MB)`}  CPU ${median(cpu[n] ?? []).toFixed(3)} % of a core${n === off ? "" : ` (${dCpu >= 0 ? "+" : ""}${dCpu.toFixed(3)})`}  [RSS ${(rss[n] ?? []).map((x) => (x / 1024).toFixed(1)).join(", ")}; CPU ${(cpu[n] ?? []).map((x) => x.toFixed(3)).join(", ")}]`,
    );
  }
  say("  goals: early OOM adds ≤ 3 MB RSS and ≤ 0.5 % of a core");
  await rm(work, { recursive: true, force: true });
  await rm(root, { recursive: true, force: true });
}
console.log(
  `\n${new Date().toISOString()} ${os.cpus().length} CPUs, load ${os
    .loadavg()
    .map((x) => x.toFixed(1))
    .join(" ")}`,
);
