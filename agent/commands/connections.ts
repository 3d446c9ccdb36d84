// Internal: resolves the cluster connections the agent would use (kubeconfig or bootstrap
// files, plus fallbacks from the last good bundle) and prints them as JSON, secrets included,
// for the daemon to read over a pipe. The daemon asks a short-lived child for this so that it
// never loads the YAML parser (about 5 MB of its resident memory).
import { EXIT, type Command } from "../../lib/cli.ts";
import { Host } from "../../host/host.ts";
import { clusterConnections } from "../converge/connect.ts";
import { lastGoodBundle, readStatus } from "../converge/state.ts";

export interface WireConnection {
  server: string;
  ca: string;
  cert?: string;
  key?: string;
  token?: string;
  tlsServerName?: string;
  source: string;
}

const connections: Command = {
  summary: "(internal) print the cluster connections as JSON for the daemon",
  usage: "[--root DIR] [--kubeconfig FILE] [--server URL]…",
  help: "Used by 'bashible run'. Prints secrets: not for people.",
  hidden: true,
  options: { kubeconfig: { type: "string" }, server: { type: "string", multiple: true } },
  takesRoot: true,
  logTo: "stderr",
  async run({ values, root, stdout, log }) {
    const host = new Host(root, { id: "", versionId: "", family: "debian", packageManager: "apt" });
    const last = await lastGoodBundle(host, await readStatus(host, { log }), { log });
    const conns = await clusterConnections(host, {
      kubeconfig: values.kubeconfig as string | undefined,
      servers: values.server as string[] | undefined,
      fallbackEndpoints: last?.context.apiserverEndpoints,
    });
    const b64 = (b?: Buffer) => b?.toString("base64");
    const wire: WireConnection[] = conns.map((c) => ({
      server: c.server,
      ca: c.ca.toString("base64"),
      cert: b64(c.cert),
      key: b64(c.key),
      token: c.token,
      tlsServerName: c.tlsServerName,
      source: c.source,
    }));
    stdout(`${JSON.stringify(wire)}\n`);
    return EXIT.ok;
  },
};
export default connections;
