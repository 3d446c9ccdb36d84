// node test/bench/template-engines.ts [--rounds N]   (a test-side script: it reads the test
// fixtures and the reference; not a test, tap does not run it)
//
// The two ways to render NodeGroupConfiguration content, side by side (issue 24):
//   handwritten  the TypeScript renderer this project had until commit d0f0c71
//                (cluster/render/go-template*.ts there, read from git into a temp dir)
//   go-wasm      Go's own text/template + sprig in WebAssembly (cluster/render/template-engine)
// Fidelity: every case of test/fixtures/go-template-cases.ts, every function call and 400
// generated templates, against the model of Deckhouse's engine (test/reference/go-template):
// same output, both refuse, refused where Deckhouse renders, or a different output (the silent
// kind). Speed: 60 scripts (the NGC corpus, repeated) rendered in a fresh process (first pass,
// with the engine's start) and again with a changed context (the cache cannot answer), median of
// the rounds, CPU time and wall time. Memory: RSS of a process that rendered the 60, beside a
// bare one. Build cost: the engine's cold and warm Go build and its size.
import { execFile, execFileSync, spawn } from "node:child_process";
import { mkdtemp, mkdir, rm, stat, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs, promisify } from "node:util";

const run = promisify(execFile);
const SELF = fileURLToPath(import.meta.url);
const REPO = path.resolve(path.dirname(SELF), "../..");
const BASELINE = "d0f0c71";

type Render = (text: string, data: unknown, name: string) => string;

async function handwritten(dir: string): Promise<Render> {
  for (const f of ["go-template.ts", "go-template-funcs.ts"]) {
    const text = execFileSync("git", ["show", `${BASELINE}:cluster/render/${f}`], { cwd: REPO, encoding: "utf8" });
    await writeFile(path.join(dir, f), text);
  }
  // Its one dependency (yaml) resolves from the repository's node_modules.
  await rm(path.join(dir, "node_modules"), { force: true });
  await run("ln", ["-s", path.join(REPO, "node_modules"), path.join(dir, "node_modules")]);
  const mod = (await import(path.join(dir, "go-template.ts"))) as { renderGoTemplate(t: string, d: unknown): string };
  return (text, data) => mod.renderGoTemplate(text, data);
}

async function goWasm(): Promise<Render> {
  const mod = await import("../../cluster/render/go-template.ts");
  return (text, data, name) => mod.renderGoTemplate(text, data, { name });
}

async function engineFor(which: string, tmp: string): Promise<Render> {
  return which === "handwritten" ? handwritten(tmp) : goWasm();
}

/** The 60 scripts and the context they render in (the example cluster's, through render.ts). */
async function workload(): Promise<{ scripts: { name: string; text: string }[]; data: Record<string, unknown> }> {
  const { loadConfigDir } = await import("../../cluster/sources/directory.ts");
  const { DATA } = await import("../fixtures/go-template-cases.ts");
  const corpus = (await loadConfigDir(path.join(REPO, "test/fixtures/ngc-corpus"))).snapshot.inputs.configurations;
  const scripts = Array.from({ length: 60 }, (_, i) => {
    const c = corpus[i % corpus.length]!;
    return { name: `${String(100 + i)}_${c.metadata.name}`, text: c.spec.content };
  });
  return { scripts, data: structuredClone(DATA) as Record<string, unknown> };
}

const cpuMs = (u: NodeJS.CpuUsage) => (u.user + u.system) / 1000;

/** Child: renders the 60 twice (the second time in a changed context) and reports. */
async function child(which: string): Promise<void> {
  const tmp = await mkdtemp(path.join(os.tmpdir(), "bench-template-"));
  try {
    const { scripts, data } = await workload();
    const plain = JSON.parse(
      JSON.stringify(data, (_k, v) => (v && typeof v === "object" && "$keptOut" in v ? "x" : v)),
    );
    const ctx = which === "handwritten" ? plain : data;
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    const render = await engineFor(which, tmp);
    const pass = (d: unknown) => {
      let refused = 0;
      for (const s of scripts) {
        try {
          render(s.text, d, s.name);
        } catch {
          refused++;
        }
      }
      return refused;
    };
    const refused = pass(ctx);
    const first = { wall: performance.now() - t0, cpu: cpuMs(process.cpuUsage(c0)) };
    (ctx as { nodeGroup: { name: string } }).nodeGroup = {
      ...(ctx as { nodeGroup: object }).nodeGroup,
      name: "worker-2",
    };
    const c1 = process.cpuUsage();
    const t1 = performance.now();
    pass(structuredClone(ctx));
    const changed = { wall: performance.now() - t1, cpu: cpuMs(process.cpuUsage(c1)) };
    const c2 = process.cpuUsage();
    const t2 = performance.now();
    pass(ctx);
    const unchanged = { wall: performance.now() - t2, cpu: cpuMs(process.cpuUsage(c2)) };
    globalThis.gc?.();
    process.send?.({ first, changed, unchanged, refused, rss: process.memoryUsage().rss });
  } finally {
    await rm(tmp, { recursive: true, force: true });
  }
}

function measure(which: string): Promise<Record<string, { wall: number; cpu: number } | number>> {
  return new Promise((resolve, reject) => {
    const c = spawn(process.execPath, ["--expose-gc", SELF, "--child", which], {
      stdio: ["ignore", "inherit", "inherit", "ipc"],
    });
    c.once("message", (m) => resolve(m as Record<string, { wall: number; cpu: number } | number>));
    c.once("exit", (code) => code && reject(new Error(`${which} child exited ${code}`)));
  });
}

