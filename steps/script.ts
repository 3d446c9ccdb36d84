// Custom NodeGroupConfiguration steps: bash scripts, run in weight order, as Deckhouse runs
// them. The script is written to /var/lib/bashible/bundle_steps/<step> and sourced by
// `bash --noprofile --norc -eEo pipefail` after the bash helper library (our own implementation
// of Deckhouse's bashbooster: steps/bashbooster/, docs/deckhouse-compatibility.md), so `return 0` ends it
// and a command reading stdin gets end-of-file instead of the rest of the script. Output streams
// to the step log and the journal line by line.
//
// When a script runs: as in Deckhouse, in every converge the checksum admits. A script is due
// when the node is converging to a configuration it has not applied (configuration_checksum
// absent, removed at a converge's start, or naming another checksum), when it never succeeded,
// its content changed, the node rebooted since, or the 4-hour update epoch moved on; a node in
// sync plans nothing. So a script that patches a file a built-in step rewrote in this converge
// patches it again, in this converge. Scripts must be idempotent, as Deckhouse's are.
import { readFile } from "node:fs/promises";
import { sha256Hex } from "../bundles/checksum.ts";
import { bundlesSelect, deckhouseOsOf } from "../bundles/os-families.ts";
import { asset } from "../lib/assets.ts";
import { PATHS, STATE_DIR } from "../bundles/paths.ts";
import { CommandError, type Host } from "../host/host.ts";
import type { ContainerdSpec, NodeGroupBundle, ScriptSpec } from "../bundles/types.ts";
import type { ScriptChange, Step, StepContext } from "./types.ts";

const RECORDS = PATHS.scripts;
const STEP_FILES = `${STATE_DIR}/bundle_steps`;
/** Where the agent installs Deckhouse-compatible helpers (bashbooster) for scripts to source. */
export const HELPERS = `${STATE_DIR}/bashbooster.sh`;
/** The helpers' workspace ($BB_WORKSPACE): run flags in flag/, each helper shell's tmp_* directory. */
const WORKSPACE = PATHS.flags.slice(0, PATHS.flags.lastIndexOf("/"));

interface RunRecord {
  sha256: string;
  bootId: string;
  epoch: string;
  at: string;
}

function wantedRecord(spec: ScriptSpec, ctx: StepContext): Omit<RunRecord, "at"> {
  return { sha256: sha256Hex(spec.script), bootId: ctx.bootId, epoch: ctx.bundle.context.nodeGroup.updateEpoch };
}

async function lastSuccess(host: Host, name: string, ctx: StepContext): Promise<RunRecord | undefined> {
  const text = await host.readText(`${RECORDS}/${name}.json`);
  if (!text) return undefined;
  try {
    return JSON.parse(text) as RunRecord;
  } catch {
    ctx.log.warn({ step: name }, "the script's run record is not JSON; the script runs again");
    return undefined;
  }
}

/** The cluster registry as Deckhouse's bashible.sh exports it: address, scheme, path, user:password. */
function registryOf(
  bundle: NodeGroupBundle,
): { address: string; scheme: string; path: string; auth: string } | undefined {
  const r = bundle.context.registry;
  if (!r) return undefined;
  // The credentials and the scheme travel with the containerd step (absent when containerd is not managed).
  const containerd = bundle.steps.find((s) => s.kind === "Containerd")?.spec as ContainerdSpec | undefined;
  const entry = containerd?.registries.find((e) => e.host === r.address);
  const auth = entry?.auth ? Buffer.from(entry.auth, "base64").toString("utf8") : "";
  return {
    address: r.address,
    scheme: entry?.scheme ?? "https",
    path: r.path.startsWith("/") ? r.path : `/${r.path}`,
    auth,
  };
}

/** Values a script's output and errors are redacted of: the bundle's, plus the decoded registry login. */
function scriptSecrets(ctx: StepContext): string[] {
  const auth = registryOf(ctx.bundle)?.auth ?? "";
  const password = auth.slice(auth.indexOf(":") + 1);
  return [...ctx.secrets, ...[auth, password].filter((v) => v.length >= 4)];
}

