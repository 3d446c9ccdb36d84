// KernelModules (004_load_mandatory_modules): each module loaded now (modprobe) and at every boot
// (a modules-load.d file, Deckhouse's d8_<module>.conf). Loaded is the kernel's answer
// (/sys/module/<name>), so a converged node runs nothing. A machine without modules for its
// running kernel (a container: it shares its host's) cannot load one: that is a problem of the
// step, not a failure, and says where to load it.
import os from "node:os";
import { HOST_PREP } from "../bundles/paths.ts";
import { planFile } from "../host/file-plan.ts";
import { moduleLoaded, modulesAvailable } from "./lib/kernel.ts";
import type { Primitive, Problem, Step } from "./types.ts";

const step: Step<"KernelModules"> = {
  kind: "KernelModules",
  async plan(spec, host) {
    const changes: Primitive[] = [];
    const problems: Problem[] = [];
    const load: string[] = [];
    for (const m of spec.modules) {
      const file = await planFile(host, {
        path: HOST_PREP.modulesLoad(m),
        content: `# Managed by bashible (004_load_mandatory_modules): loaded at boot.\n${m}\n`,
        mode: 0o644,
      });
      if (file) changes.push(file);
      // Under a sandbox root the running kernel is not the tree's: load what the files name.
      if (host.sandbox ? file !== undefined : !(await moduleLoaded(m))) load.push(m);
    }
    if (load.length && !host.sandbox && !(await modulesAvailable())) {
      problems.push({
        subject: "kernel modules",
        message: `${load.join(", ")} not loaded, and this machine has no modules for its kernel ${os.release()} (/lib/modules/${os.release()}: a container shares its host's kernel); load them on the host`,
      });
      return { changes, problems };
    }
    for (const m of load) {
      changes.push({
        kind: "command",
        argv: ["modprobe", m],
        recordInSandbox: true,
        summary: `load kernel module ${m}`,
      });
    }
    return { changes, problems };
  },
};

export default step;
