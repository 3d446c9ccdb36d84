// Go's own text/template + sprig, as Deckhouse's bashible-apiserver renders NodeGroupConfiguration
// content, compiled to WebAssembly (cluster/render/template-engine/, built by
// scripts/build-template-engine.ts, never committed) and run in this process. Only the bundle
// server loads it (the renderer imports it on the first NodeGroupConfiguration it renders), and
// synchronously, so rendering stays a pure function call.
//
// The module gets a WASI of its own with nothing behind it: no files, no directories, no
// network, no environment; a clock and random bytes (the Go runtime needs both). So a template
// cannot read or reach anything on the server, whatever it calls.
import { createHash, randomFillSync } from "node:crypto";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import v8 from "node:v8";
import { fileURLToPath } from "node:url";
import { asset } from "../../lib/assets.ts";

/** The Go sources, in a checkout (a build ships only the .wasm). */
export const ENGINE_SOURCES = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "template-engine");
/** Where a build puts the engine, relative to the data files (lib/assets.ts). */
export const ENGINE_ASSET = "cluster/render/template-engine.wasm";
/** The build cache outside the repository (the same one `npm run package` uses). */
export const BUILD_CACHE = process.env.BASHIBLE_TEST_CACHE ?? "/var/cache/bashible-test";
export const BUILD_COMMAND = "npm run build";

/** What identifies a build: every Go source and the module files. */
export function engineSourceHash(dir = ENGINE_SOURCES): string | undefined {
  if (!existsSync(path.join(dir, "go.mod"))) return undefined;
  const hash = createHash("sha256").update("wasip1/wasm c-shared -s -w\n");
  for (const f of readdirSync(dir).sort()) {
    if (f === "go.mod" || f === "go.sum" || f.endsWith(".go"))
      hash.update(`${f}\n`).update(readFileSync(path.join(dir, f)));
  }
  return hash.digest("hex").slice(0, 16);
}

export const engineCacheFile = (hash: string) => path.join(BUILD_CACHE, `template-engine-${hash}.wasm`);

/** The engine cannot render at all (not built, or it crashed): no script's fault. */
export class EngineError extends Error {
  override name = "EngineError";
}

export class EngineMissingError extends EngineError {
  override name = "EngineMissingError";
}

/** The engine's file: BASHIBLE_TEMPLATE_ENGINE, the build's copy, or the checkout's cached build. */
export function locateEngine(): string {
  const explicit = process.env.BASHIBLE_TEMPLATE_ENGINE;
  if (explicit) {
    if (!existsSync(explicit)) throw new EngineMissingError(`BASHIBLE_TEMPLATE_ENGINE=${explicit}: no such file`);
    return explicit;
  }
  const shipped = asset(ENGINE_ASSET);
  if (existsSync(shipped)) return shipped;
  const hash = engineSourceHash();
  if (hash && existsSync(engineCacheFile(hash))) return engineCacheFile(hash);
  throw new EngineMissingError(
    `the Go template engine is not built (looked for ${shipped}${hash ? ` and ${engineCacheFile(hash)}` : ""}): ` +
      `run \`${BUILD_COMMAND}\` (it needs Go ≥ 1.24)`,
  );
}

export interface EngineRequest {
  name: string;
  template: string;
  /** The context as JSON (the caller encodes it once for all the scripts that share it). */
  dataJson: string;
  /** Names dataJson: the engine decodes a context once for consecutive requests with its key. */
  dataKey: string;
  /** Bytes the output may have (0: no limit). */
  maxOutput?: number;
}

export interface EngineResult {
  out?: string;
  /** Go's error text. */
  err?: string;
  line?: number;
  /** The action Go names (`<.x.y>`), when it names one. */
  at?: string;
  /** The error without Go's location prefix. */
  reason?: string;
}

// The part of the WebAssembly JS API used here (the project's lib has no DOM types).
interface WasmMemory {
  readonly buffer: ArrayBuffer;
}
interface WasmApi {
  Module: new (bytes: Uint8Array) => object;
  Instance: new (module: object, imports: Record<string, Record<string, unknown>>) => { exports: unknown };
}
const WASM = (globalThis as unknown as { WebAssembly: WasmApi }).WebAssembly;

class WasiExit extends Error {
  readonly code: number;
  constructor(code: number) {
    super(`the template engine exited with code ${code}`);
    this.code = code;
  }
}

const ERRNO = { success: 0, badf: 8, inval: 28, nosys: 52 } as const;

