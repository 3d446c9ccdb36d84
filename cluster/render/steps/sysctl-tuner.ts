// 041_configure_sysctl_tuner: Deckhouse's set on every group; kernel.panic 0 where the group has
// fencing (a fenced node must stay down, not come back 10 s after the watchdog's panic), and
// vm.swappiness from kubelet.memorySwap (0 without swap).
import { sysctlTuner } from "../../../bundles/steps/sysctl-tuner.ts";
import { memorySwapOf, swapOn } from "./swap.ts";
import { checked, nodeGroupName, nodeGroupSpec, type SpecBuilder } from "./spec-builder.ts";

export const sysctlTunerSpec: SpecBuilder<"SysctlTuner"> = (i) => {
  // Watchdog: the agent arms one; Notify fences by deleting pods and needs no panic setting.
  const fencing = nodeGroupSpec(i).fencing?.mode === "Watchdog";
  const swappiness = swapOn(i) ? String(memorySwapOf(i).swappiness ?? 60) : "0";
  const settings = {
    ...sysctlTuner.defaults,
    "kernel.panic": fencing ? sysctlTuner.kernelPanic.fencing : sysctlTuner.kernelPanic.default,
    "vm.swappiness": swappiness,
  };
  return checked(
    sysctlTuner,
    {
      settings: Object.fromEntries(Object.entries(settings).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))),
      conntrack: { ...sysctlTuner.conntrack },
    },
    `${nodeGroupName(i)} (spec.fencing, spec.kubelet.memorySwap)`,
  );
};
