// 098_cleanup and 098_set_permissions: on every group.
import type { SpecBuilder } from "./spec-builder.ts";

export const bootstrapCleanupSpec: SpecBuilder<"BootstrapCleanup"> = () => ({});
export const filePermissionsSpec: SpecBuilder<"FilePermissions"> = () => ({});