/** The WASI preview 1 calls Go's wasip1 runtime makes, with no file system or network behind them. */
function wasi(memory: () => WasmMemory, stderr: string[]): Record<string, (...a: never[]) => number> {
  const view = () => new DataView(memory().buffer);
  const bytes = (ptr: number, len: number) => new Uint8Array(memory().buffer, ptr, len);
  const zeroPair = (a: number, b: number) => {
    view().setUint32(a, 0, true);
    view().setUint32(b, 0, true);
    return ERRNO.success;
  };
  const sleeper = new Int32Array(new SharedArrayBuffer(4));
  const badf = () => ERRNO.badf;
  return {
    args_sizes_get: zeroPair,
    args_get: () => ERRNO.success,
    environ_sizes_get: zeroPair,
    environ_get: () => ERRNO.success,
    clock_time_get: (id: number, _precision: bigint, out: number) => {
      const ns = id === 0 ? BigInt(Date.now()) * 1_000_000n : process.hrtime.bigint();
      view().setBigUint64(out, ns, true);
      return ERRNO.success;
    },
    random_get: (ptr: number, len: number) => {
      randomFillSync(bytes(ptr, len));
      return ERRNO.success;
    },
    fd_write: (fd: number, iovs: number, count: number, written: number) => {
      if (fd !== 1 && fd !== 2) return ERRNO.badf;
      const v = view();
      let n = 0;
      for (let i = 0; i < count; i++) {
        const ptr = v.getUint32(iovs + i * 8, true);
        const len = v.getUint32(iovs + i * 8 + 4, true);
        stderr.push(Buffer.from(bytes(ptr, len)).toString("utf8"));
        n += len;
      }
      view().setUint32(written, n, true);
      return ERRNO.success;
    },
    fd_fdstat_get: (fd: number, out: number) => {
      if (fd > 2) return ERRNO.badf;
      const v = view();
      v.setUint8(out, 2); // character device
      v.setUint16(out + 2, 0, true);
      v.setBigUint64(out + 8, 0n, true);
      v.setBigUint64(out + 16, 0n, true);
      return ERRNO.success;
    },
    fd_prestat_get: badf, // no preopened directories: the module sees no files at all
    fd_prestat_dir_name: badf,
    fd_close: badf,
    fd_read: badf,
    fd_pread: badf,
    fd_pwrite: badf,
    fd_seek: badf,
    fd_sync: badf,
    fd_readdir: badf,
    fd_filestat_get: badf,
    fd_filestat_set_size: badf,
    fd_fdstat_set_flags: badf,
    path_open: badf,
    path_filestat_get: badf,
    sock_accept: badf,
    sock_shutdown: badf,
    sched_yield: () => ERRNO.success,
    // Only a sleeping goroutine polls; sleep for the earliest clock subscription, then report it.
    poll_oneoff: (inPtr: number, outPtr: number, n: number, nevents: number) => {
      const v = view();
      let timeoutNs: bigint | undefined;
      for (let i = 0; i < n; i++) {
        const sub = inPtr + i * 48;
        if (v.getUint8(sub + 8) === 0) {
          const t = v.getBigUint64(sub + 24, true);
          if (timeoutNs === undefined || t < timeoutNs) timeoutNs = t;
        }
      }
      if (timeoutNs !== undefined && timeoutNs > 0n) Atomics.wait(sleeper, 0, 0, Number(timeoutNs / 1_000_000n));
      for (let i = 0; i < n; i++) {
        const sub = inPtr + i * 48;
        const ev = outPtr + i * 32;
        v.setBigUint64(ev, v.getBigUint64(sub, true), true);
        v.setUint16(ev + 8, 0, true);
        v.setUint8(ev + 10, v.getUint8(sub + 8));
      }
      v.setUint32(nevents, n, true);
      return ERRNO.success;
    },
    proc_exit: (code: number) => {
      throw new WasiExit(code);
    },
  };
}

interface Exports {
  memory: WasmMemory;
  _initialize(): void;
  bb_input(size: number): number;
  bb_render(size: number): number;
  bb_output(): number;
}

let compiled: object | undefined;
let instance: { exports: Exports; stderr: string[]; lastKey?: string } | undefined;

function start(): { exports: Exports; stderr: string[] } {
  if (!compiled) {
    // Go compiles to few, very large WebAssembly functions; V8 re-compiling the hot ones with
    // TurboFan costs more CPU than it ever saves here (docs/benchmarks.md, "Template engine"),
    // so they stay on the baseline compiler. Process-wide, and only wasm uses it.
    v8.setFlagsFromString("--wasm-tiering-budget=2000000000");
    compiled = new WASM.Module(readFileSync(locateEngine()));
  }
  const stderr: string[] = [];
  let exports: Exports | undefined;
  const inst = new WASM.Instance(compiled, {
    wasi_snapshot_preview1: wasi(() => exports!.memory, stderr),
  });
  exports = inst.exports as unknown as Exports;
  exports._initialize();
  return { exports, stderr };
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** Renders one template in the engine. Throws EngineMissingError, or Error when the engine itself failed. */
export function renderInEngine(req: EngineRequest): EngineResult {
  instance ??= start();
  const { exports, stderr } = instance;
  const data = instance.lastKey === req.dataKey ? "" : `,"data":${req.dataJson}`;
  instance.lastKey = req.dataKey;
  const input = encoder.encode(
    `{"name":${JSON.stringify(req.name)},"template":${JSON.stringify(req.template)},"maxOutput":${req.maxOutput ?? 0},"dataKey":${JSON.stringify(req.dataKey)}${data}}`,
  );
  try {
    const ptr = exports.bb_input(input.length);
    new Uint8Array(exports.memory.buffer, ptr, input.length).set(input);
    const len = exports.bb_render(input.length);
    const out = exports.bb_output();
    return JSON.parse(decoder.decode(new Uint8Array(exports.memory.buffer, out, len))) as EngineResult;
  } catch (err) {
    // A crashed Go runtime cannot be called again: the next render starts a new instance.
    instance = undefined;
    const tail = stderr.join("").slice(-2000).trim();
    throw new EngineError(`the template engine failed: ${(err as Error).message}${tail ? `: ${tail}` : ""}`);
  }
}
