// npm run bench -- <name> [args]: runs scripts/bench/<name>.ts, which prints its figures
// and ratios. Benchmarks live here, never in timed tests.
import path from "node:path";
import { fileURLToPath } from "node:url";

/** Every benchmark, loaded only when asked for (named literally: the layout test reads imports). */
const BENCHES: Record<string, () => Promise<unknown>> = {
  build: () => import("./bench/build.ts"),
  converge: () => import("./bench/converge.ts"),
  deps: () => import("./bench/deps.ts"),
  e2e: () => import("./bench/e2e.ts"),
  "early-oom": () => import("./bench/early-oom.ts"),
  fencing: () => import("./bench/fencing.ts"),
  fleet: () => import("./bench/fleet.ts"),
  packages: () => import("./bench/packages.ts"),
  rollout: () => import("./bench/rollout.ts"),
  runner: () => import("./bench/runner.ts"),
  server: () => import("./bench/server.ts"),
  soak: () => import("./bench/soak.ts"),
  steps: () => import("./bench/steps.ts"),
};

const [name, ...rest] = process.argv.slice(2);
const load = name ? BENCHES[name] : undefined;
if (!load) {
  console.error(`usage: npm run bench -- <${Object.keys(BENCHES).join("|")}> [options]`);
  process.exit(name ? 1 : 0);
}
const dir = path.join(path.dirname(fileURLToPath(import.meta.url)), "bench");
process.argv = [process.argv[0] ?? "node", path.join(dir, `${name}.ts`), ...rest];
await load();
