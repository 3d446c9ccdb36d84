// 003_disable_swap: NodeGroup spec.kubelet.memorySwap (swapBehavior, limitedSwap.size; its
// swappiness goes to 041_configure_sysctl_tuner, the one owner of vm.* values).
import { swap } from "../../../bundles/steps/swap.ts";
import { RenderError } from "../errors.ts";
import { checked, nodeGroupName, nodeGroupSpec, type SpecBuilder, type StepInput } from "./spec-builder.ts";

interface MemorySwap {
  swapBehavior?: string;
  swappiness?: number;
  limitedSwap?: { size?: string };
}

export const memorySwapOf = (i: StepInput): MemorySwap => (nodeGroupSpec(i).kubelet?.memorySwap ?? {}) as MemorySwap;

/** Whether the group's nodes run with swap (then the kubelet's failSwapOn is false). */
export const swapOn = (i: StepInput) => memorySwapOf(i).swapBehavior === "LimitedSwap";

export const swapSpec: SpecBuilder<"Swap"> = (i) => {
  const m = memorySwapOf(i);
  const source = `${nodeGroupName(i)} (spec.kubelet.memorySwap)`;
  if (m.swapBehavior !== "LimitedSwap") return checked(swap, { swapBehavior: "NoSwap" }, source);
  const size = /^([0-9]+)G$/.exec(m.limitedSwap?.size ?? "");
  if (!size) {
    // Deckhouse's script stops on the node for this ("limitedSwap.size is required"): here the
    // NodeGroup is refused before any node sees it.
    throw new RenderError(source, "swapBehavior LimitedSwap needs limitedSwap.size, a size in GiB like '4G'");
  }
  return checked(swap, { swapBehavior: "LimitedSwap", limitedSwapSizeGiB: Number(size[1]) }, source);
};
