// 003_disable_swap: swap off (the kubelet's default failSwapOn), or a swap file of the size the
// group's kubelet.memorySwap asks for (LimitedSwap, as Deckhouse's CRD describes it).
import { int, obj, oneOf, opt } from "../schema.ts";
import { builtinStep } from "./descriptor.ts";

export const swap = builtinStep({
  name: "003_disable_swap",
  kind: "Swap",
  spec: obj({
    swapBehavior: oneOf(["NoSwap", "LimitedSwap"] as const),
    /** LimitedSwap: the swap file's size in GiB (the CRD's limitedSwap.size, `<N>G`). */
    limitedSwapSizeGiB: opt(int({ min: 1, max: 1024 })),
  }),
  units: {},
});
