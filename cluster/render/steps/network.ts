// 003_disable_rp_filter and 005_disable_manage_iprules: on every group.
import type { SpecBuilder } from "./spec-builder.ts";

export const rpFilterSpec: SpecBuilder<"RpFilter"> = () => ({});
export const networkdIpRulesSpec: SpecBuilder<"NetworkdIpRules"> = () => ({});
