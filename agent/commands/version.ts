import { EXIT, type Command } from "../../lib/cli.ts";
import { VERSION } from "../../lib/version.ts";

const version: Command = {
  summary: "print the agent's version and runtime",
  usage: "[--json]",
  help: "Options:\n      --json              print {version, node, platform} as JSON",
  options: { json: { type: "boolean" } },
  logTo: "stderr",
  async run({ values, stdout }) {
    const info = { version: VERSION, node: process.version, platform: `${process.platform}/${process.arch}` };
    stdout(
      values.json ? `${JSON.stringify(info)}\n` : `bashible ${info.version} (node ${info.node}, ${info.platform})\n`,
    );
    return EXIT.ok;
  },
};
export default version;
