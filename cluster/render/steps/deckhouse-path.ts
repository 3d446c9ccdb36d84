// 004_add_deckhouse_paths: nothing to configure.
import type { SpecBuilder } from "./spec-builder.ts";

export const deckhousePathSpec: SpecBuilder<"DeckhousePath"> = () => ({});
