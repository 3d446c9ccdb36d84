import { EXIT, type Command, type ExitCode, UsageError } from "../../lib/cli.ts";
import type { Logger } from "../../lib/log/log.ts";
import { ADOPTION, DECKHOUSE } from "../../bundles/deckhouse-node.ts";
import { UNITS } from "../../bundles/steps/index.ts";
import { Host } from "../../host/host.ts";
import { sleep } from "../../lib/sleep.ts";
import {
  AdoptRefused,
  type AdoptHooks,
  adopt,
  formatAdoptionPlan,
  planAdoption,
  refusal,
  revert,
} from "../adopt/adopt.ts";
import { recognize } from "../adopt/recognize.ts";
import { osProfile } from "../converge/converge.ts";
import { formatPlan } from "./plan.ts";
import { CONVERGE_HELP, CONVERGE_OPTIONS, convergeOptions } from "./converge-options.ts";

/** How long adoption waits for Deckhouse's run in progress, and for the kubelet to drop the proxy pod. */
const WAIT_SERVICE_MS = 10 * 60_000;
const WAIT_PROXY_MS = 3 * 60_000;

/** 127.0.0.1:6445 in /proc/net/tcp, listening (state 0A). */
const PROXY_LISTEN = /^\s*\d+: 0100007F:192D 00000000:0000 0A /m;

async function until(deadlineMs: number, check: () => Promise<boolean>): Promise<boolean> {
  const end = Date.now() + deadlineMs;
  for (;;) {
    if (await check()) return true;
    if (Date.now() > end) return false;
    await sleep(1000);
  }
}

/** On a node: ask systemd, read the kernel's sockets. Under --root nothing runs, so nothing to wait for. */
const hooks: AdoptHooks = {
  waitInactive: (host: Host, unit: string) =>
    host.sandbox
      ? Promise.resolve(true)
      : until(WAIT_SERVICE_MS, async () => {
          const r = await host.run(["systemctl", "is-active", "--", unit]);
          return !["active", "activating", "deactivating", "reloading"].includes(r.stdout.trim());
        }),
  waitProxyGone: (host: Host) =>
    host.sandbox
      ? Promise.resolve(true)
      : until(WAIT_PROXY_MS, async () => {
          const r = await host.run(["cat", "/proc/net/tcp"]);
          return !PROXY_LISTEN.test(r.stdout);
        }),
};

/** `work`'s exit code; a refusal (AdoptRefused: it says what to do) is logged and exits 1. */
async function orRefused(log: Logger, work: () => Promise<ExitCode>): Promise<ExitCode> {
  try {
    return await work();
  } catch (err) {
    if (!(err instanceof AdoptRefused)) throw err;
    log.error(err.message);
    return EXIT.error;
  }
}

/** Services adoption restarted, but this agent's own (revert stops those). */
const others = (units: string[]) =>
  [...new Set(units)].filter((u) => u !== UNITS.agent && u !== UNITS.agentRestart && u !== UNITS.apiProxy);

