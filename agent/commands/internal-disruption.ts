// `bashible internal-disruption`: the agent's half of bb-deckhouse-get-disruptive-update-approval.
// Annotates the Node update.node.deckhouse.io/disruption-required and waits for
// disruption-approved (exit 0); in the RollingUpdate mode marks the node for replacement
// instead (exit 10, as the helper expects); exit 1 when not approved in time.
import { EXIT, type Command, type ExitCode } from "../../lib/cli.ts";
import { NODE_KEYS } from "../../bundles/names.ts";
import { PATHS } from "../../bundles/paths.ts";
import { acceptBundle } from "../../bundles/verify.ts";
import { patchNode } from "../../lib/kube/api.ts";
import { stateHost } from "../converge/state.ts";
import { clusterClients } from "../converge/connect.ts";
import { nodeName } from "../converge/node-name.ts";
import { announceAndWait, hasAnnotation } from "../converge/approval.ts";

const REPLACED = 10 as ExitCode;

const command: Command = {
  summary: "(internal) ask for disruption approval, for bb-deckhouse-get-disruptive-update-approval",
  usage: "[--root DIR] [--timeout SECONDS]",
  help: `Annotates this Node ${NODE_KEYS.disruptionRequired} and waits for ${NODE_KEYS.disruptionApproved}.
Exit 0 approved, 10 the group replaces nodes instead (RollingUpdate: ${NODE_KEYS.rollingUpdate} set),
1 not approved within --timeout (default 600 s).`,
  hidden: true,
  options: { timeout: { type: "string" }, kubeconfig: { type: "string" } },
  takesRoot: true,
  logTo: "stderr",
  async run({ values, root, log }) {
    const host = stateHost(root);
    const name = process.env.D8_NODE_HOSTNAME || (await nodeName(host, undefined));
    const raw = await host.readFile(PATHS.runBundle);
    const mode = raw ? acceptBundle(raw, PATHS.runBundle).context.nodeGroup.disruptions.approvalMode : "Manual";
    // A converge without a cluster (local mode) has nobody to ask: the operator who ran it
    // approves. Anything else without credentials is an error, never an approval.
    if (process.env.BASHIBLE_LOCAL_MODE === "1") {
      log.warn("local mode (no cluster): the operator who runs the agent approves the disruption");
      return EXIT.ok;
    }
    const kubeconfig = (values.kubeconfig as string | undefined) ?? process.env.BASHIBLE_KUBECONFIG;
    const clients = await clusterClients(host, kubeconfig ? { kubeconfig } : {});
    const kube = clients[0];
    if (!kube) return EXIT.error;
    try {
      if (mode === "RollingUpdate") {
        await patchNode(kube, name, { metadata: { annotations: { [NODE_KEYS.rollingUpdate]: "" } } });
        log.warn("disruptive update: the node is marked for replacement (RollingUpdate)");
        return REPLACED;
      }
      const timeoutMs = Number(values.timeout ?? 600) * 1000;
      const ok = await announceAndWait(
        kube,
        name,
        log,
        { [NODE_KEYS.disruptionRequired]: "" },
        hasAnnotation(NODE_KEYS.disruptionApproved),
        { timeoutMs },
      );
      if (!ok) log.error(`${NODE_KEYS.disruptionApproved} did not come within ${timeoutMs / 1000} s`);
      return ok ? EXIT.ok : EXIT.error;
    } finally {
      for (const c of clients) c.close();
    }
  },
};
export default command;
