// A model of Deckhouse's own template engine (test/reference/go-template: Go's text/template +
// sprig at the versions Deckhouse pins, Deckhouse's function set, none of this server's guards),
// for differential tests of the bundle server's engine (cluster/render/template-engine). Built
// once with the machine's Go (modules from the Go module proxy) and cached outside the
// repository, keyed by its sources.
import { execFile, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { access, mkdir, readFile, rename } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { goBinary } from "../../scripts/build-template-engine.ts";

const execFileP = promisify(execFile);
const SRC = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../reference/go-template");
const CACHE = process.env.BASHIBLE_TEST_CACHE ?? "/var/cache/bashible-test";
// Deckhouse's server runs in UTC; so does the WebAssembly engine (it reads no zone files).
const ENV = { ...process.env, TZ: "UTC" };

export interface GoResult {
  out?: string;
  err?: string;
}

/** Path of the built reference renderer, or a reason it cannot exist here. */
export async function goReference(): Promise<{ bin: string } | { skip: string }> {
  const go = goBinary();
  if (!go) return { skip: "Go is not installed (needed to build the reference renderer)" };
  const hash = createHash("sha256");
  for (const f of ["main.go", "go.mod", "go.sum"]) hash.update(await readFile(path.join(SRC, f)));
  const bin = path.join(CACHE, `go-template-ref-${hash.digest("hex").slice(0, 12)}`);
  try {
    await access(bin);
    return { bin };
  } catch {}
  await mkdir(CACHE, { recursive: true });
  const tmp = `${bin}.${process.pid}.tmp`;
  try {
    await execFileP(go, ["build", "-trimpath", "-o", tmp, "."], {
      cwd: SRC,
      env: { ...process.env, CGO_ENABLED: "0" },
      timeout: 10 * 60_000,
    });
  } catch (err) {
    return { skip: `cannot build the Go reference renderer: ${(err as Error).message.slice(0, 300)}` };
  }
  await rename(tmp, bin);
  return { bin };
}

/** Renders every case as Deckhouse would; data goes through JSON as Deckhouse's context does. */
export async function renderWithGo(
  bin: string,
  cases: { name?: string; template: string; data: unknown }[],
): Promise<GoResult[]> {
  const child = spawn(bin, [], { stdio: ["pipe", "pipe", "inherit"], env: ENV });
  const chunks: Buffer[] = [];
  child.stdout.on("data", (c: Buffer) => chunks.push(c));
  const done = new Promise<number>((resolve, reject) => {
    child.once("error", reject);
    child.once("close", (code) => resolve(code ?? 1));
  });
  child.stdin.end(JSON.stringify(cases));
  const code = await done;
  if (code !== 0) throw new Error(`reference renderer exited ${code}`);
  return JSON.parse(Buffer.concat(chunks).toString("utf8")) as GoResult[];
}

/** The functions Deckhouse's templates can call. */
export async function goFunctions(bin: string): Promise<string[]> {
  const { stdout } = await execFileP(bin, ["-funcs"], { env: ENV });
  return JSON.parse(stdout) as string[];
}

/** Deckhouse's data for a context of ours: each kept-out value is there, as `secret`. */
export function withSecrets(v: unknown, secret: string): unknown {
  if (Array.isArray(v)) return v.map((e) => withSecrets(e, secret));
  if (v && typeof v === "object") {
    const o = v as Record<string, unknown>;
    if (Object.keys(o).length === 1 && typeof o.$keptOut === "string") return secret;
    return Object.fromEntries(Object.entries(o).map(([k, e]) => [k, withSecrets(e, secret)]));
  }
  return v;
}
