// npm run bench -- deps [--rounds N]
// What each candidate dependency costs a resident process: RSS of a Node 24 process that
// imported it and idles, against a bare one, side by side. Packages not in the project are
// installed into a temporary prefix for the measurement only.
import { execFileSync, spawn } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { nodeBinary } from "../build.ts";
import { rssKb } from "../lib/proc-stats.ts";

const { values } = parseArgs({ options: { rounds: { type: "string", default: "5" } } });
const rounds = Number(values.rounds);
const CANDIDATES: Record<string, string> = {
  pino: "pino@10.4.0",
  got: "got@16.1.0",
  execa: "execa@10.2.1",
  systeminformation: "systeminformation@5.33.23",
  "node-cron": "node-cron@4.6.0",
  mustache: "mustache@4.2.0",
  yaml: "yaml@2.9.1",
  diff: "diff@9.0.0",
};
const work = await mkdtemp(path.join(os.tmpdir(), "bench-deps-"));
await writeFile(path.join(work, "package.json"), '{"type":"module"}');
execFileSync("npm", ["install", "--no-audit", "--no-fund", "--prefix", work, ...Object.values(CANDIDATES)], {
  stdio: "ignore",
});

const idle = "setInterval(() => {}, 1 << 30)";
const variants: Record<string, string> = {
  "bare node 24": idle,
  "node:https (built-in)": `import "node:https"; ${idle}`,
  ...Object.fromEntries(Object.keys(CANDIDATES).map((m) => [m, `import "${m}"; ${idle}`])),
};
const samples: Record<string, number[]> = Object.fromEntries(Object.keys(variants).map((k) => [k, []]));
for (let r = 0; r < rounds; r++) {
  const procs = Object.entries(variants).map(([name, code]) => ({
    name,
    p: spawn(nodeBinary(), ["--input-type=module", "-e", code], { cwd: work, stdio: "ignore" }),
  }));
  await new Promise((res) => setTimeout(res, 3000));
  for (const { name, p } of procs) {
    samples[name]?.push(await rssKb(p.pid as number));
    p.kill("SIGKILL");
  }
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? 0;
const bare = median(samples["bare node 24"] ?? []);
console.log(
  `idle RSS after import, median of ${rounds} side-by-side rounds (Node ${execFileSync(nodeBinary(), ["--version"]).toString().trim()}):`,
);
for (const [name, xs] of Object.entries(samples)) {
  const m = median(xs);
  console.log(`  ${name.padEnd(24)} ${(m / 1024).toFixed(1).padStart(6)} MB  +${((m - bare) / 1024).toFixed(1)} MB`);
}
await rm(work, { recursive: true, force: true });
