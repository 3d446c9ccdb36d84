// Go's own text/template + sprig, as Deckhouse's bashible-apiserver renders
// NodeGroupConfiguration content, for differential tests of cluster/render/go-template.ts.
// The program is test/reference/go-template; it is built once with the machine's Go (modules
// from the Go module proxy) and cached outside the repository, keyed by its sources.
import { execFile, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { access, mkdir, readFile, rename } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const execFileP = promisify(execFile);
const SRC = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../reference/go-template");
const CACHE = process.env.BASHIBLE_TEST_CACHE ?? "/var/cache/bashible-test";

export interface GoResult {
  out?: string;
  err?: string;
}

async function goBinary(): Promise<string | undefined> {
  for (const p of ["/usr/local/go/bin/go", "/usr/bin/go"]) {
    try {
      await access(p);
      return p;
    } catch {}
  }
  return undefined;
}

/** Path of the built reference renderer, or a reason it cannot exist here. */
export async function goReference(): Promise<{ bin: string } | { skip: string }> {
  const go = await goBinary();
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
      env: { ...process.env, CGO_ENABLED: "0", GOFLAGS: "-mod=mod" },
      timeout: 10 * 60_000,
    });
  } catch (err) {
    return { skip: `cannot build the Go reference renderer: ${(err as Error).message.slice(0, 300)}` };
  }
  await rename(tmp, bin);
  return { bin };
}

/** Renders every case with Go; data goes through JSON as Deckhouse's context does. */
export async function renderWithGo(bin: string, cases: { template: string; data: unknown }[]): Promise<GoResult[]> {
  const child = spawn(bin, [], { stdio: ["pipe", "pipe", "inherit"] });
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
