// The bundle families a NodeGroupConfiguration may target in spec.bundles.
import type { BundleFamily } from "../../bundles/os-families.ts";

export const BUNDLE_FAMILIES: readonly BundleFamily[] = ["debian", "rhel", "altlinux"];
