// Killing a whole pod in real cgroups of this kernel: v1 (freeze, SIGKILL every task, thaw)
// and v2 (cgroup.kill), with tasks that keep forking, orphans included. Root only.
import t from "tap";
import { randomUUID } from "node:crypto";
import { killPod } from "../../agent/early-oom/kill.ts";
import { detectLayout, findPodCgroups } from "../../agent/early-oom/cgroups.ts";
import { hasV1MemoryAndFreezer, RealCgroups, v2Mount } from "../../scripts/lib/early-oom.ts";
import { waitFor } from "../../scripts/lib/cli.ts";
import { requireRoot } from "../fixtures/root.ts";

await requireRoot("creates cgroups and kills their tasks");

// Each task forks a short-lived child and an orphan (reparented away from the test) in a loop.
const FORKER = "while :; do (sleep 1000 &); sleep 0.02 & wait $!; done";

function podRel(uid: string): string {
  const u = uid.replaceAll("-", "_");
  return `kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod${u}.slice`;
}

for (const version of [1, 2] as const) {
  const why =
    version === 1
      ? hasV1MemoryAndFreezer()
        ? undefined
        : "no writable v1 memory + freezer"
      : v2Mount()
        ? undefined
        : "no cgroup2 mount";
  t.test(
    `cgroup v${version}: the whole pod dies, forks and orphans included; the pod beside it keeps its tasks`,
    { skip: why },
    async (t) => {
      const cg = new RealCgroups(version);
      t.teardown(() => cg.cleanup());
      const victim = podRel(randomUUID());
      const other = podRel(randomUUID());
      for (const pod of [victim, other]) {
        const started = [];
        for (const c of ["cri-containerd-sandbox.scope", "cri-containerd-app.scope", "cri-containerd-sidecar.scope"]) {
          cg.mkdir(`${pod}/${c}`);
          started.push(cg.start(`${pod}/${c}`, c.includes("sandbox") ? "exec sleep 1000" : FORKER));
        }
        await cg.joined(pod, started);
      }
      // Orphans pile up: the tree is busy forking when the kill comes.
      await waitFor("orphans in both pods", () => cg.pids(victim).length >= 12 && cg.pids(other).length >= 12);

      if (version === 1) {
        const layout = detectLayout(cg.cgroupRoot);
        t.equal(layout?.version, 1);
        t.same(
          findPodCgroups(layout?.memoryRoot ?? "")
            .map((f) => f.rel)
            .sort(),
          [victim, other].sort(),
          "both pods found by the kubelet's names",
        );
      }
      const [memoryDir, freezerDir] = cg.dirs(victim);
      const r = await killPod({ version, memoryDir: memoryDir as string, freezerDir }, 5000);
      t.equal(r.method, version === 1 ? "freeze+SIGKILL" : "cgroup.kill");
      t.ok(r.pids.length >= 12, `${r.pids.length} processes found before the kill`);
      t.equal(r.remaining, 0, "none left when killPod returned");
      t.same(cg.pids(victim), [], "the kernel lists no task in the victim's cgroups");
      t.ok(cg.pids(other).length >= 12, "the other pod keeps its tasks");
    },
  );
}
