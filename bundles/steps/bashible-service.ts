// 080_setup_bashible_service: the agent itself (self-update), its units and the cleanup script.
import { obj, str } from "../schema.ts";
import { builtinStep } from "./descriptor.ts";
import { REGISTRY_PACKAGE } from "./registry-packages.ts";

const AGENT = "bashible.service";
const AGENT_RESTART = "bashible-restart.service";

export const agent = builtinStep({
  name: "080_setup_bashible_service",
  kind: "BashibleService",
  spec: obj({
    /** The agent package the bundle pins: run in check mode before it replaces the running agent. */
    agent: REGISTRY_PACKAGE,
    /** cleanup_static_node.sh as bashibles/<group> serves it; rewritten on every run. */
    cleanupScript: str({ max: 256 * 1024, pattern: /^#!\/bin\/bash\n/, what: "a bash script" }),
  }),
  units: {
    agent: AGENT,
    /** Restarts bashible.service once the converge in flight has finished (its ExecReload starts it). */
    agentRestart: AGENT_RESTART,
  },
  /** And the timer Deckhouse's own bashible runs from. */
  cleanupUnits: [AGENT, AGENT_RESTART, "bashible.timer"],
});
