// npm run bench -- fencing [--only gap,restart,isolation,outage,rss,idle] [--gap-seconds N]
//                          [--samples N] [--compression K] [--rss-seconds N] [--idle-seconds N]
//                          [--baseline DIST] [--with-metrics]
//
// The shipped agent (dist/bashible, --lite-mode) on a real kube-apiserver, each node with a
// FIFO for its watchdog (bytes timed where the test reads them):
// 1. gap: largest gap between pets (pet interval 1 s) while converges run back to back in the
//    child (a CPU-bound script step), then with two CPU hogs on this 2-core machine as well.
//    Early OOM runs beside it in dry-run on this machine's real /proc and cgroups. Goal: <= 1.5 x
//    interval. A third phase renices the agent to -5.
// 2. isolation: one node of three cut off (API and peers, through relays) → its last pet,
//    against the detection window of the timings used. Goal: <= the window.
// 3. outage: 10 nodes, the API server stopped (SIGSTOP) for 5 minutes time-compressed by K
//    (every fencing interval divided by K, the outage too; the peer deadline, a latency
//    budget, stays 3 s). Goal: 0 nodes stop petting.
// 4. rss: the resident agent with fencing on (Watchdog) vs off, side by side. Goal: <= +3 MB.
// 5. idle: the same pair at the default timings for --idle-seconds (default 600), kubelets
//    renewing their Leases every 10 s: RSS at 60 s and at the end, and CPU per idle minute
//    (utime + stime from /proc/PID/stat, from 60 s to the end). Goal: fencing's share
//    <= 20 ms per minute (Deckhouse's fencing-agent), RSS <= +3 MB. --baseline DIST also runs
//    that build's agent with fencing on beside them (before/after under the same load);
//    --with-metrics runs every agent with its metrics endpoint on, as shipped.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, readdir, readFile, rename, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { buildDist } from "../build.ts";
import { freePort, startControlPlane } from "../lib/control-plane.ts";
import { type FencingCluster, type FencingNode, startFencingCluster } from "../lib/fencing.ts";
import { makeBundle, script } from "../lib/bundle.ts";
import { cpuMs, rssKb } from "../lib/proc-stats.ts";
import { waitFor } from "../lib/cli.ts";
import { DEFAULT_AGENT_TIMINGS, detectionWindowMs } from "../../bundles/fencing.ts";
import { parseTimings } from "../../agent/fencing/options.ts";
import { microTime } from "../../lib/kube/api.ts";
import { sleep } from "../../lib/sleep.ts";

const { values } = parseArgs({
  options: {
    only: { type: "string", default: "gap,restart,isolation,outage,rss,idle" },
    "gap-seconds": { type: "string", default: "60" },
    samples: { type: "string", default: "5" },
    compression: { type: "string", default: "5" },
    "rss-seconds": { type: "string", default: "60" },
    "idle-seconds": { type: "string", default: "600" },
    /** A dist/ built from another tree (git archive <rev>): its agent runs the idle phase beside this one. */
    baseline: { type: "string" },
    "with-metrics": { type: "boolean", default: false },
  },
});
const only = new Set(values.only.split(","));
const work = await mkdtemp(path.join(os.tmpdir(), "bench-fencing-"));
const dist = path.join(work, "dist");
await buildDist(dist);
const command = { bin: path.join(dist, "bashible"), prefix: [] };
const cp = await startControlPlane();
const clusters: FencingCluster[] = [];
const report: string[] = [];
const say = (s: string) => {
  report.push(s);
  console.log(s);
};
const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? Number.NaN;
};
const median = (xs: number[]) => pct(xs, 50);
/** CPU time of every thread of a process so far, in ms, from schedstat (ns: finer than USER_HZ). */
async function schedMs(pid: number): Promise<number> {
  let ns = 0;
  for (const tid of await readdir(`/proc/${pid}/task`))
    ns += Number((await readFile(`/proc/${pid}/task/${tid}/schedstat`, "utf8").catch(() => "0")).split(" ")[0]);
  return ns / 1e6;
}
async function startedAtMs(pid: number): Promise<number> {
  const stat = await readFile(`/proc/${pid}/stat`, "utf8");
  const ticks = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19]);
  const boot = Date.now() - os.uptime() * 1000;
  return boot + ticks * 10;
}

