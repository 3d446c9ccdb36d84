// softdog, the kernel's software watchdog: options in /etc/modprobe.d (soft_margin=60: the
// node panics 60 s after the last pet; soft_panic=1: a panic, not a silent reboot, so the
// kernel log says why), loaded at boot through /etc/modules-load.d and now through modprobe.
// Under a sandbox root nothing is loaded: the modprobe is recorded in the sandbox actions log,
// as every other effect that would reach the real machine.
import { execFile } from "node:child_process";
import { appendFile, mkdir, readFile, rename, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import { PATHS } from "../../bundles/paths.ts";
import { type Clock, systemClock } from "./clock.ts";

export const SOFTDOG = {
  modprobeConf: "/etc/modprobe.d/bashible-softdog.conf",
  modulesLoad: "/etc/modules-load.d/bashible-softdog.conf",
  marginSeconds: 60,
} as const;

export interface SoftdogSetup {
  /** Files written (changed) this time. */
  changed: string[];
  /** What was run to load the module, or why nothing was. */
  load: string;
}

async function ensureFile(root: string, file: string, content: string): Promise<boolean> {
  const full = path.join(root, file);
  if ((await readFile(full, "utf8").catch(() => undefined)) === content) return false;
  await mkdir(path.dirname(full), { recursive: true, mode: 0o755 });
  const tmp = `${full}.tmp-${process.pid}`;
  await writeFile(tmp, content, { mode: 0o644 });
  await rename(tmp, full);
  return true;
}

const run = (cmd: string, args: string[]) =>
  new Promise<void>((resolve, reject) =>
    execFile(cmd, args, { timeout: 20_000 }, (err, _out, stderr) =>
      err ? reject(new Error(`${cmd} ${args.join(" ")}: ${stderr.trim() || err.message}`)) : resolve(),
    ),
  );

/**
 * Writes the module options and the boot-time load, then loads softdog when the device is
 * missing. A loaded module keeps the margin it was loaded with: the caller reads the real
 * timeout from sysfs and refuses to arm when it is longer than the cluster side assumes.
 */
export async function setupSoftdog(
  root: string,
  device: string,
  marginSeconds: number,
  now: Clock = systemClock,
): Promise<SoftdogSetup> {
  const changed: string[] = [];
  const options = `# Written by bashible (fencing). The node panics ${marginSeconds} s after the agent's last pet.\noptions softdog soft_margin=${marginSeconds} soft_panic=1\n`;
  if (await ensureFile(root, SOFTDOG.modprobeConf, options)) changed.push(SOFTDOG.modprobeConf);
  if (await ensureFile(root, SOFTDOG.modulesLoad, "# Written by bashible (fencing).\nsoftdog\n"))
    changed.push(SOFTDOG.modulesLoad);
  // stat, never open: opening the device would arm it.
  const exists = await stat(path.join(root, device)).then(
    () => true,
    (err: NodeJS.ErrnoException) => err.code !== "ENOENT",
  );
  if (exists) return { changed, load: `${device} present; modprobe not needed` };
  if (root !== "/") {
    const log = path.join(root, PATHS.sandboxActions);
    await mkdir(path.dirname(log), { recursive: true });
    await appendFile(
      log,
      `${new Date(now()).toISOString()} modprobe softdog soft_margin=${marginSeconds} soft_panic=1\n`,
    );
    return { changed, load: `sandbox root: modprobe recorded in ${PATHS.sandboxActions}` };
  }
  await run("modprobe", ["softdog", `soft_margin=${marginSeconds}`, "soft_panic=1"]);
  return { changed, load: "modprobe softdog" };
}
