// `bashible adopt`'s recognition and its plan text, on trees laid out as Deckhouse v1.66 leaves a
// Debian worker (test/fixtures/deckhouse-node.ts), as this agent leaves one, and as neither.
import t, { type Test } from "tap";
import { mkdir, rm, writeFile, readFile } from "node:fs/promises";
import path from "node:path";
import { Host } from "../../host/host.ts";
import { osProfile } from "../../agent/converge/converge.ts";
import { recognize } from "../../agent/adopt/recognize.ts";
import { RecordError } from "../../agent/adopt/record.ts";
import { type AdoptionPlan, formatAdoptionPlan, refusal } from "../../agent/adopt/adopt.ts";
import { ADOPTION, DECKHOUSE, DECKHOUSE_ONLY_PATHS, DECKHOUSE_ONLY_UNITS } from "../../bundles/deckhouse-node.ts";
import { spawnSync } from "node:child_process";
import { loadConfigDir } from "../../cluster/sources/directory.ts";
import { renderGroup } from "../../cluster/render/render.ts";
import type { NodeGroupObject, RenderInputs } from "../../cluster/render/inputs.ts";
import { sandbox } from "../../scripts/lib/bundle.ts";
import { DECKHOUSE_CHECKSUM, layDeckhouseWorker } from "../fixtures/deckhouse-node.ts";

async function tree(t: Test, lay?: (root: string) => Promise<void>): Promise<Host> {
  const root = await sandbox();
  t.teardown(() => rm(root, { recursive: true, force: true }));
  for (const f of ["passwd", "group", "shadow"]) await writeFile(path.join(root, "etc", f), "");
  if (lay) await lay(root);
  return new Host(root, await osProfile(root));
}

t.test("a Deckhouse worker is recognised, with what it keeps named by path", async (t) => {
  const host = await tree(t, (root) => layDeckhouseWorker(root));
  const r = await recognize(host);
  t.equal(r.kind, "deckhouse");
  t.match(r.reason, DECKHOUSE.entry);
  t.equal(r.deckhouseChecksum, DECKHOUSE_CHECKSUM, "Deckhouse's last applied checksum");
  const found = new Set(r.evidence.filter((e) => e.found).map((e) => e.path));
  for (const p of [
    DECKHOUSE.bundleSteps,
    DECKHOUSE.timerFile,
    DECKHOUSE.kubeletDropIn,
    "/var/lib/kubelet/pki/kubelet-client-current.pem",
    "/etc/kubernetes/kubelet.conf",
    DECKHOUSE.containerdBase,
    "/etc/containerd/conf.d",
    "/opt/deckhouse/bin",
    DECKHOUSE.apiProxyManifest,
    "/lib/systemd/system/d8-shutdown-inhibitor.service",
  ])
    t.ok(found.has(p), `${p} found`);
  t.same(r.deckhouseUnits.sort(), ["d8-shutdown-inhibitor.service", "sysctl-tuner.service", "sysctl-tuner.timer"]);
});

