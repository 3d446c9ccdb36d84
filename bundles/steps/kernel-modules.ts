// 004_load_mandatory_modules: the kernel modules a node needs, loaded now and at every boot.
import { arr, obj, str } from "../schema.ts";
import { builtinStep } from "./descriptor.ts";

export const kernelModules = builtinStep({
  name: "004_load_mandatory_modules",
  kind: "KernelModules",
  spec: obj({
    modules: arr(str({ pattern: /^[a-z0-9_-]{1,64}$/, what: "a kernel module name" }), { max: 32, unique: (m) => m }),
  }),
  units: {},
});
