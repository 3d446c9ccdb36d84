// Builds the bundle server's Go template engine (cluster/render/template-engine: Go's
// text/template + sprig at Deckhouse's versions) to WebAssembly, once per source version, into
// the build cache outside the repository (cluster/render/template-engine.ts finds it there in a
// checkout; `npm run build` copies it into dist). Modules come from the Go module proxy.
//
//   node scripts/build-template-engine.ts      prints the .wasm's path (builds it if needed)
//
// tap runs it before the tests (test/fixtures/tap-before.ts), so every suite finds the engine.
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, rename, rm, stat } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { BUILD_CACHE, ENGINE_SOURCES, engineCacheFile, engineSourceHash } from "../cluster/render/template-engine.ts";

const execFileP = promisify(execFile);

/** The Go toolchain: on PATH, or where Go's installer and this project's machines put it. */
export function goBinary(): string | undefined {
  const dirs = [...(process.env.PATH ?? "").split(":").filter(Boolean), "/usr/local/go/bin", "/usr/lib/go/bin"];
  return dirs.map((d) => path.join(d, "go")).find((p) => existsSync(p));
}

/** The built engine's path; builds it when this source version has no build yet. */
export async function buildTemplateEngine(log: (line: string) => void = () => {}): Promise<string> {
  const hash = engineSourceHash();
  if (!hash) throw new Error(`template engine sources not found in ${ENGINE_SOURCES}`);
  const out = engineCacheFile(hash);
  if (existsSync(out)) return out;
  const go = goBinary();
  if (!go) {
    throw new Error(
      "building the template engine needs Go ≥ 1.24 (looked on PATH and in /usr/local/go/bin); install it and run `npm run build` again",
    );
  }
  await mkdir(BUILD_CACHE, { recursive: true });
  const tmp = `${out}.${process.pid}.tmp`;
  const started = Date.now();
  log(`build: compiling the template engine (Go → WebAssembly, once per source version) into ${BUILD_CACHE}`);
  try {
    await execFileP(go, ["build", "-buildmode=c-shared", "-trimpath", "-ldflags=-s -w", "-o", tmp, "."], {
      cwd: ENGINE_SOURCES,
      env: { ...process.env, GOOS: "wasip1", GOARCH: "wasm", CGO_ENABLED: "0" },
      timeout: 15 * 60_000,
      maxBuffer: 16 * 1024 * 1024,
    });
  } catch (err) {
    await rm(tmp, { force: true });
    const e = err as Error & { stderr?: string };
    throw new Error(`building the template engine failed: ${(e.stderr || e.message).trim().slice(-2000)}`);
  }
  // Another build of the same version may have won: either file is the same engine.
  await rename(tmp, out);
  const size = (await stat(out)).size;
  log(`build: template engine ${(size / 1e6).toFixed(1)} MB in ${((Date.now() - started) / 1000).toFixed(1)} s`);
  return out;
}

if (import.meta.main) {
  try {
    const file = await buildTemplateEngine((l) => console.error(l));
    console.log(file);
  } catch (err) {
    console.error((err as Error).message);
    process.exit(1);
  }
}
