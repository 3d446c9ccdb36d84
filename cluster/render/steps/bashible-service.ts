// 080_setup_bashible_service: when the context has the agent's package.
import { agent } from "../../../bundles/steps/bashible-service.ts";
import { checked, type SpecBuilder } from "./spec-builder.ts";

export const agentSpec: SpecBuilder<"BashibleService"> = (i) => {
  const ref = i.packages.find((p) => p.name === i.context.agent.package);
  return ref ? checked(agent, { agent: ref, cleanupScript: i.cleanupScript }, "context") : undefined;
};
