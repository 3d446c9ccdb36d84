// npm run bench -- build [--seconds N] [--rounds N]
// Size and idle RSS of dist/bashible (launcher + stripped Node 24 + bundle) against a single
// executable (Node SEA) of the same agent and a bare Node 24 process, measured side by side:
// each round starts all three, waits, reads VmRSS. Medians over rounds.
import { build } from "esbuild";
import { execFileSync, spawn, spawnSync } from "node:child_process";
import { copyFile, mkdtemp, rm, stat, writeFile, readdir } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { buildDist, nodeBinary } from "../build.ts";
import { makeBundle, sandbox, script, writeBundle } from "../lib/bundle.ts";
import { rssKb } from "../lib/proc-stats.ts";

const { values } = parseArgs({
  options: { seconds: { type: "string", default: "20" }, rounds: { type: "string", default: "5" } },
});
const seconds = Number(values.seconds);
const rounds = Number(values.rounds);
const work = await mkdtemp(path.join(os.tmpdir(), "bench-build-"));
const REPO = path.resolve(import.meta.dirname, "../..");

async function dirSize(dir: string): Promise<number> {
  let total = 0;
  for (const e of await readdir(dir, { withFileTypes: true, recursive: true })) {
    if (e.isFile()) total += (await stat(path.join(e.parentPath, e.name))).size;
  }
  return total;
}

// 1. The shipped layout.
const dist = path.join(work, "dist");
await buildDist(dist);

// 2. A single executable of the same agent: CommonJS bundle (SEA needs one CJS script)
//    injected into a copy of the same stripped runtime.
const sea = path.join(work, "sea");
await build({
  entryPoints: [path.join(REPO, "agent/main.ts")],
  outfile: `${sea}.cjs`,
  bundle: true,
  format: "cjs",
  platform: "node",
  target: "node24",
  minify: true,
  keepNames: true,
  logLevel: "error",
});
await writeFile(
  `${sea}.json`,
  JSON.stringify({ main: `${sea}.cjs`, output: `${sea}.blob`, disableExperimentalSEAWarning: true }),
);
execFileSync(nodeBinary(), ["--experimental-sea-config", `${sea}.json`], { stdio: "ignore" });
await copyFile(nodeBinary(), sea);
execFileSync("strip", [sea]);
execFileSync(
  path.join(REPO, "node_modules/.bin/postject"),
  [sea, "NODE_SEA_BLOB", `${sea}.blob`, "--sentinel-fuse", "NODE_SEA_FUSE_fce680ab2cc467b6e072b8b5df1996b2"],
  { stdio: "ignore" },
);

// An already converged sandbox, so the idle daemon has nothing to start.
const root = await sandbox();
const bundleFile = await writeBundle(work, makeBundle([script("050_x", "true")]));
const once = spawnSync(path.join(dist, "bashible"), ["once", "--root", root, "--bundle", bundleFile], {
  encoding: "utf8",
});
if (once.status !== 0) throw new Error(`converge before measuring failed: ${once.stdout}${once.stderr}`);

const runArgs = ["run", "--root", root, "--bundle", bundleFile, "--tick", "3600"];
const variants: Record<string, string[]> = {
  "bare node 24": [nodeBinary(), "-e", "setInterval(() => {}, 1 << 30)"],
  "dist/bashible run": [path.join(dist, "bashible"), ...runArgs],
  "SEA bashible run": [sea, ...runArgs],
};

const samples: Record<string, number[]> = Object.fromEntries(Object.keys(variants).map((k) => [k, []]));
for (let r = 0; r < rounds; r++) {
  const procs = Object.entries(variants).map(([name, [cmd, ...args]]) => ({
    name,
    p: spawn(cmd as string, args, { stdio: "ignore" }),
  }));
  await new Promise((res) => setTimeout(res, seconds * 1000));
  for (const { name, p } of procs) {
    samples[name]?.push(await rssKb(p.pid as number));
    p.kill("SIGKILL");
  }
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? 0;
const mb = (kb: number) => (kb / 1024).toFixed(1);
const bare = median(samples["bare node 24"] ?? []);
console.log(`idle RSS after ${seconds} s, median of ${rounds} side-by-side rounds:`);
for (const [name, xs] of Object.entries(samples)) {
  console.log(
    `  ${name.padEnd(20)} ${mb(median(xs)).padStart(6)} MB  (${(median(xs) / bare).toFixed(2)}x bare; samples ${xs.map(mb).join(", ")})`,
  );
}
console.log("size:");
console.log(
  `  dist/ (launcher + runtime + bundle)  ${((await dirSize(dist)) / 1e6).toFixed(1)} MB (bundle ${((await dirSize(path.join(dist, "bashible.d/app"))) / 1e3).toFixed(0)} kB)`,
);
console.log(`  SEA single executable               ${((await stat(sea)).size / 1e6).toFixed(1)} MB`);
console.log(`  unstripped node binary              ${((await stat(nodeBinary())).size / 1e6).toFixed(1)} MB`);
await rm(work, { recursive: true, force: true });
await rm(root, { recursive: true, force: true });
