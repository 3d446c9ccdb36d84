// bashible early-oom status: what early OOM sees now and what it would do, before it happens.
import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { EXIT, UsageError, type Command } from "../../lib/cli.ts";
import { PATHS } from "../../bundles/paths.ts";
import { sleep } from "../../lib/sleep.ts";
import { type EarlyOomConfig, EarlyOomConfigError, resolveEarlyOomConfig } from "../early-oom/config.ts";
import { PsiUnavailableError, Sampler, type WindowFigures } from "../early-oom/sampler.ts";
import { secondSignal } from "../early-oom/trigger.ts";
import { type Pod, podsFromJson, StaticPods, type PodFacts } from "../early-oom/pods.ts";
import { rankNode } from "../early-oom/early-oom.ts";
import { podLabel } from "../early-oom/rank.ts";
import { bytes, pct } from "../early-oom/format.ts";
import { askAgent } from "../early-oom/status-client.ts";
import { METRICS_SOCKET, printable, printableJson } from "../metrics-server.ts";

interface PodsResult {
  source: string;
  pods: Map<string, PodFacts>;
  problem?: string;
}

async function loadPods(values: Record<string, unknown>, root: string): Promise<PodsResult> {
  const file = values.pods as string | undefined;
  if (file) {
    let text: string;
    try {
      text = await readFile(file, "utf8");
    } catch (err) {
      throw new UsageError(`--pods ${file}: ${(err as Error).message}`);
    }
    let pods: Pod[];
    try {
      pods = podsFromJson(text, file);
    } catch (err) {
      throw new UsageError((err as Error).message);
    }
    return { source: file, pods: new StaticPods(pods).byUid() };
  }
  const kubeconfig = (values.kubeconfig as string | undefined) ?? PATHS.kubeletKubeconfig;
  if (!values.kubeconfig && !existsSync(path.join(root, kubeconfig)))
    return {
      source: "none",
      pods: new Map(),
      problem: `no pod objects: ${path.join(root, kubeconfig)} does not exist (pass --kubeconfig or --pods FILE); ranked from the cgroup tree alone`,
    };
  const node = (values["node-name"] as string | undefined) ?? process.env.NODE_NAME ?? os.hostname();
  try {
    const { loadKubeconfig } = await import("../../lib/kube/kubeconfig.ts");
    const { KubeClient } = await import("../../lib/kube/client.ts");
    const { list } = await import("../../lib/kube/api.ts");
    const client = new KubeClient(await loadKubeconfig(kubeconfig, { root: values.kubeconfig ? "/" : root }), {
      timeoutMs: 5000,
    });
    try {
      const l = await list<Pod>(client, "/api/v1/pods", { fieldSelector: `spec.nodeName=${node}` });
      return { source: `API ${client.connection.server}, node ${node}`, pods: new StaticPods(l.items).byUid() };
    } finally {
      client.close();
    }
  } catch (err) {
    return {
      source: "none",
      pods: new Map(),
      problem: `no pod objects: listing node ${node}'s pods failed: ${(err as Error).message}; ranked from the cgroup tree alone`,
    };
  }
}

async function measure(procRoot: string, windowMs: number): Promise<{ figures?: WindowFigures; problem?: string }> {
  const s = new Sampler(procRoot, windowMs * 2);
  try {
    const t0 = performance.now();
    s.push(s.read(t0));
    await sleep(windowMs);
    s.push(s.read(performance.now()));
    return { figures: s.window(windowMs) };
  } catch (err) {
    if (err instanceof PsiUnavailableError)
      return { problem: `memory pressure (PSI) is not available: ${err.message}; early OOM idles on this node` };
    return { problem: (err as Error).message };
  }
}

function pressureLines(f: WindowFigures, cfg: EarlyOomConfig): string[] {
  const l = [
    `  full stall    ${pct(f.full).padStart(6)}   (acts at ≥ ${cfg.fullStallPercent}% held ${cfg.durationMs / 1000} s; kernel avg10 ${pct(f.fullAvg10)})`,
    `  some stall    ${pct(f.some).padStart(6)}`,
  ];
  if (f.memAvailable !== undefined && f.memTotal)
    l.push(
      `  MemAvailable  ${bytes(f.memAvailable)} of ${bytes(f.memTotal)} (${pct(f.memAvailable / f.memTotal)}; second signal at ≤ ${cfg.memAvailablePercent}%)`,
    );
  if (f.reclaimPerSecond !== undefined)
    l.push(
      `  reclaim       ${Math.round(f.reclaimPerSecond)} pages/s scanned + refaulted (${Math.round(f.refaultPerSecond ?? 0)} refaults/s; second signal at ≥ ${cfg.reclaimPagesPerSecond})`,
    );
  return l;
}

