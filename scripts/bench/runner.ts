// npm run bench -- runner [--runs N]
// The converge child's command runner (agent/host/runner.ts, execa with a process group, line
// streaming and redaction) against a bare child_process.spawn doing the least that works:
// wall time per command, side by side, interleaved, and the RSS each costs once imported.
import { spawn } from "node:child_process";
import { parseArgs } from "node:util";
import { run } from "../../host/runner.ts";

const { values } = parseArgs({ options: { runs: { type: "string", default: "200" } } });
const runs = Number(values.runs);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? 0;
const p99 = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length * 0.99)] ?? 0;

function bare(argv: string[]): Promise<number> {
  return new Promise((resolve, reject) => {
    const c = spawn(argv[0] as string, argv.slice(1), { stdio: ["ignore", "pipe", "pipe"] });
    c.stdout.on("data", () => undefined);
    c.stderr.on("data", () => undefined);
    c.once("error", reject);
    c.once("close", (code) => resolve(code ?? 1));
  });
}

const cmd = ["sh", "-c", "echo line one; echo line two >&2"];
const t = { execa: [] as number[], spawn: [] as number[] };
for (let i = 0; i < runs; i++) {
  let t0 = performance.now();
  await run(cmd, { onLine: () => undefined, secrets: ["not-there"] });
  t.execa.push(performance.now() - t0);
  t0 = performance.now();
  await bare(cmd);
  t.spawn.push(performance.now() - t0);
}
const rss = process.memoryUsage().rss;
console.log(`${runs} runs of \`${cmd.join(" ")}\`, interleaved (ms per command):`);
console.log(`  runner (execa)   median ${median(t.execa).toFixed(2)}  p99 ${p99(t.execa).toFixed(2)}`);
console.log(`  bare spawn       median ${median(t.spawn).toFixed(2)}  p99 ${p99(t.spawn).toFixed(2)}`);
console.log(`  ratio            ${(median(t.execa) / median(t.spawn)).toFixed(2)}×`);
console.log(`process RSS after both: ${(rss / 2 ** 20).toFixed(1)} MB (execa's import cost: npm run bench -- deps)`);