try {
  if (only.has("gap")) {
    const timings = "pet=1,check=1,api=0.8,peer=0.6,rounds=3";
    // Early OOM samples the machine's real PSI and cgroups beside the pets (dry-run: it kills nothing).
    const c = await startFencingCluster(cp, {
      group: "gap",
      nodes: [{ name: "gap-a" }],
      timings,
      command,
      agentArgs: [
        "--early-oom",
        "dry-run",
        "--proc-root",
        "/proc",
        "--cgroup-root",
        "/sys/fs/cgroup",
        "--metrics-address",
        "off",
      ],
    });
    clusters.push(c);
    const n = c.nodes[0]!;
    n.agent.start();
    await n.watchdog.nextPets(3);
    // Converges back to back: each bundle change is a new checksum; first_run skips approval.
    let i = 0;
    let converges = 0;
    let stop = false;
    const burn = (k: number) =>
      script(
        "050_burn",
        `# ${k}\ni=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; echo ${k} > "$BASHIBLE_ROOT/burnt"`,
      );
    const driver = (async () => {
      while (!stop) {
        const done = n.agent.waitMsg(/converge finished|converge did not finish/, 120_000);
        await writeFile(path.join(n.root, "var/lib/bashible/first_run"), "");
        const b = makeBundle([burn(++i)], {
          group: "gap",
          context: JSON.parse(await readFile(n.bundleFile, "utf8")).context,
        });
        await writeFile(`${n.bundleFile}.tmp`, JSON.stringify(b));
        await rename(`${n.bundleFile}.tmp`, n.bundleFile);
        await done.catch(() => undefined);
        converges++;
      }
    })();
    const phase = async (label: string, seconds: number) => {
      const from = n.watchdog.bytes.length;
      const c0 = converges;
      await sleep(seconds * 1000);
      const ts = n.watchdog.bytes.slice(from).map((b) => b.t);
      const gaps = ts.slice(1).map((t, k) => t - (ts[k] ?? t));
      const max = Math.max(...gaps);
      say(
        `pet gap (${label}; interval 1000 ms; ${gaps.length} gaps, ${converges - c0} converges): p50 ${median(gaps).toFixed(0)} ms, p99 ${pct(gaps, 99).toFixed(0)} ms, max ${max.toFixed(0)} ms = ${(max / 1000).toFixed(2)} x interval (goal <= 1.5)`,
      );
    };
    const secs = Number(values["gap-seconds"]);
    await phase("converges running", secs);
    const hogs: ChildProcess[] = [0, 1].map(() => spawn(process.execPath, ["-e", "for(;;){}"], { stdio: "ignore" }));
    try {
      await phase("converges + 2 CPU hogs on 2 cores", secs);
      // The mitigation a unit file could apply (Nice=-5); converge children inherit it.
      os.setPriority(n.agent.proc!.pid!, -5);
      await phase("converges + 2 CPU hogs, agent at nice -5", secs);
    } finally {
      for (const h of hogs) h.kill("SIGKILL");
    }
    stop = true;
    await driver;
    await n.agent.signal("SIGTERM");
  }

  if (only.has("restart")) {
    // A crash: SIGKILL, then the agent started again at once (systemd adds RestartSec=5).
    const c = await startFencingCluster(cp, { group: "rst", nodes: [{ name: "rst-a" }], command });
    clusters.push(c);
    const n = c.nodes[0]!;
    n.agent.start();
    await n.watchdog.nextPets(2, 120_000);
    const startup: number[] = [];
    const unpetted: number[] = [];
    for (let s = 0; s < Number(values.samples); s++) {
      await n.watchdog.nextPets(1);
      await n.agent.signal("SIGKILL");
      const last = n.watchdog.bytes.at(-1)?.t ?? 0;
      const first = n.watchdog.nextPets(1, 120_000);
      const t0 = Number(process.hrtime.bigint()) / 1e6;
      n.agent.start();
      await first;
      const t1 = n.watchdog.bytes.at(-1)?.t ?? t0;
      startup.push(t1 - t0);
      unpetted.push(t1 - last);
    }
    say(
      `crash → restart (SIGKILL, started again at once; default timings), ${startup.length} samples: process start → first pet median ${median(startup).toFixed(0)} ms, max ${Math.max(...startup).toFixed(0)} ms; last pet → first pet max ${Math.max(...unpetted).toFixed(0)} ms (+ RestartSec 5 s under systemd; watchdog timeout 60 s)`,
    );
    await n.agent.signal("SIGTERM");
  }

  if (only.has("isolation")) {
    const timings = "pet=0.5,check=1,api=2,peer=1.5,rounds=3";
    const windowMs = detectionWindowMs({ ...DEFAULT_AGENT_TIMINGS, ...parseTimings(timings) });
    const c = await startFencingCluster(cp, {
      group: "iso",
      nodes: [{ name: "iso-a" }, { name: "iso-b" }, { name: "iso-c" }],
      timings,
      command,
    });
    clusters.push(c);
    for (const n of c.nodes) n.agent.start();
    const [a, b] = c.nodes as [(typeof c.nodes)[0], (typeof c.nodes)[0]];
    for (const n of c.nodes)
      await waitFor(`${n.name} knows its peers`, async () => (await n.status())?.peersKnown === 2, 60_000);
    const took: number[] = [];
    for (let s = 0; s < Number(values.samples); s++) {
      await a.watchdog.nextPets(2);
      const stopped = a.agent.waitMsg(/stopped petting/, 120_000);
      const t0 = Number(process.hrtime.bigint()) / 1e6;
      a.cut();
      await stopped;
      await b.watchdog.nextPets(3); // time for any pet in flight to arrive
      const last = a.watchdog.bytes.filter((x) => x.b !== "V").at(-1)?.t ?? t0;
      took.push(last - t0);
      const healthy = a.agent.waitMsg(/healthy again/, 120_000);
      a.heal();
      await healthy;
    }
    say(
      `isolation → last pet (${timings}; detection window ${windowMs} ms), ${took.length} samples: median ${median(took).toFixed(0)} ms, max ${Math.max(...took).toFixed(0)} ms = ${(Math.max(...took) / windowMs).toFixed(2)} x window (goal <= 1)`,
    );
    for (const n of c.nodes) await n.agent.signal("SIGTERM");
  }

  if (only.has("outage")) {
    const k = Number(values.compression);
    // Intervals and durations are compressed; the peer deadline is not. It is a latency budget
    // (connect, TLS handshake, answer), and here the first round of an outage makes 90 TLS
    // handshakes at once through this process's relays on a shared 2-vCPU machine: at 0.6 s it
    // measured the machine's scheduling (every answer late, every node "isolated"), not the
    // design. Peers answer within milliseconds once connected, so rounds stay about as short.
    const timings = `pet=${5 / k},check=${5 / k},api=${4 / k},peer=3,rounds=3,kubelet=${20 / k}`;
    const c = await startFencingCluster(cp, {
      group: "out",
      nodes: Array.from({ length: 10 }, (_, i) => ({ name: `out-${i}` })),
      timings,
      command,
    });
    clusters.push(c);
    for (const n of c.nodes) n.agent.start();
    for (const n of c.nodes)
      await waitFor(`${n.name} knows its peers`, async () => (await n.status())?.peersKnown === 9, 120_000);
    // Kubelets renew their Leases every 10 s (compressed), cannot during the outage, and come back
    // 7 s after it (a kubelet's retry backoff): the agents' kubelet rule must not fence anyone.
    const leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
    const micro = () => microTime(Date.now());
    for (const n of c.nodes)
      await cp.admin.request("POST", leases, {
        body: {
          metadata: { name: n.name },
          spec: { holderIdentity: n.name, leaseDurationSeconds: 40, renewTime: micro() },
        },
      });
    let kubeletsUp = true;
    let kubeletsDone = false;
    const kubelets = (async () => {
      while (!kubeletsDone) {
        if (kubeletsUp)
          await Promise.all(
            c.nodes.map((n) =>
              cp.admin
                .request("PATCH", `${leases}/${n.name}`, { body: { spec: { renewTime: micro() } } })
                .catch(() => undefined),
            ),
          );
        await sleep(10_000 / k);
      }
    })();
    for (const n of c.nodes)
      await waitFor(`${n.name} sees its kubelet`, async () => (await n.status())?.kubeletSeenAlive === true, 120_000);
    const stops = c.nodes.map((n) => n.agent.lines.filter((l) => /stopped petting/.test(String(l.msg))).length);
    const from = c.nodes.map((n) => n.watchdog.bytes.length);
    const outage = 300 / k;
    kubeletsUp = false;
    await c.pauseApiServer();
    await sleep(outage * 1000);
    await c.resumeApiServer();
    await sleep(7_000 / k);
    kubeletsUp = true;
    // Long enough after the outage for any kubelet-stale fence to have shown.
    await sleep(60_000 / k);
    kubeletsDone = true;
    await kubelets;
    const fenced = c.nodes.filter(
      (n, i) => n.agent.lines.filter((l) => /stopped petting/.test(String(l.msg))).length > (stops[i] ?? 0),
    );
    const maxGap = Math.max(
      ...c.nodes.map((n, i) => {
        const ts = n.watchdog.bytes.slice(from[i]).map((b) => b.t);
        return Math.max(...ts.slice(1).map((t, j) => t - (ts[j] ?? t)));
      }),
    );
    const verdicts = await Promise.all(
      c.nodes.map((n) => n.metric("bashible_fencing_verdicts_total", 'kind="outage"')),
    );
    const staleVerdicts = await Promise.all(
      c.nodes.map((n) => n.metric("bashible_fencing_verdicts_total", 'kind="kubelet-stale"')),
    );
    say(
      `control-plane outage of 300 s compressed ${k}x (${outage} s; ${timings}), 10 nodes with kubelets renewing every 10 s and back 7 s after the API: ${fenced.length} stopped petting (goal 0); ${verdicts.reduce((a, b) => a + b, 0)} outage verdicts; ${staleVerdicts.reduce((a, b) => a + b, 0)} kubelet-stale verdicts; largest pet gap ${maxGap.toFixed(0)} ms (interval ${5000 / k} ms)`,
    );
    // Why each one that stopped did (the first stop's decision and its peers' answers).
    for (const [i, n] of c.nodes.entries()) {
      const line = n.agent.lines.filter((l) => /stopped petting/.test(String(l.msg)))[stops[i] ?? 0];
      if (line)
        say(`  ${n.name}: ${line.verdict}: ${line.reason}; peers: ${JSON.stringify(line.peers ?? []).slice(0, 400)}`);
    }
    for (const n of c.nodes) await n.agent.signal("SIGTERM");
  }

  if (only.has("rss")) {
    const on = await startFencingCluster(cp, { group: "rss-on", nodes: [{ name: "rss-on" }], command });
    const off = await startFencingCluster(cp, { group: "rss-off", nodes: [{ name: "rss-off" }], mode: "off", command });
    clusters.push(on, off);
    const a = on.nodes[0]!;
    const b = off.nodes[0]!;
    const aPets = a.watchdog.nextPets(2, 120_000);
    const bDone = b.agent.waitMsg(/converge finished/, 120_000);
    a.agent.start();
    b.agent.start();
    await aPets;
    await bDone;
    const secs = Number(values["rss-seconds"]);
    const fields = ["VmRSS", "RssAnon", "RssFile"];
    const sa: Record<string, number[]> = { VmRSS: [], RssAnon: [], RssFile: [] };
    const sb: Record<string, number[]> = { VmRSS: [], RssAnon: [], RssFile: [] };
    for (let s = 0; s < secs / 5; s++) {
      await sleep(5000);
      for (const f of fields) {
        sa[f]!.push(await rssKb(a.agent.proc!.pid!, f));
        sb[f]!.push(await rssKb(b.agent.proc!.pid!, f));
      }
    }
    const half = (xs: number[]) => xs.slice(Math.floor(xs.length / 2));
    const m = (xs: number[]) => median(half(xs)) / 1024;
    const [rOn, rOff] = [m(sa.VmRSS!), m(sb.VmRSS!)];
    say(
      `resident RSS after ${secs} s (median of the last half of 5 s samples): fencing on ${rOn.toFixed(1)} MB, off ${rOff.toFixed(1)} MB, delta ${(rOn - rOff).toFixed(1)} MB (goal <= +3 MB); on/off ${(rOn / rOff).toFixed(2)}; of the delta: anonymous ${(m(sa.RssAnon!) - m(sb.RssAnon!)).toFixed(1)} MB, file-backed (the binary's pages, shared and reclaimable) ${(m(sa.RssFile!) - m(sb.RssFile!)).toFixed(1)} MB`,
    );
    await a.agent.signal("SIGTERM");
    await b.agent.signal("SIGTERM");
  }
  if (only.has("idle")) {
    // Production timings, not the fixture's compressed ones: the cost of an idle node.
    const timings = "pet=5,check=5,api=4,peer=3,rounds=3,kubelet=20";
    // As shipped, the metrics endpoint is on (and loads Node's http server for both); the
    // fixture's default is off, so the agents do not share a port.
    // Given after the fixture's own flags: the last --metrics-address wins.
    const extra = new Map<FencingNode, string[]>();
    const group = async (name: string, on: boolean, o: { command?: typeof command; legacy?: boolean } = {}) => {
      const c = await startFencingCluster(cp, {
        group: name,
        nodes: on ? [{ name }, { name: `${name}-b` }, { name: `${name}-c` }] : [{ name }],
        timings,
        command: o.command ?? command,
        ...(on ? {} : { mode: "off" as const }),
        ...(o.legacy ? { peerMinAgeSeconds: null } : {}),
      });
      // Each agent its own metrics port.
      if (values["with-metrics"])
        for (const n of c.nodes) extra.set(n, ["--metrics-address", `127.0.0.1:${await freePort()}`]);
      clusters.push(c);
      return c;
    };
    const on = await group("idle-on", true);
    const off = await group("idle-off", false);
    const base = values.baseline
      ? await group("idle-base", true, {
          command: { bin: path.join(values.baseline, "bashible"), prefix: [] },
          legacy: true,
        })
      : undefined;
    const leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
    const all = [...on.nodes, ...off.nodes, ...(base?.nodes ?? [])];
    for (const n of all)
      await cp.admin.request("POST", leases, {
        body: {
          metadata: { name: n.name },
          spec: { holderIdentity: n.name, leaseDurationSeconds: 40, renewTime: microTime(Date.now()) },
        },
      });
    let renewing = true;
    const kubelets = (async () => {
      while (renewing) {
        await sleep(10_000);
        await Promise.all(
          all.map((n) =>
            cp.admin
              .request("PATCH", `${leases}/${n.name}`, { body: { spec: { renewTime: microTime(Date.now()) } } })
              .catch(() => undefined),
          ),
        );
      }
    })();
    // Measured: one node of each "on" group, the lone "off" node.
    const measured = [on.nodes[0]!, off.nodes[0]!, ...(base ? [base.nodes[0]!] : [])];
    const ready = [
      on.nodes[0]!.watchdog.nextPets(2, 120_000),
      off.nodes[0]!.agent.waitMsg(/converge finished/, 120_000),
      ...(base ? [base.nodes[0]!.watchdog.nextPets(2, 120_000)] : []),
    ];
    for (const n of all) n.agent.start(extra.get(n));
    await Promise.all(ready);
    const pids = measured.map((n) => n.agent.proc!.pid!);
    const started = Math.max(...(await Promise.all(pids.map(startedAtMs))));
    const until = (ms: number) => sleep(Math.max(0, started + ms - Date.now()));
    const secs = Number(values["idle-seconds"]);
    const sample = async () => ({
      t: Date.now(),
      rss: await Promise.all(pids.map((p) => rssKb(p))),
      cpu: await Promise.all(pids.map(cpuMs)),
      sched: await Promise.all(pids.map(schedMs)),
    });
    await until(60_000);
    const at60 = await sample();
    await until((secs * 1000) / 2);
    const mid = await sample();
    await until(secs * 1000);
    const end = await sample();
    const minutes = (end.t - at60.t) / 60_000;
    const perMin = (k: "cpu" | "sched", i: number) => ((end[k][i] ?? 0) - (at60[k][i] ?? 0)) / minutes;
    const mb = (kb: number | undefined) => ((kb ?? 0) / 1024).toFixed(1);
    const line = (label: string, i: number) =>
      `${label}: RSS at 60 s ${mb(at60.rss[i])} MB (+${mb((at60.rss[i] ?? 0) - (at60.rss[1] ?? 0))} over off), at ${secs / 2} s ${mb(mid.rss[i])} MB (+${mb((mid.rss[i] ?? 0) - (mid.rss[1] ?? 0))}), at ${secs} s ${mb(end.rss[i])} MB (+${mb((end.rss[i] ?? 0) - (end.rss[1] ?? 0))}); CPU per idle minute ${perMin("cpu", i).toFixed(1)} ms (fencing's share ${(perMin("cpu", i) - perMin("cpu", 1)).toFixed(1)}), schedstat ${perMin("sched", i).toFixed(1)} ms (share ${(perMin("sched", i) - perMin("sched", 1)).toFixed(1)})`;
    say(
      `idle, default timings, kubelets renewing every 10 s, metrics endpoint ${values["with-metrics"] ? "on" : "off"}, ${minutes.toFixed(1)} min from 60 s (fencing on: 3-node group, one measured; goals: share <= 20 ms/min, RSS <= +3 MB); load average ${os
        .loadavg()
        .map((l) => l.toFixed(1))
        .join(" ")}`,
    );
    say(
      `  off (fencing not in the bundle): RSS at 60 s ${mb(at60.rss[1])} MB, at ${secs / 2} s ${mb(mid.rss[1])} MB, at ${secs} s ${mb(end.rss[1])} MB; CPU per idle minute ${perMin("cpu", 1).toFixed(1)} ms, schedstat ${perMin("sched", 1).toFixed(1)} ms`,
    );
    say(`  ${line("this tree, fencing on", 0)}`);
    if (base) say(`  ${line(`baseline ${values.baseline}, fencing on`, 2)}`);
    renewing = false;
    await kubelets;
    for (const n of all) await n.agent.signal("SIGTERM");
  }
} finally {
  for (const c of clusters) await c.stop();
  await cp.stop();
}
console.log(`\n--- fencing benchmark, ${new Date().toISOString()}, ${os.cpus().length} cores\n${report.join("\n")}`);
process.exit(0);
