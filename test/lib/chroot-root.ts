// A throwaway Debian root for running steps as root would on a node: an overlay over a cached
// debootstrapped root (scripts/lib/debian-root.ts; read-only by convention, writes go to a
// temporary upper directory), with
// the helper library at /opt/bb/bashbooster.sh and a local apt repository holding a test package
// (so apt-get works without the network; built with scripts/lib/debian-mirror.ts). Needs root.
import { execFile, spawn } from "node:child_process";
import { copyFile, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { buildDeb, writeRepoIndex } from "../../scripts/lib/debian-mirror.ts";
import { LIBRARY } from "./bashbooster.ts";

const run = promisify(execFile);

export interface StepRun {
  code: number;
  stdout: string;
  stderr: string;
}

export interface ChrootRoot {
  /** The merged root. */
  root: string;
  /** Where this root's writes land. */
  upper: string;
  /** Runs a script file (a path inside the root) as a step: library sourced first, stdin empty. */
  step(file: string, env?: Record<string, string>): Promise<StepRun>;
  /** Writes `script` into the root and runs it as a step. */
  script(script: string, env?: Record<string, string>): Promise<StepRun>;
  cleanup(): Promise<void>;
}

export const TEST_PACKAGE = "bb-test-hello";

export async function chrootRoot(lower: string): Promise<ChrootRoot> {
  const tmp = await mkdtemp(path.join(os.tmpdir(), "bb-root-"));
  const [upper, work, root] = ["upper", "work", "root"].map((d) => path.join(tmp, d)) as [string, string, string];
  for (const d of [upper, work, root]) await mkdir(d);
  await run("mount", ["-t", "overlay", "overlay", "-o", `lowerdir=${lower},upperdir=${upper},workdir=${work}`, root]);
  const cleanup = async () => {
    await run("umount", [root]).catch(() => {});
    await rm(tmp, { recursive: true, force: true });
  };
  try {
    // The test package, in a local repository the root's apt reads instead of the network.
    const repo = path.join(root, "srv/repo");
    await mkdir(repo, { recursive: true });
    await buildDeb(
      { name: TEST_PACKAGE, version: "1.2-1", files: { [`/usr/share/${TEST_PACKAGE}/hello`]: "hello\n" } },
      repo,
    );
    await writeRepoIndex(repo);
    await writeFile(path.join(root, "etc/apt/sources.list"), "deb [trusted=yes] file:/srv/repo ./\n");
    await rm(path.join(root, "etc/apt/sources.list.d"), { recursive: true, force: true });
    await mkdir(path.join(root, "etc/apt/sources.list.d"));
    await mkdir(path.join(root, "opt/bb"), { recursive: true });
    await mkdir(path.join(root, "var/lib/bashible"), { recursive: true });
    await copyFile(LIBRARY, path.join(root, "opt/bb/bashbooster.sh"));
  } catch (err) {
    await cleanup();
    throw err;
  }
  let n = 0;
  // stdin is empty, as the agent gives it: a command reading stdin gets EOF at once.
  const step = (file: string, env: Record<string, string> = {}) =>
    new Promise<StepRun>((resolve) => {
      const child = spawn(
        "chroot",
        [
          root,
          "bash",
          "--noprofile",
          "--norc",
          "-eEo",
          "pipefail",
          "-c",
          `cd /var/lib/bashible; source /opt/bb/bashbooster.sh; source ${file}`,
        ],
        {
          env: { PATH: "/opt/deckhouse/bin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", LANG: "C", ...env },
          stdio: ["ignore", "pipe", "pipe"],
        },
      );
      let stdout = "";
      let stderr = "";
      child.stdout.on("data", (d) => (stdout += d));
      child.stderr.on("data", (d) => (stderr += d));
      child.on("close", (code) => resolve({ code: code ?? 1, stdout, stderr }));
    });
  return {
    root,
    upper,
    step,
    async script(script, env) {
      const file = `/opt/bb/step-${++n}.sh`;
      await writeFile(path.join(root, file), script);
      return step(file, env);
    },
    cleanup,
  };
}
