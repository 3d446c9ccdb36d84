// Runs a step with the bash helper library loaded, as the agent runs NodeGroupConfiguration
// scripts (and Deckhouse runs its steps): bash --noprofile --norc -eEo pipefail, the library
// sourced, then the step file sourced. Each test gets its own directory standing in for
// /var/lib/bashible, so nothing outside it changes.
import { spawn } from "node:child_process";
import { mkdtemp, mkdir, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const LIBRARY = path.resolve(
  path.dirname(fileURLToPath(import.meta.url)),
  "../../steps/bashbooster/bashbooster.sh",
);

export interface StepResult {
  code: number;
  stdout: string;
  stderr: string;
}

export interface Sandbox {
  dir: string;
  /** Stands in for /var/lib/bashible (BASHIBLE_STATE_DIR). */
  state: string;
  /** Where flags are: $BB_WORKSPACE/flag. */
  flags: string;
  /** Runs `script` as a step; `env` is added to a clean environment. */
  step(script: string, env?: Record<string, string>, opts?: { input?: string; library?: string }): Promise<StepResult>;
  cleanup(): Promise<void>;
}

export async function sandbox(osRelease = 'ID=debian\nVERSION_ID="12"\n'): Promise<Sandbox> {
  const dir = await mkdtemp(path.join(os.tmpdir(), "bashbooster-"));
  const state = path.join(dir, "state");
  await mkdir(state, { recursive: true });
  await writeFile(path.join(dir, "os-release"), osRelease);
  let n = 0;
  return {
    dir,
    state,
    flags: path.join(state, ".bb-workspace", "flag"),
    async step(script, env = {}, opts = {}) {
      const file = path.join(dir, `step-${++n}.sh`);
      await writeFile(file, script);
      const lib = opts.library ?? LIBRARY;
      const child = spawn(
        "bash",
        [
          "--noprofile",
          "--norc",
          "-eEo",
          "pipefail",
          "-c",
          `cd "$BASHIBLE_STATE_DIR"; source "${lib}"; source "${file}"`,
        ],
        {
          env: {
            PATH: process.env.PATH ?? "/usr/sbin:/usr/bin:/sbin:/bin",
            HOME: dir,
            LANG: "C",
            BASHIBLE_STATE_DIR: state,
            BB_OS_RELEASE: path.join(dir, "os-release"),
            BASHIBLE_STEP: "100_test.sh",
            ...env,
          },
          stdio: ["pipe", "pipe", "pipe"],
        },
      );
      let stdout = "";
      let stderr = "";
      child.stdout.on("data", (d) => (stdout += d));
      child.stderr.on("data", (d) => (stderr += d));
      // A step that never reads stdin may exit before the write lands: EPIPE is then expected.
      child.stdin.on("error", (err: NodeJS.ErrnoException) => {
        if (err.code !== "EPIPE") throw err;
      });
      child.stdin.end(opts.input ?? "");
      const code = await new Promise<number>((resolve) => child.on("close", (c) => resolve(c ?? 1)));
      return { code, stdout, stderr };
    },
    cleanup: () => rm(dir, { recursive: true, force: true }),
  };
}
