import { EXIT, type Command } from "../../lib/cli.ts";
import { converge } from "../converge/converge.ts";
import { CONVERGE_HELP, CONVERGE_OPTIONS, convergeOptions } from "./converge-options.ts";

const once: Command = {
  summary: "converge the node once and exit",
  usage: "[--root DIR] [--bundle FILE|DIR] [options]",
  help: `Fetches the node group's bundle, and when its checksum or the boot differs from the last
applied run (or the Node carries update.node.deckhouse.io/reboot, or
/var/lib/bashible/configuration_checksum was removed) applies its steps in order.
Otherwise only re-asserts the node.deckhouse.io/configuration-checksum annotation.

Exit: 0 applied or in sync, 1 failed (see 'bashible status').

${CONVERGE_HELP}`,
  options: CONVERGE_OPTIONS,
  takesRoot: true,
  async run({ values, root, log }) {
    const r = await converge(convergeOptions(values, root, log));
    if (r.outcome === "applied" || r.outcome === "in-sync") return EXIT.ok;
    if (r.outcome !== "failed") log.warn({ outcome: r.outcome }, r.reason); // failures were logged where they happened
    return EXIT.error;
  },
};
export default once;
