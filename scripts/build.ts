// npm run build → dist/bashible: a launcher, the pinned Node 24 runtime (stripped) and the
// bundled agent. Chosen over a single executable by measurement (docs/benchmarks.md): the
// launcher's process idles ~18 MB lower, and every node pays for that.
//
//   dist/bashible                 POSIX sh launcher; no PATH lookups, so it runs with PATH empty
//   dist/bashible.d/node          Node.js runtime, the version in devDependencies
//   dist/bashible.d/app/*.mjs     the agent, one chunk per command (loaded on demand)
//   dist/bashible.d/share/        data files: templates, CRDs, the example cluster, and the bundle
//                                 server's template engine (Go → WebAssembly, built with Go once
//                                 per source version and cached outside the repository)
import { build } from "esbuild";
import { execFileSync } from "node:child_process";
import { chmod, copyFile, cp, mkdir, rm, writeFile, stat } from "node:fs/promises";
import { SHIPPED_ASSETS } from "../lib/assets.ts";
import { ENGINE_ASSET } from "../cluster/render/template-engine.ts";
import { buildTemplateEngine } from "./build-template-engine.ts";
import path from "node:path";
import { fileURLToPath } from "node:url";

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

/**
 * The runtime's flags for every command (the launcher adds the daemon's own for `run`); the
 * server image's entrypoint (scripts/image.ts) runs the runtime with the same ones.
 */
export const RUNTIME_FLAGS = ["--max-semi-space-size=1"] as const;

export const LAUNCHER = `#!/bin/sh
# bashible launcher: runs the bundled agent on the Node.js runtime shipped beside it.
# Uses no external commands, so it works with an empty PATH and on nodes without Node.js.
case "$0" in
  */*) here=\${0%/*} ;;
  *) here=. ;;
esac
if [ ! -x "$here/bashible.d/node" ]; then
  echo "bashible: runtime not found at $here/bashible.d/node; install the whole bashible directory and run the launcher from it (not through a symlink)" >&2
  exit 1
fi
# The resident daemon idles smaller with V8's lite mode (interpreter only, lazy feedback;
# ~3 MB) and without materialising Node's bundled root CA store (it always pins the cluster
# CA; ~2 MB). Converges run in a child with the full compiler and the default store.
case "$1" in
  run) exec "$here/bashible.d/node" --lite-mode --use-openssl-ca ${RUNTIME_FLAGS.join(" ")} "$here/bashible.d/app/main.mjs" "$@" ;;
esac
exec "$here/bashible.d/node" ${RUNTIME_FLAGS.join(" ")} "$here/bashible.d/app/main.mjs" "$@"
`;

/**
 * Bundles the agent into dir (ESM, code-split so each command loads only its own code); `version`
 * stamps what `bashible version` says (default: package.json's).
 */
export async function bundleAgent(outdir: string, version?: string): Promise<void> {
  await build({
    ...(version ? { define: { __BASHIBLE_VERSION__: JSON.stringify(version) } } : {}),
    entryPoints: { main: path.join(REPO, "agent/main.ts") },
    outdir,
    bundle: true,
    splitting: true,
    format: "esm",
    platform: "node",
    target: "node24",
    minify: true,
    keepNames: true,
    sourcemap: false,
    outExtension: { ".js": ".mjs" },
    chunkNames: "chunk-[hash]",
    legalComments: "none",
    logLevel: "warning",
    // CommonJS dependencies call require(); give the ESM bundle a real one.
    banner: {
      js: "import { createRequire as __bbCreateRequire } from 'node:module'; const require = __bbCreateRequire(import.meta.url);",
    },
  });
}

export function nodeBinary(): string {
  return path.join(REPO, "node_modules/node/bin/node");
}

/**
 * Builds the launcher, runtime and bundle into dist (default: <repo>/dist). `version` stamps a
 * release's own version (a second agent release for a test, a patched build) instead of
 * package.json's.
 */
export async function buildDist(dist = path.join(REPO, "dist"), opts: { version?: string } = {}): Promise<void> {
  const SHARE = path.join(dist, "bashible.d");
  await rm(dist, { recursive: true, force: true });
  await mkdir(path.join(SHARE, "app"), { recursive: true });
  await bundleAgent(path.join(SHARE, "app"), opts.version);
  const runtime = path.join(SHARE, "node");
  await copyFile(nodeBinary(), runtime);
  try {
    execFileSync("strip", [runtime]);
  } catch {
    console.warn("build: 'strip' not available; shipping the unstripped runtime");
  }
  await chmod(runtime, 0o755);
  await writeFile(path.join(dist, "bashible"), LAUNCHER, { mode: 0o755 });
  for (const rel of SHIPPED_ASSETS) {
    await cp(path.join(REPO, rel), path.join(SHARE, "share", rel), {
      recursive: true,
      filter: (src) => !src.endsWith(".ts"),
    });
  }
  // Only the bundle server loads it; nodes never do.
  await copyFile(await buildTemplateEngine((l) => console.log(l)), path.join(SHARE, "share", ENGINE_ASSET));
  const size = (await stat(runtime)).size + (await bundleSize(path.join(SHARE, "app")));
  console.log(
    `${path.relative(process.cwd(), dist) || "."}/bashible: ${(size / 1e6).toFixed(1)} MB (runtime + bundle)`,
  );
}

async function bundleSize(dir: string): Promise<number> {
  const { readdir } = await import("node:fs/promises");
  let total = 0;
  for (const f of await readdir(dir)) total += (await stat(path.join(dir, f))).size;
  return total;
}

if (import.meta.main) {
  const flag = (name: string) => {
    const i = process.argv.indexOf(name);
    return i > 0 ? process.argv[i + 1] : undefined;
  };
  const version = flag("--version");
  if (version !== undefined && !/^[0-9A-Za-z][0-9A-Za-z.+_-]{0,127}$/.test(version)) {
    console.error(`build: --version '${version}' is not a version (letters, digits, . + _ -; e.g. 0.1.1)`);
    process.exit(2);
  }
  const out = flag("--out");
  await buildDist(out ? path.resolve(out) : undefined, version ? { version } : {});
}
