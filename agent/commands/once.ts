import { EXIT, type Command } from "../../lib/cli.ts";
import { converge } from "../converge/converge.ts";
import type { ConvergeResult } from "../converge/phases/run.ts";
import type { Logger } from "../../lib/log/log.ts";
import { CONVERGE_HELP, CONVERGE_OPTIONS, convergeOptions } from "./converge-options.ts";

/** Each problem as a warning, then what it means for the exit code; a run with nothing to do repeats the standing ones. */
function reportProblems(r: ConvergeResult, log: Logger): void {
  if (!r.problems.length) return;
  const standing = r.outcome === "in-sync" ? " (reported by the run that applied this bundle)" : "";
  for (const p of r.problems)
    log.warn({ step: p.step, subject: p.subject }, `not applied: ${p.subject}: ${p.message}${standing}`);
  if (r.outcome === "applied" || r.outcome === "in-sync") {
    const n = r.problems.length;
    log.warn(
      `${n} problem${n > 1 ? "s" : ""} held part of the bundle back (exit ${EXIT.problems}); the rest is applied. Fix what each says; 'bashible status' lists them`,
    );
  }
}

const once: Command = {
  summary: "converge the node once and exit",
  usage: "[--root DIR] [--bundle FILE|DIR] [options]",
  help: `Fetches the node group's bundle, and when its checksum or the boot differs from the last
applied run (or the Node carries update.node.deckhouse.io/reboot, or
/var/lib/bashible/configuration_checksum was removed) applies its steps in order.
Otherwise only re-asserts the node.deckhouse.io/configuration-checksum annotation.

Every problem a step reported (a NodeUser refused, a link refused for one user) is printed
as a warning: it holds that part of the bundle back until a person fixes it.

Exit: 0 applied or in sync; 3 applied or in sync except for those problems (the rest of the
bundle is applied; they stay until fixed); 1 failed, waiting for an approval, or the bundle
fetched was rejected (the last good one is kept and named in the log; see 'bashible status').

${CONVERGE_HELP}`,
  options: CONVERGE_OPTIONS,
  takesRoot: true,
  needsRoot: "it writes the node's files and sets their owners, under --root too",
  async run({ values, root, log }) {
    // SIGTERM (systemd stopping the service, the daemon stopping) ends the run at once: sleeps
    // and waits wake up, running commands lose their whole process group. A converge child
    // whose daemon died (reparented) stops the same way instead of running on unsupervised.
    const abort = new AbortController();
    const stop = (why: string) => {
      if (abort.signal.aborted) return;
      log.warn(`stopping the run: ${why}`);
      abort.abort();
    };
    process.once("SIGTERM", () => stop("SIGTERM"));
    process.once("SIGINT", () => stop("SIGINT"));
    const daemonPid = Number(process.env.BASHIBLE_DAEMON_PID);
    const orphanCheck =
      daemonPid > 0
        ? setInterval(() => {
            if (process.ppid !== daemonPid) stop(`the agent daemon (pid ${daemonPid}) is gone`);
          }, 1000)
        : undefined;
    orphanCheck?.unref();
    const r = await converge({ ...convergeOptions(values, root, log), signal: abort.signal }).finally(() =>
      clearInterval(orphanCheck),
    );
    reportProblems(r, log);
    if (r.rejected) return EXIT.error; // the bundle asked for was not applied; logged where it happened
    if (r.outcome === "applied" || r.outcome === "in-sync") return r.problems.length ? EXIT.problems : EXIT.ok;
    if (r.outcome !== "failed") log.warn({ outcome: r.outcome }, r.reason); // failures were logged where they happened
    return EXIT.error;
  },
};
export default once;