function table(rows: string[][]): string[] {
  const widths = rows[0]?.map((_, i) => Math.max(...rows.map((r) => (r[i] ?? "").length))) ?? [];
  return rows.map((r) => `  ${r.map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i] ?? 0))).join("  ")}`);
}

const earlyOom: Command = {
  summary: "early OOM: current memory pressure, trigger state and the pods in the order it would kill them",
  usage: "status [--root DIR] [-o json] [--proc-root DIR] [--cgroup-root DIR] [--pods FILE] [options]",
  help: `Shows what early OOM sees now and what it would do: memory pressure over a short window
(from /proc/pressure/memory's cumulative counters, /proc/meminfo and /proc/vmstat), the trigger
state against the thresholds, and this node's pods ranked as early OOM would kill them (the
kubelet's memory-pressure order), with the reason for each rank.

On a node, the trigger state and settings come from the running agent, over its unix socket
${METRICS_SOCKET} (root's alone; never the TCP metrics port, which any local user could bind
first); the ranking is computed here from the cgroup tree and this node's Pod objects. Off the
node, point it at copies of the files and a pod list; the ranking is the same. Text from
outside (pod names, reasons) is printed with control characters escaped.

Options:
  -o, --output FMT        text (default) or json
      --proc-root DIR     the /proc to read (default: /proc under --root)
      --cgroup-root DIR   the /sys/fs/cgroup to read (default: under --root)
      --pods FILE         Pod objects, as 'kubectl get pods -o json' writes them (default: this
                          node's pods from the API with the kubelet's credentials)
      --kubeconfig FILE   credentials for the pod list (default /etc/kubernetes/kubelet.conf)
      --node-name NAME    this node's name, for the pod list (default: $NODE_NAME, the hostname)
      --config FILE       early OOM settings as JSON (default: the running agent's, else the defaults)
      --window SECONDS    how long to measure pressure (default 1)
      --agent SOCKET|off  the running agent's socket (default ${METRICS_SOCKET} under --root);
                          off when --proc-root, --cgroup-root or --pods is given

Exit: 0 shown, 1 error.`,
  options: {
    output: { type: "string", short: "o" },
    "proc-root": { type: "string" },
    "cgroup-root": { type: "string" },
    pods: { type: "string" },
    kubeconfig: { type: "string" },
    "node-name": { type: "string" },
    config: { type: "string" },
    window: { type: "string" },
    agent: { type: "string" },
  },
  takesRoot: true,
  logTo: "stderr",
  async run({ values, positionals, root, stdout }) {
    const [sub, ...extra] = positionals;
    if (sub !== "status" || extra.length)
      throw new UsageError(`expected 'bashible early-oom status', got '${positionals.join(" ")}'`);
    const output = (values.output as string | undefined) ?? "text";
    if (output !== "text" && output !== "json") throw new UsageError(`-o must be text or json, not '${output}'`);
    const windowS = values.window === undefined ? 1 : Number(values.window);
    if (!Number.isFinite(windowS) || windowS < 0.1 || windowS > 60)
      throw new UsageError("--window must be a number of seconds from 0.1 to 60");
    const offNode =
      values["proc-root"] !== undefined || values["cgroup-root"] !== undefined || values.pods !== undefined;
    const procRoot = path.resolve((values["proc-root"] as string | undefined) ?? path.join(root, "proc"));
    const cgroupRoot = path.resolve((values["cgroup-root"] as string | undefined) ?? path.join(root, "sys/fs/cgroup"));
    const agentSocket = (values.agent as string | undefined) ?? (offNode ? "off" : path.join(root, METRICS_SOCKET));

    const askedP =
      agentSocket === "off" ? Promise.resolve({ agent: undefined, problem: "not asked" }) : askAgent(agentSocket);
    const agentP = askedP.then((a) => a.agent);
    let cfg: EarlyOomConfig;
    if (values.config) {
      try {
        cfg = resolveEarlyOomConfig(JSON.parse(await readFile(values.config as string, "utf8")));
      } catch (err) {
        const why = err instanceof EarlyOomConfigError ? err.message : (err as Error).message;
        throw new UsageError(`--config ${values.config}: ${why}`);
      }
    } else cfg = (await agentP)?.config ?? resolveEarlyOomConfig({});
    const [{ agent, problem: agentProblem }, measured, pods] = await Promise.all([
      askedP,
      measure(procRoot, windowS * 1000),
      loadPods(values, root),
    ]);
    const ranking = rankNode(cgroupRoot, pods.pods, cfg);
    const f = measured.figures;
    const here = f
      ? {
          fullAboveThreshold: f.full * 100 >= cfg.fullStallPercent,
          secondSignal: secondSignal(cfg, f, f.reclaimPerSecond),
        }
      : undefined;
    const matched = ranking.ranked.filter((r) => r.pod).length + ranking.excluded.filter((e) => e.pod).length;

    if (output === "json") {
      stdout(
        `${printableJson(
          JSON.stringify(
            {
              procRoot,
              cgroupRoot,
              config: cfg,
              pressure: f ?? null,
              pressureProblem: measured.problem,
              trigger: agent
                ? { source: "agent", ...agent.trigger }
                : here && { source: "this window", ...here, secondSignal: here.secondSignal },
              agent: agent ?? null,
              agentProblem,
              cgroup: ranking.layout ?? null,
              pods: { source: pods.source, problem: pods.problem, objects: new Set(pods.pods.values()).size, matched },
              candidates: ranking.ranked.map((r) => ({
                rank: r.rank,
                pod: podLabel(r),
                uid: r.cgroup.uid,
                qos: r.qos,
                tier: r.tier,
                workingSetBytes: r.usage,
                usageBytes: r.cgroup.usage,
                requestBytes: r.pod ? r.request : null,
                priority: r.pod ? r.priority : null,
                exceedsRequest: r.exceeds,
                cgroup: r.cgroup.memoryDir,
                reason: r.reason,
                why: r.why,
                note: r.note ?? null,
              })),
              excluded: ranking.excluded.map((e) => ({ pod: podLabel(e), uid: e.cgroup.uid, reason: e.reason })),
            },
            null,
            2,
          ),
        )}\n`,
      );
      return EXIT.ok;
    }

    const l: string[] = [];
    l.push(`memory pressure (${path.join(procRoot, "pressure/memory")}, last ${windowS} s):`);
    if (f) l.push(...pressureLines(f, cfg));
    else l.push(`  ${measured.problem}`);
    l.push("");
    if (!cfg.enabled) l.push("early OOM: disabled");
    if (agent) {
      l.push(
        `trigger (running agent${agent.dryRun ? ", dry run" : ""}): ${agent.trigger.phase}: ${agent.trigger.reason}`,
      );
      if (agent.lastAction)
        l.push(
          `last action: ${agent.lastAction.action}${agent.lastAction.pod ? ` ${agent.lastAction.pod}` : ""} at ${agent.lastAction.at}: ${agent.lastAction.result ?? ""}`,
        );
    } else if (here) {
      l.push(
        `trigger (this window; no running agent answered: ${agentProblem}):`,
        `  full stall ${here.fullAboveThreshold ? "at or above" : "below"} ${cfg.fullStallPercent}%; second signal: ${here.secondSignal.ok ? "yes" : "no"} (${here.secondSignal.why})`,
      );
    }
    l.push("");
    if (!ranking.layout) l.push(`no cgroup hierarchy with a memory controller under ${cgroupRoot}`);
    else
      l.push(
        `cgroup v${ranking.layout.version} (${ranking.layout.memoryRoot}); pods found: ${ranking.ranked.length + ranking.excluded.length}, matched to Pod objects: ${matched} (from ${pods.source})`,
      );
    if (pods.problem) l.push(pods.problem);
    if (ranking.ranked.length) {
      l.push("", "candidates, in the order early OOM would kill them:");
      l.push(
        ...table([
          ["#", "POD", "QOS", "WORKING SET", "REQUEST", "PRIORITY", "WHY THIS RANK"],
          ...ranking.ranked.map((r) => [
            String(r.rank),
            podLabel(r),
            r.qos,
            bytes(r.usage),
            r.pod ? bytes(r.request) : "?",
            r.pod ? String(r.priority) : "?",
            [r.exceeds ? "exceeds request" : "within request", r.note, r.why].filter(Boolean).join("; "),
          ]),
        ]),
      );
    } else if (ranking.layout) {
      l.push(
        "",
        `no pod can be chosen: ${cfg.fallback === "sysrq" ? "early OOM would ask the kernel's OOM killer (sysrq f)" : "early OOM would do nothing (fallback off)"}`,
      );
    }
    if (ranking.excluded.length) {
      l.push("", "never killed:");
      l.push(...table(ranking.excluded.map((e) => [podLabel(e), e.reason])));
    }
    stdout(`${l.map(printable).join("\n")}\n`);
    return EXIT.ok;
  },
};
export default earlyOom;