t.test(
  "a machine neither Deckhouse nor this agent set up is unknown, and the reason says what is missing",
  async (t) => {
    const host = await tree(t);
    const r = await recognize(host);
    t.equal(r.kind, "unknown");
    t.match(r.reason, /neither Deckhouse's bashible nor this agent/);
    t.match(r.reason, DECKHOUSE.entry);
    t.match(refusal({ recognition: r } as AdoptionPlan), /there is nothing to adopt/, "adoption is refused on it");
  },
);

t.test("bashible.sh alone (no timer, no Deckhouse service) is not Deckhouse's node", async (t) => {
  const host = await tree(t, async (root) => {
    await mkdir(path.join(root, "var/lib/bashible"), { recursive: true });
    await writeFile(path.join(root, "var/lib/bashible/bashible.sh"), "#!/bin/sh\n");
  });
  t.equal((await recognize(host)).kind, "unknown");
});

t.test("a node this agent bootstrapped is its own: nothing to adopt", async (t) => {
  const host = await tree(t, async (root) => {
    await mkdir(path.join(root, "etc/systemd/system"), { recursive: true });
    await writeFile(
      path.join(root, "etc/systemd/system/bashible.service"),
      await readFile(path.resolve(import.meta.dirname, "../../systemd/bashible.service"), "utf8"),
    );
  });
  const r = await recognize(host);
  t.equal(r.kind, "agent");
  t.match(r.reason, /this agent already runs this node/);
});

t.test("the record decides once an adoption started: adopting, adopted, reverted", async (t) => {
  const host = await tree(t, (root) => layDeckhouseWorker(root));
  const record = (state: string) =>
    JSON.stringify({ version: 1, state, startedAt: "2026-12-01T10:00:00Z", adoptedAt: "2026-12-01T10:01:00Z" });
  await writeFile(host.path(ADOPTION.record), record("adopting"));
  const adopting = await recognize(host);
  t.equal(adopting.kind, "adopting");
  t.match(adopting.reason, /'bashible adopt --yes' resumes it/);
  await writeFile(host.path(ADOPTION.record), record("adopted"));
  t.equal((await recognize(host)).kind, "adopted");
  await writeFile(host.path(ADOPTION.record), record("reverted"));
  t.equal((await recognize(host)).kind, "deckhouse", "given back: Deckhouse's again, and adoptable");
});

t.test("a record that cannot be read stops adoption, naming the file", async (t) => {
  const host = await tree(t, (root) => layDeckhouseWorker(root));
  await writeFile(host.path(ADOPTION.record), "{not json");
  await t.rejects(recognize(host), RecordError);
  await t.rejects(recognize(host), { message: new RegExp(`${ADOPTION.record} cannot be read`) });
});

t.test("the plan text lists the units stopped, the files saved, the restarts and the converge's plan", async (t) => {
  const host = await tree(t, (root) => layDeckhouseWorker(root));
  const recognition = await recognize(host);
  const p: AdoptionPlan = {
    recognition,
    report: {
      nodeName: "worker-1",
      nodeGroup: "worker",
      checksum: "c".repeat(64),
      source: "file /tmp/b.json",
      gate: { run: true, reason: "checksum differs" },
      steps: [],
      secrets: [],
    } as unknown as AdoptionPlan["report"],
    bundle: {} as AdoptionPlan["bundle"],
    stop: [{ unit: "bashible.timer", why: "Deckhouse's bashible would run every minute beside this agent" }],
    replace: { unit: "bashible.service", why: "Deckhouse's oneshot" },
    save: ["/etc/systemd/system/bashible.service", DECKHOUSE.kubeletDropIn],
    create: ["/etc/systemd/system/kubelet.service"],
    restarts: [{ unit: "kubelet.service", action: "restart", why: [DECKHOUSE.kubeletDropIn] }],
    moveManifest: DECKHOUSE.apiProxyManifest,
  };
  t.equal(refusal(p), undefined, "nothing refuses it");
  const text = formatAdoptionPlan(p, "~ 064_configure_kubelet (Kubelet): 1 change\n");
  t.match(text, "stop and disable bashible.timer");
  t.match(text, "replace bashible.service");
  t.match(text, `    ${DECKHOUSE.kubeletDropIn}\n`, "each saved file on its line");
  t.match(text, `services that would restart: kubelet.service (restart: ${DECKHOUSE.kubeletDropIn})`);
  t.match(text, `move ${DECKHOUSE.apiProxyManifest} to ${ADOPTION.saved}${DECKHOUSE.apiProxyManifest}`);
  t.match(text, ADOPTION.record);
  t.match(text, "~ 064_configure_kubelet (Kubelet): 1 change", "then the converge's own plan");
  t.match(
    refusal({ ...p, report: { ...p.report, fetchError: "HTTP 403" } }),
    /could not be fetched \(HTTP 403\); nothing was changed/,
  );
  t.match(
    refusal({
      ...p,
      report: {
        ...p.report,
        steps: [{ name: "064_configure_kubelet", kind: "Kubelet", changes: [], problems: [], error: "boom" }],
      },
    }),
    /064_configure_kubelet: boom: these steps cannot be planned/,
  );
});

t.test("cleanup_static_node.sh also removes what Deckhouse left on an adopted node", async (t) => {
  const EXAMPLE = path.resolve(import.meta.dirname, "../../examples/cluster");
  const base = (await loadConfigDir(EXAMPLE)).snapshot.inputs as RenderInputs;
  const ng = structuredClone(base.nodeGroups.find((g) => g.metadata.name === "worker")!) as NodeGroupObject;
  const r = renderGroup(ng, { ...structuredClone(base), nodeGroups: [ng] }, Date.parse("2026-01-01T00:00:00Z"));
  const script = (r.bashible.data as Record<string, string>)["cleanup_static_node.sh"]!;
  t.equal(spawnSync("bash", ["-n"], { input: script }).status, 0, "bash reads it");
  const units = script.match(/^UNITS=\((.*)\)$/m)?.[1]?.split(" ") ?? [];
  for (const u of [...DECKHOUSE_ONLY_UNITS, "bashible.timer", "sysctl-tuner.timer", "sysctl-tuner.service"])
    t.ok(units.includes(u), `${u} stopped, disabled and removed`);
  for (const p of DECKHOUSE_ONLY_PATHS) t.match(script, new RegExp(`^  ${p}$`, "m"), `${p} removed`);
  t.match(script, `if [[ "$(id -u deckhouse 2>/dev/null)" == "64535" ]]`, "the deckhouse user, by its id");
  t.match(script, 'find "$p" -xdev -mindepth 1 -delete', "a path on a volume of its own is wiped on it");
});
