// The render loop on its own: the 4-hourly forced re-run happens when a group's window ends,
// and a failing group keeps what it served.
import t from "tap";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { pino } from "pino";
import { RenderLoop } from "../../cluster/server/render-loop.ts";
import { BundleStore } from "../../cluster/server/store.ts";
import { Metrics } from "../../cluster/server/metrics.ts";
import { loadConfigDir } from "../../cluster/sources/directory.ts";
import { nextEpochChangeMs } from "../../cluster/render/update-epoch.ts";
import type { Source, SourceSnapshot } from "../../cluster/sources/types.ts";

const EXAMPLE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../examples/cluster");
const snapshot = (await loadConfigDir(EXAMPLE)).snapshot;
const source = (snap: SourceSnapshot): Source => ({
  start: async () => {},
  snapshot: () => snap,
  nodeGroupOf: async () => undefined,
  stop: () => {},
});
const log = pino({ level: "silent" });

t.test("the bundle changes by itself when the group's update window ends", async (t) => {
  const uuid = snapshot.inputs.context!.clusterUUID;
  // A fake clock 1.2 s before the group's next window; it runs at real speed from there.
  const boundary = nextEpochChangeMs(uuid, "worker", Date.parse("2026-03-01T00:00:00Z"));
  const offset = boundary - 1200 - Date.now();
  const store = new BundleStore();
  const loop = new RenderLoop({
    source: source(snapshot),
    store,
    metrics: new Metrics(),
    log,
    now: () => Date.now() + offset,
  });
  t.teardown(() => loop.stop());
  await loop.runOnce();
  const first = store.get("nodegroupbundles", "worker")!;
  const changed = new Promise<string>((resolve) =>
    store.subscribe("nodegroupbundles", (ev) => resolve(String(ev.entry.object.checksum))),
  );
  const timeout = new Promise<string>((r) => setTimeout(() => r("no change"), 4000));
  const next = await Promise.race([changed, timeout]);
  t.not(next, "no change");
  t.not(next, first.object.checksum);
  t.equal(loop.passes, 2, "one extra pass, not a busy loop");
});

t.test("a failing group keeps its last good bundle and counts the failure", async (t) => {
  const snap = structuredClone(snapshot);
  const store = new BundleStore();
  const metrics = new Metrics();
  const reported: string[] = [];
  const loop = new RenderLoop(
    { source: source(snap), store, metrics, log },
    { onRenderError: async (group, err) => void reported.push(`${group}: ${err.message}`) },
  );
  t.teardown(() => loop.stop());
  await loop.runOnce();
  const good = store.get("nodegroupbundles", "worker")!;
  snap.inputs.users.push({ metadata: { name: "nobody" }, spec: { uid: 2000, sshPublicKeys: ["ssh-rsa A"] } });
  await loop.runOnce();
  await loop.runOnce();
  t.equal(store.get("nodegroupbundles", "worker"), good, "same entry, same resourceVersion");
  t.equal(metrics.renderErrors.get({ group: "worker" }), 2);
  t.same(reported, ["worker: NodeUser/nobody: 'nobody' is a system account and cannot be a NodeUser"], "reported once");
});
