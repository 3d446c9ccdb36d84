// 004_check_hostname and 064_check_hostname_uniqueness: on every group.
import type { SpecBuilder } from "./spec-builder.ts";

export const hostnameCheckSpec: SpecBuilder<"HostnameCheck"> = () => ({});

/** Static and CloudStatic nodes only, as in Deckhouse: cloud nodes get their names from the machine controller. */
export const hostnameUniquenessSpec: SpecBuilder<"HostnameUniqueness"> = (i) =>
  i.nodeGroup.spec?.nodeType === "Static" || i.nodeGroup.spec?.nodeType === "CloudStatic" ? {} : undefined;
