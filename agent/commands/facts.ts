import { EXIT, type Command } from "../../lib/cli.ts";
import { gatherFacts } from "../facts.ts";

const facts: Command = {
  summary: "print the node facts the agent decides with, as JSON",
  usage: "[--root DIR]",
  help: `Prints OS (id, version, bundle family), kernel, cgroup version, PSI availability,
boot id, hostname and non-loopback addresses. With --root, OS and hostname come from
DIR/etc; kernel facts always come from the running kernel.

Exits 1 when the OS is not one the bundles support (the JSON still prints, with os.error).`,
  takesRoot: true,
  logTo: "stderr",
  async run({ root, stdout, log }) {
    const f = await gatherFacts(root);
    stdout(`${JSON.stringify(f, null, 2)}\n`);
    if (f.os.error) {
      log.error({ osId: f.os.id }, f.os.error);
      return EXIT.error;
    }
    return EXIT.ok;
  },
};
export default facts;