async function bareRss(): Promise<number> {
  const { stdout } = await run(process.execPath, [
    "--expose-gc",
    "-e",
    "globalThis.gc(); console.log(process.memoryUsage().rss)",
  ]);
  return Number(stdout.trim());
}

type Verdict = "same" | "both refuse" | "refused, Deckhouse renders" | "different output";

async function fidelity(): Promise<Record<string, Record<Verdict, number>>> {
  const { goReference, renderWithGo, withSecrets } = await import("../lib/go-reference.ts");
  const { generateTemplates } = await import("../lib/template-generator.ts");
  const { cases, DATA, FUNCTION_CALLS, SECRET } = await import("../fixtures/go-template-cases.ts");
  const ref = await goReference();
  if ("skip" in ref) throw new Error(ref.skip);
  // Only what has one right answer: not the clock, randomness or map order.
  const unrepeatable =
    /\b(now|ago|rand\w*|uuidv4|shuffle|gen\w+|bcrypt|htpasswd|encryptAES|getHostByName|keys|values)\b/;
  const templates = [...cases.map((c) => c.tpl), ...Object.values(FUNCTION_CALLS), ...generateTemplates(400)].filter(
    (t) => !unrepeatable.test(t),
  );
  const deckhouseData = withSecrets(DATA, SECRET);
  const go = await renderWithGo(
    ref.bin,
    templates.map((template) => ({ template, data: deckhouseData })),
  );
  const tmp = await mkdtemp(path.join(os.tmpdir(), "bench-template-"));
  const out: Record<string, Record<Verdict, number>> = {};
  try {
    for (const which of ["handwritten", "go-wasm"]) {
      const render = await engineFor(which, tmp);
      const data = which === "handwritten" ? deckhouseData : DATA;
      const counts: Record<Verdict, number> = {
        same: 0,
        "both refuse": 0,
        "refused, Deckhouse renders": 0,
        "different output": 0,
      };
      templates.forEach((tpl, i) => {
        let mine: string | undefined;
        try {
          mine = render(tpl, data, "ngc");
        } catch {}
        const g = go[i]!;
        if (mine === undefined) counts[g.err !== undefined ? "both refuse" : "refused, Deckhouse renders"]++;
        else counts[g.out === mine ? "same" : "different output"]++;
      });
      out[which] = counts;
    }
  } finally {
    await rm(tmp, { recursive: true, force: true });
  }
  console.log(`fidelity over ${templates.length} templates (cases, every function, generated):`);
  return out;
}

async function buildCost(): Promise<{ cold: number; warm: number; size: number }> {
  const { ENGINE_SOURCES } = await import("../../cluster/render/template-engine.ts");
  const { goBinary } = await import("../../scripts/build-template-engine.ts");
  const go = goBinary();
  if (!go) throw new Error("no Go toolchain");
  const cache = await mkdtemp(path.join(os.tmpdir(), "bench-gocache-"));
  const out = path.join(cache, "engine.wasm");
  const build = async () => {
    const t0 = performance.now();
    await run(go, ["build", "-buildmode=c-shared", "-trimpath", "-ldflags=-s -w", "-o", out, "."], {
      cwd: ENGINE_SOURCES,
      env: { ...process.env, GOOS: "wasip1", GOARCH: "wasm", CGO_ENABLED: "0", GOCACHE: path.join(cache, "go") },
      maxBuffer: 16 << 20,
    });
    return (performance.now() - t0) / 1000;
  };
  try {
    await mkdir(path.join(cache, "go"));
    const cold = await build();
    await rm(out);
    const warm = await build();
    return { cold, warm, size: (await stat(out)).size };
  } finally {
    await rm(cache, { recursive: true, force: true });
  }
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function main(): Promise<void> {
  const { values } = parseArgs({ options: { rounds: { type: "string", default: "5" }, child: { type: "string" } } });
  if (values.child) return child(values.child);
  const rounds = Number(values.rounds);
  console.table(await fidelity());
  const rows: Record<string, Record<string, string>> = {};
  const bare = median(await Promise.all([bareRss(), bareRss(), bareRss()]));
  for (const which of ["handwritten", "go-wasm"]) {
    const samples: Record<string, { wall: number; cpu: number } | number>[] = [];
    for (let r = 0; r < rounds; r++) samples.push(await measure(which));
    const ms = (k: string, f: "wall" | "cpu") =>
      median(samples.map((s) => (s[k] as { wall: number; cpu: number })[f])).toFixed(1);
    rows[which] = {
      "first 60 (wall / cpu ms)": `${ms("first", "wall")} / ${ms("first", "cpu")}`,
      "60, changed context": `${ms("changed", "wall")} / ${ms("changed", "cpu")}`,
      "60, unchanged": `${ms("unchanged", "wall")} / ${ms("unchanged", "cpu")}`,
      "RSS (MB)": (median(samples.map((s) => s.rss as number)) / 1e6).toFixed(1),
      "RSS over bare node (MB)": ((median(samples.map((s) => s.rss as number)) - bare) / 1e6).toFixed(1),
      refused: String(samples[0]!.refused),
    };
  }
  console.log(`60 scripts, median of ${rounds} fresh processes; bare node RSS ${(bare / 1e6).toFixed(1)} MB:`);
  console.table(rows);
  const b = await buildCost();
  console.log(
    `go-wasm build: cold ${b.cold.toFixed(1)} s (empty GOCACHE, modules already downloaded), warm ${b.warm.toFixed(1)} s, ${(b.size / 1e6).toFixed(1)} MB`,
  );
}

await main();
