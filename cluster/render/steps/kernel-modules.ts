// 004_load_mandatory_modules: Deckhouse's set, on every group.
import { MANDATORY_MODULES } from "../../../bundles/paths.ts";
import type { SpecBuilder } from "./spec-builder.ts";

export const kernelModulesSpec: SpecBuilder<"KernelModules"> = () => ({ modules: [...MANDATORY_MODULES] });