const adoptCommand: Command = {
  summary: "take over a node Deckhouse's bashible set up (--plan shows what changes, --yes adopts, --revert goes back)",
  usage: "--plan | --yes | --revert [--root DIR] [--bundle FILE|DIR] [options]",
  help: `Recognises a node Deckhouse's bashible manages:
  ${DECKHOUSE.entry} and ${DECKHOUSE.bundleSteps}, ${DECKHOUSE.timer},
  the kubelet with its certificates and ${DECKHOUSE.kubeletDropIn},
  containerd's config and conf.d, /opt/deckhouse/bin, the sysctl tuner and d8-* units, the API
  proxy; and takes it over in place: the Node object, the kubelet's certificates and the running
  pods stay.

      --plan              show what adopting would change, and change nothing: what was found,
                          the units stopped, the files saved, the services that would restart,
                          and 'bashible plan' for the node's bundle over what Deckhouse left
                          (diffs). Exit 2: adopting would change the node
      --yes               adopt: stop and disable ${DECKHOUSE.timer} (a Deckhouse run in progress
                          is waited for), save a copy of every Deckhouse file the converge
                          changes, move the API proxy's static pod aside when the bundle runs
                          the proxy, record it all, then converge. Again on an adopted node:
                          says so and changes nothing; on an interrupted one: resumes
      --revert            give the node back: stop ${UNITS.agent}, put Deckhouse's saved files
                          and the static pod back, remove the files adoption created, enable
                          and start ${DECKHOUSE.timer}

The record: ${ADOPTION.record}
The copies: ${ADOPTION.saved}/<node path>

Without one of the three it refuses. A node that is neither Deckhouse's nor this agent's is
refused. --yes and --revert need root.

Exit: 0 done (or nothing to do), 1 refused or failed, 2 (--plan) adopting would change the node.

${CONVERGE_HELP}`,
  options: {
    ...CONVERGE_OPTIONS,
    plan: { type: "boolean" },
    yes: { type: "boolean" },
    revert: { type: "boolean" },
  },
  takesRoot: true,
  logTo: "stderr",
  async run({ values, root, log, stdout }) {
    const modes = (["plan", "yes", "revert"] as const).filter((m) => values[m]);
    if (modes.length > 1) throw new UsageError(`--${modes.join(" and --")} do not go together: pick one`);
    const mode = modes[0];
    if ((mode === "yes" || mode === "revert") && process.geteuid?.() !== 0) {
      throw new UsageError(
        `adopt --${mode} needs root (it stops units and rewrites the node's files): run it with sudo`,
      );
    }
    const host = new Host(root, await osProfile(root));
    const recognition = await recognize(host);

    if (mode === "revert") {
      if (recognition.record?.state === "reverted") {
        stdout(
          `already reverted at ${recognition.record.revertedAt}: Deckhouse's ${DECKHOUSE.timer} runs this node; nothing to do\n`,
        );
        return EXIT.ok;
      }
      return orRefused(log, async () => {
        const r = await revert(host, log);
        stdout(
          [
            `reverted: ${UNITS.agent} stopped and disabled, ${DECKHOUSE.timer} enabled and started`,
            ...(r.restored.length ? [`restored Deckhouse's files: ${r.restored.join(", ")}`] : []),
            ...(r.removed.length ? [`removed what adoption created: ${r.removed.join(", ")}`] : []),
            ...(others(r.record.restarted).length
              ? [
                  `still running with this agent's settings until they restart: ${others(r.record.restarted).join(", ")} (Deckhouse's next run restarts what it changes)`,
                ]
              : []),
            `the record stays in ${ADOPTION.record} (state reverted), the copies in ${ADOPTION.saved}`,
            "",
          ].join("\n"),
        );
        return EXIT.ok;
      });
    }

    if (recognition.kind === "adopted") {
      stdout(`already adopted: ${recognition.reason}; nothing to do ('bashible adopt --revert' goes back)\n`);
      return EXIT.ok;
    }
    if (recognition.kind === "agent") {
      stdout(`nothing to adopt: ${recognition.reason}\n`);
      return EXIT.ok;
    }
    if (recognition.kind === "unknown") {
      log.error(`refusing to adopt: ${recognition.reason}`);
      return EXIT.error;
    }
    if (!mode) {
      log.error(
        `${recognition.reason}. Adopting stops Deckhouse's timer and converges this agent over it: see what would change with 'bashible adopt --plan', then run 'bashible adopt --yes'`,
      );
      return EXIT.error;
    }

    const options = convergeOptions(values, root, log);
    const plan = await planAdoption(options, host, recognition);
    const why = refusal(plan);
    if (mode === "plan") {
      stdout(formatAdoptionPlan(plan, formatPlan(plan.report)));
      if (why) log.error(`adoption would be refused: ${why}`);
      return why ? EXIT.error : EXIT.changesPending;
    }
    if (why) {
      log.error(`refusing to adopt: ${why}`);
      return EXIT.error;
    }
    return orRefused(log, async () => {
      const record = await adopt(options, host, plan, hooks);
      if (record.state !== "adopted") {
        log.error(
          `the converge did not finish (${record.converge?.outcome}: ${record.converge?.reason}); Deckhouse's timer stays off. Fix what it says and run 'bashible adopt --yes' again (it resumes), or 'bashible adopt --revert'; ${ADOPTION.record} says what was done`,
        );
        return EXIT.error;
      }
      stdout(
        [
          `adopted: ${DECKHOUSE.timer} stopped and disabled, ${record.saved.length} Deckhouse files saved under ${ADOPTION.saved}, converged to bundle ${record.bundleChecksum.slice(0, 12)} (${record.converge?.outcome})`,
          ...(record.restarted.length ? [`restarted: ${[...new Set(record.restarted)].join(", ")}`] : []),
          `how to go back: 'bashible adopt --revert' (the steps are in ${ADOPTION.record})`,
          "",
        ].join("\n"),
      );
      return EXIT.ok;
    });
  },
};
export default adoptCommand;
