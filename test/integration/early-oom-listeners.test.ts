// The resident agent against a local user who holds its metrics port first, and against a node
// group that would take away the operator's dry run. In a network namespace of its own (so the
// default port 127.0.0.1:9650 is this test's), a process running as nobody listens there and
// answers every request with a status of its own: escape codes, and settings that would make
// early OOM act at 99%. The agent (`bashible run --early-oom dry-run`, local mode, a bundle whose
// group says dryRun: false) must
// - keep converging, say who holds the port and keep retrying, shown in `bashible status`;
// - serve its state on the root-only unix socket, which `bashible early-oom status` reads: the
//   squatter's bytes and settings never reach root's terminal;
// - stay in dry run under pressure: decide, log, kill nothing;
// - take the port once the squatter lets go.
// The node's /proc and /sys/fs/cgroup are a tree in the kernel's formats; the pods' tasks are
// real processes. Root only (namespaces, a process as another user).
import t from "tap";
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { readlinkSync } from "node:fs";
import { mkdir, readFile, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { MAIN } from "../../scripts/lib/cli.ts";
import { makeBundle, script, writeBundle } from "../../scripts/lib/bundle.ts";
import { FakeNode } from "../../scripts/lib/early-oom.ts";
import { until } from "../../scripts/lib/until.ts";
import { requireRoot } from "../fixtures/root.ts";

await requireRoot("a network namespace, and a squatter running as nobody");

// The namespace: held by a sleeping process, entered by every command below with nsenter.
const holder = spawn("unshare", ["--net", "sleep", "infinity"], { stdio: "ignore" });
t.teardown(() => void holder.kill("SIGKILL"));
const nsPath = `/proc/${holder.pid}/ns/net`;
await until("the network namespace", () => readlinkSync(nsPath) !== readlinkSync("/proc/self/ns/net"));
execFileSync("nsenter", [`--net=${nsPath}`, "ip", "link", "set", "lo", "up"]);

interface Run {
  status: number;
  stdout: string;
  stderr: string;
}
/** A command inside the namespace, to its end. */
function inNs(argv: string[]): Promise<Run> {
  return new Promise((resolve) => {
    const c = spawn("nsenter", [`--net=${nsPath}`, "--", ...argv]);
    let stdout = "";
    let stderr = "";
    c.stdout.on("data", (d) => (stdout += d));
    c.stderr.on("data", (d) => (stderr += d));
    c.on("close", (code) => resolve({ status: code ?? 1, stdout, stderr }));
  });
}
const cli = (args: string[]) => inNs([process.execPath, MAIN, ...args]);

// The squatter, as nobody, on the agent's default port.
const HOSTILE = {
  enabled: true,
  dryRun: false,
  psi: "available",
  config: { fullStallPercent: 99, excludeNamespaces: ["default"] },
  trigger: {
    phase: "calm",
    reason: "SQUATTER\u001b]0;owned\u0007\u001b[2J",
    aboveForSeconds: 0,
    cooldownRemainingSeconds: 0,
  },
  pods: { source: "watch", synced: true, count: 0 },
  actions: { kill: 0, "dry-run": 0, sysrq: 0, none: 0 },
};
const squatterCode = `require("node:http").createServer((q, s) => s.end(${JSON.stringify(JSON.stringify(HOSTILE))})).listen(9650, "127.0.0.1", () => console.log("listening"))`;
const squatter: ChildProcess = spawn(
  "nsenter",
  [
    `--net=${nsPath}`,
    "--",
    "setpriv",
    "--reuid",
    "65534",
    "--regid",
    "65534",
    "--clear-groups",
    process.execPath,
    "-e",
    squatterCode,
  ],
  { stdio: ["ignore", "pipe", "inherit"] },
);
t.teardown(() => void squatter.kill("SIGKILL"));
await new Promise<void>((resolve) => squatter.stdout?.once("data", () => resolve()));

// The node: its /proc and cgroup tree, made a sandbox root the agent converges.
const node = new FakeNode({ version: 2, driver: "systemd" });
t.teardown(() => node.cleanup());
const web = node.addPod({ name: "web", qos: "BestEffort", workingSetMi: 1200 });
node.addPod({ name: "db", qos: "Guaranteed", workingSetMi: 500, limitMi: 500 });
await mkdir(path.join(node.root, "etc"), { recursive: true });
await writeFile(path.join(node.root, "etc/os-release"), "ID=debian\nVERSION_ID=12\n");
await writeFile(path.join(node.root, "etc/hostname"), "node-1\n");
const group = makeBundle([]).context.nodeGroup;
const bundle = await writeBundle(
  node.root,
  makeBundle([script("050_x", "true")], { context: { nodeGroup: { ...group, earlyOom: { dryRun: false } } } }),
  `../${path.basename(node.root)}.bundle.json`,
);
t.teardown(() => rm(bundle, { force: true }));

const daemon = spawn(
  "nsenter",
  [
    `--net=${nsPath}`,
    "--",
    process.execPath,
    MAIN,
    "run",
    "--root",
    node.root,
    "--bundle",
    bundle,
    "--tick",
    "3600",
    "--early-oom",
    "dry-run",
  ],
  { stdio: ["ignore", "pipe", "pipe"] },
);
let daemonOut = "";
daemon.stdout?.on("data", (d) => (daemonOut += d));
daemon.stderr?.on("data", (d) => (daemonOut += d));
const daemonExit = new Promise<number | null>((r) => daemon.once("exit", (code) => r(code)));
t.teardown(() => {
  if (daemon.exitCode === null) daemon.kill("SIGKILL");
});
const logLines = () =>
  daemonOut
    .split("\n")
    .filter((l) => l.startsWith("{"))
    .map((l) => JSON.parse(l) as Record<string, unknown>);

t.test(
  "a local user holds the metrics port: the agent names it, goes on, and says so in bashible status",
  async (t) => {
    const error = await until("the agent's error about the port", () =>
      logLines().find((l) => typeof l.msg === "string" && l.msg.startsWith("metrics endpoint not listening")),
    );
    t.match(
      error.msg,
      new RegExp(
        `^metrics endpoint not listening: 127\\.0\\.0\\.1:9650 is taken by pid ${squatter.pid} \\(node, uid 65534\\)`,
      ),
    );
    t.match(error.msg, /--metrics-address HOST:PORT/);
    t.equal(error.holderUid, 65534);

    // Converge goes on: the bundle is applied.
    await until("the bundle applied", async () => {
      const s = JSON.parse(await readFile(path.join(node.root, "var/lib/bashible/status.json"), "utf8"));
      return s.lastRun?.outcome === "applied" ? s : undefined;
    });
    const st = await cli(["status", "--root", node.root]);
    t.equal(st.status, 0, st.stderr);
    t.match(st.stdout, /last run: {9}applied/);
    t.match(
      st.stdout,
      new RegExp(
        `metrics: {10}NOT listening on 127\\.0\\.0\\.1:9650 since \\S+: held by pid ${squatter.pid} \\(node, uid 65534\\); retry \\d+ at \\S+; change it with --metrics-address; /run/bashible/metrics\\.sock serves`,
      ),
    );
  },
);

t.test("the node's dry run wins over the group's dryRun: false", async (t) => {
  const line = await until("the agent's word on it", () =>
    logLines().find((l) => typeof l.msg === "string" && l.msg.startsWith("the node's own early OOM setting wins")),
  );
  t.match(line.msg, /dryRun: the node runs early OOM in dry-run mode/);
});

t.test("bashible early-oom status reads the agent's socket, never what answers on the port", async (t) => {
  const r = await cli(["early-oom", "status", "--root", node.root]);
  t.equal(r.status, 0, r.stderr);
  t.notOk(r.stdout.includes("\u001b"), "no escape byte reaches the terminal");
  t.notMatch(r.stdout, /SQUATTER/, "nothing of the squatter's");
  t.match(r.stdout, /acts at ≥ 30% held 3 s/, "the agent's settings, not the squatter's 99%");
  t.match(r.stdout, /^trigger \(running agent, dry run\): calm: /m);
  t.match(r.stdout, /1\s+default\/web|pod \S+ \(no Pod object\)/, "web ranked (no pod list here: by its cgroup)");
  const j = JSON.parse((await cli(["early-oom", "status", "--root", node.root, "-o", "json"])).stdout);
  t.equal(j.agent.dryRun, true);
  t.equal(j.config.fullStallPercent, 30);
});

t.test("under pressure, dry run decides and kills nothing", async (t) => {
  const stop = node.driveRealTime({ full: 0.6, some: 0.85, memAvailableMi: 200, scan: 20_000, refault: 5000 });
  t.teardown(stop);
  const decided = await until(
    "a dry-run decision",
    () =>
      logLines().find((l) => l.msg === "dry run: early OOM would kill this pod" || l.msg === "early OOM killed a pod"),
    30_000,
  );
  t.equal(decided.msg, "dry run: early OOM would kill this pod");
  t.equal(node.alive(web), web.processes.length, "web keeps every task");
});

t.test("once the squatter lets go, the agent takes the port", async (t) => {
  squatter.kill("SIGKILL");
  await until(
    "bashible status to show the endpoint listening",
    async () =>
      /metrics: {10}http:\/\/127\.0\.0\.1:9650\/metrics/.test((await cli(["status", "--root", node.root])).stdout),
    60_000,
  );
  const scrape = await inNs([
    process.execPath,
    "-e",
    `fetch("http://127.0.0.1:9650/metrics").then(r => r.text()).then(t => process.stdout.write(t))`,
  ]);
  t.match(scrape.stdout, /bashible_early_oom_dry_run 1/);
  t.match(scrape.stdout, /bashible_early_oom_decisions_total\{action="dry-run"\} 1/);
});

t.test("the agent stops on SIGTERM and removes its socket", async (t) => {
  daemon.kill("SIGTERM");
  t.equal(await daemonExit, 0, daemonOut.slice(-2000));
  await t.rejects(readFile(path.join(node.root, "run/bashible/metrics.sock")), { code: "ENOENT" });
});