/** Deckhouse's environment for steps (bashible.sh), plus this agent's own variables. */
export function scriptEnv(host: Host, ctx: StepContext): Record<string, string> {
  const systemPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  const proxies = Object.fromEntries(
    Object.entries(process.env).filter(
      (e): e is [string, string] => /^(https?|no)_proxy$/i.test(e[0]) && typeof e[1] === "string",
    ),
  );
  return {
    ...proxies,
    NODE_GROUP: ctx.nodeGroup,
    D8_NODE_HOSTNAME: ctx.nodeName,
    FIRST_BASHIBLE_RUN: ctx.firstRun ? "yes" : "no",
    BOOTSTRAP_DIR: host.path(STATE_DIR),
    TMPDIR: host.path(PATHS.tmpDir),
    HOME: host.path(STATE_DIR),
    LANG: "C",
    LC_ALL: "C",
    LC_NUMERIC: "C",
    PATH: `${host.path(PATHS.binDir)}:${systemPath}`,
    // Deckhouse's bundle name for this OS (ubuntu-lts, debian, centos, …), as bb-is-bundle says.
    BUNDLE: deckhouseOsOf(host.os.id)?.bundle ?? "unknown",
    TERM: "xterm-256color",
    // The configuration this converge applies.
    CONFIGURATION_CHECKSUM: ctx.bundle.checksum,
    ...registryVariables(ctx.bundle),
    PACKAGES_PROXY_ADDRESSES: ctx.bundle.context.packagesProxy.endpoints.join(","),
    PACKAGES_PROXY_TOKEN: ctx.bundle.context.packagesProxy.token,
    ...proxyVariables(ctx),
    NODE_NAME: ctx.nodeName,
    BASHIBLE_ROOT: host.root,
    BASHIBLE_STATE_DIR: host.path(STATE_DIR),
    BASHIBLE_STEP: ctx.stepName,
    BASHIBLE_FIRST_RUN: String(ctx.firstRun),
    BASHIBLE_AGENT: host.path(PATHS.agentWrapper),
    ...(ctx.cluster === "local"
      ? { BASHIBLE_LOCAL_MODE: "1" }
      : ctx.cluster.kubeconfig
        ? { BASHIBLE_KUBECONFIG: ctx.cluster.kubeconfig }
        : {}),
    BASHIBLE_BUNDLE_FILE: host.path(PATHS.runBundle),
    KUBERNETES_VERSION: ctx.bundle.context.kubernetesVersion,
  };
}

/** Deckhouse's REGISTRY_ADDRESS, SCHEME, REGISTRY_PATH, REGISTRY_AUTH (decoded: user:password); REGISTRY_SCHEME too. */
function registryVariables(bundle: NodeGroupBundle): Record<string, string> {
  const r = registryOf(bundle);
  if (!r) return {};
  return {
    REGISTRY_ADDRESS: r.address,
    SCHEME: r.scheme,
    REGISTRY_SCHEME: r.scheme,
    REGISTRY_PATH: r.path,
    REGISTRY_AUTH: r.auth,
  };
}

/** What bb-set-proxy exports: the cluster's proxy from the bundle. */
function proxyVariables(ctx: StepContext): Record<string, string> {
  const p = ctx.bundle.context.proxy;
  if (!p) return {};
  return {
    ...(p.httpProxy ? { BASHIBLE_HTTP_PROXY: p.httpProxy } : {}),
    ...(p.httpsProxy ? { BASHIBLE_HTTPS_PROXY: p.httpsProxy } : {}),
    ...(p.noProxy?.length ? { BASHIBLE_NO_PROXY: p.noProxy.join(",") } : {}),
  };
}

/**
 * A helper shell removes its tmp_* directory in its EXIT trap, which a SIGKILL (of the script,
 * or of the agent's process group) never runs. Before a script starts, under the converge lock,
 * no other helper shell of this agent is alive, so every tmp_* left is such a leftover.
 */
async function sweepWorkspace(host: Host, ctx: StepContext): Promise<void> {
  const left = (await host.listDir(WORKSPACE)).filter((n) => n.startsWith("tmp_"));
  for (const name of left) await host.remove(`${WORKSPACE}/${name}`, { recursive: true });
  if (left.length) ctx.log.info({ removed: left }, "removed what killed helper shells left in the workspace");
}

