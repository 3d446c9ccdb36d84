// npm run bench -- <name> [args]: runs scripts/bench/<name>.ts, which prints its figures
// and ratios. Benchmarks live here, never in timed tests.
import { readdir } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";

const dir = path.join(path.dirname(fileURLToPath(import.meta.url)), "bench");
const names = (await readdir(dir)).filter((f) => f.endsWith(".ts")).map((f) => f.slice(0, -3));
const [name, ...rest] = process.argv.slice(2);
if (!name || !names.includes(name)) {
  console.error(`usage: npm run bench -- <${names.join("|")}> [options]`);
  process.exit(name ? 1 : 0);
}
process.argv = [process.argv[0] ?? "node", path.join(dir, `${name}.ts`), ...rest];
await import(path.join(dir, `${name}.ts`));