let library: string | undefined;
/** The helper library shipped with the agent (steps/bashbooster/bashbooster.sh). */
async function helperLibrary(): Promise<string> {
  library ??= await readFile(asset("steps/bashbooster/bashbooster.sh"), "utf8");
  return library;
}

const script: Step<"Script", ScriptChange> = {
  kind: "Script",

  async plan(spec, host, ctx) {
    const name = ctx.stepName;
    // Deckhouse's bundle names (ubuntu-lts, debian, centos, …); a script for another OS is not run.
    if (!bundlesSelect(spec.bundles, host.os.id)) return { changes: [], problems: [] };
    const want = wantedRecord(spec, ctx);
    const last = await lastSuccess(host, name, ctx);
    const applied = (await host.readText(PATHS.configurationChecksum))?.trim() || undefined;
    let why: string;
    if (!last) why = "never ran successfully";
    else if (ctx.forced) why = "full run forced (configuration_checksum absent)";
    else if (applied !== ctx.bundle.checksum) {
      // Deckhouse runs every step whenever it converges: what a built-in step rewrote in this
      // converge, the script patches again.
      why = applied
        ? `converging ${applied.slice(0, 12)} → ${ctx.bundle.checksum.slice(0, 12)}: every script runs`
        : "a converge is applying this configuration: every script runs";
    } else if (last.sha256 !== want.sha256) why = "script changed since its last success";
    else if (last.bootId !== want.bootId) why = "node rebooted since its last success";
    else if (last.epoch !== want.epoch) why = "update epoch moved on (periodic re-run)";
    else return { changes: [], problems: [] };
    return { changes: [{ kind: "script", name, summary: `run ${spec.source} (${why})` }], problems: [] };
  },

  async applyOwn(_change, spec, host, ctx) {
    const name = ctx.stepName;
    const file = `${STEP_FILES}/${name}`;
    await sweepWorkspace(host, ctx);
    await host.mkdir(STEP_FILES, { mode: 0o700 });
    await host.mkdir(PATHS.tmpDir, { mode: 0o1777 });
    await host.writeFile(file, spec.script, { mode: 0o700 });
    // The agent as the helpers call it (bb-package-install, disruption approval), on this root.
    const wrapper = `#!/bin/sh\n# Written by bashible: the agent, for the helpers scripts call.\nexec ${ctx.agentArgv.map(quote).join(" ")} "$@" --root ${quote(host.root)}\n`;
    if ((await host.readText(PATHS.agentWrapper)) !== wrapper) {
      await host.mkdir(`${STATE_DIR}/bin`, { mode: 0o700 });
      await host.writeFile(PATHS.agentWrapper, wrapper, { mode: 0o700 });
    }
    // Deckhouse's place for the library; refreshed from the agent's own copy before each script.
    const lib = await helperLibrary();
    if ((await host.readText(HELPERS)) !== lib) await host.writeFile(HELPERS, lib, { mode: 0o644 });
    const helpers = `source ${quote(host.path(HELPERS))}; `;
    const argv = [
      "bash",
      "--noprofile",
      "--norc",
      "-eEo",
      "pipefail",
      "-c",
      `cd ${quote(host.path(STATE_DIR))}; ${helpers}source ${quote(host.path(file))}`,
    ];
    const log = ctx.log.child({ script: spec.source });
    const r = await host.run(argv, {
      env: scriptEnv(host, ctx),
      cleanEnv: true,
      logFile: ctx.logFile,
      secrets: scriptSecrets(ctx),
      onLine: (stream, line) => log.info({ stream }, line),
      ...(ctx.signal ? { signal: ctx.signal } : {}),
    });
    if (r.exitCode !== 0 || r.killed) throw new CommandError([spec.source], r, spec.source);
    const record: RunRecord = { ...wantedRecord(spec, ctx), at: new Date().toISOString() };
    await host.writeFile(`${RECORDS}/${name}.json`, `${JSON.stringify(record)}\n`, { mode: 0o644 });
  },
};

const quote = (s: string) => `'${s.replace(/'/g, "'\\''")}'`;

export default script;
