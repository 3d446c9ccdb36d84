// The converge runtime reporting to a real kube-apiserver as the node itself
// (system:node:<name>): checksum annotation, Events, update approval, reboot requests.
import t from "tap";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import { withControlPlane } from "../../scripts/lib/control-plane-fixture.ts";
import { bashible, waitFor } from "../../scripts/lib/cli.ts";
import { makeBundle, sandbox, script, writeBundle } from "../../scripts/lib/bundle.ts";
import * as api from "../../lib/kube/api.ts";
import { requireRoot } from "../fixtures/root.ts";

await requireRoot("the agent sets root ownership on what it writes");

const cp = await withControlPlane(t);
const admin = cp.admin;

async function node(name: string) {
  await admin.request("POST", "/api/v1/nodes", {
    body: { apiVersion: "v1", kind: "Node", metadata: { name, labels: { "node.deckhouse.io/group": "worker" } } },
  });
  const id = await cp.mintNode(name);
  const root = await sandbox("ID=debian\nVERSION_ID=12\n", name);
  // As bootstrap.sh leaves it: the first run needs no approval.
  await mkdir(path.join(root, "var/lib/bashible"), { recursive: true });
  await writeFile(path.join(root, "var/lib/bashible/first_run"), "");
  return { root, kubeconfig: id.kubeconfig, name };
}

const annotations = async (name: string) => (await api.getNode(admin, name)).metadata.annotations ?? {};

async function events(name: string): Promise<{ reason: string; message: string; type: string }[]> {
  const list = await api.list<{ reason: string; message: string; type: string }>(
    admin,
    "/api/v1/namespaces/default/events",
    {
      fieldSelector: `involvedObject.name=${name}`,
    },
  );
  return list.items;
}

const step = (text: string) => script("050_hello", `echo "${text}" > "$BASHIBLE_ROOT/hello"`);

t.test("a successful run annotates the checksum and records start/finish Events", async (t) => {
  const n = await node("conv-1");
  const b = makeBundle([step("one")]);
  const file = await writeBundle(n.root, b, `../b-${n.name}.json`);
  const r = await bashible(["once", "--root", n.root, "--bundle", file, "--kubeconfig", n.kubeconfig]);
  t.equal(r.status, 0, r.stdout + r.stderr);
  t.equal((await annotations(n.name))["node.deckhouse.io/configuration-checksum"], b.checksum);
  const ev = await events(n.name);
  t.ok(ev.some((e) => e.reason === "BashibleNodeUpdate" && /started/.test(e.message)));
  t.ok(ev.some((e) => e.reason === "BashibleNodeUpdate" && /finished; changed: 050_hello/.test(e.message)));

  // Someone removes the annotation: an in-sync run puts it back without running steps.
  await api.patchNode(admin, n.name, {
    metadata: { annotations: { "node.deckhouse.io/configuration-checksum": null } },
  });
  t.equal((await bashible(["once", "--root", n.root, "--bundle", file, "--kubeconfig", n.kubeconfig])).status, 0);
  t.equal((await annotations(n.name))["node.deckhouse.io/configuration-checksum"], b.checksum, "re-asserted");
});

t.test("a failed step sends BashibleStepFailed with the log tail, secrets redacted", async (t) => {
  const n = await node("conv-2");
  const b = makeBundle([
    script("060_broken", `echo "using proxy-token-not-for-logs"; echo "disk on fire" >&2; exit 1`),
  ]);
  const file = await writeBundle(n.root, b, `../b-${n.name}.json`);
  const r = await bashible([
    "once",
    "--root",
    n.root,
    "--bundle",
    file,
    "--kubeconfig",
    n.kubeconfig,
    "--retry-interval",
    "0",
    "--max-retries",
    "2",
  ]);
  t.equal(r.status, 1);
  const failed = (await events(n.name)).find((e) => e.reason === "BashibleStepFailed");
  t.ok(failed, "event recorded");
  t.equal(failed?.type, "Warning");
  t.match(failed?.message, /060_broken/);
  t.match(failed?.message, /disk on fire/, "the log tail is in the Event");
  t.notMatch(failed?.message, /proxy-token-not-for-logs/, "the bundle's token is redacted");
  t.notMatch(r.stdout + r.stderr, /proxy-token-not-for-logs/, "and absent from logs");
  t.notOk((await annotations(n.name))["node.deckhouse.io/configuration-checksum"], "no checksum claimed");
});

t.test("a later run with changes waits for update approval; the first run does not", async (t) => {
  const n = await node("conv-3");
  const first = await writeBundle(n.root, makeBundle([step("one")]), `../b-${n.name}.json`);
  // First run of a node (first_run present): no approval.
  t.equal((await bashible(["once", "--root", n.root, "--bundle", first, "--kubeconfig", n.kubeconfig])).status, 0);
  t.rejects(readFile(path.join(n.root, "var/lib/bashible/first_run")), "first_run removed after success");

  const second = await writeBundle(n.root, makeBundle([step("two")]), `../b-${n.name}.json`);
  const run = bashible(["once", "--root", n.root, "--bundle", second, "--kubeconfig", n.kubeconfig]);
  await waitFor("waiting-for-approval", async () =>
    "update.node.deckhouse.io/waiting-for-approval" in (await annotations(n.name)) ? true : undefined,
  );
  t.equal(await readFile(path.join(n.root, "hello"), "utf8"), "one\n", "nothing changed before approval");
  await api.patchNode(admin, n.name, { metadata: { annotations: { "update.node.deckhouse.io/approved": "" } } });
  const r = await run;
  t.equal(r.status, 0, r.stdout);
  t.equal(await readFile(path.join(n.root, "hello"), "utf8"), "two\n");
  const a = await annotations(n.name);
  t.ok(a["node.deckhouse.io/configuration-checksum"], "done: the checksum annotation is written");
  t.ok("update.node.deckhouse.io/approved" in a, "the approval annotations are the controller's to clear");
  // As the approval controller does once checksum and Ready agree (tested in controllers.test.ts).
  await api.patchNode(admin, n.name, {
    metadata: {
      annotations: { "update.node.deckhouse.io/approved": null, "update.node.deckhouse.io/waiting-for-approval": null },
    },
  });

  const unapproved = await writeBundle(n.root, makeBundle([step("three")]), `../b-${n.name}.json`);
  const timedOut = await bashible([
    "once",
    "--root",
    n.root,
    "--bundle",
    unapproved,
    "--kubeconfig",
    n.kubeconfig,
    "--approval-timeout",
    "1",
  ]);
  t.equal(timedOut.status, 1, "not approved in time: not applied");
  t.equal(await readFile(path.join(n.root, "hello"), "utf8"), "two\n");
  const st = JSON.parse((await bashible(["status", "--root", n.root, "--json"])).stdout);
  t.equal(st.lastRun.outcome, "waiting-approval");
});

t.test("the first run reboots when a script asks (a kernel update), without waiting for approval", async (t) => {
  const n = await node("conv-5");
  const b = makeBundle([script("050_kernel", 'echo updated > "$BASHIBLE_ROOT/kernel"; bb-flag-set reboot')]);
  const file = await writeBundle(n.root, b, `../b-${n.name}.json`);
  const r = await bashible([
    "once",
    "--root",
    n.root,
    "--bundle",
    file,
    "--kubeconfig",
    n.kubeconfig,
    "--approval-timeout",
    "1",
  ]);
  t.equal(r.status, 0, r.stdout + r.stderr);
  t.match(
    await readFile(path.join(n.root, "var/lib/bashible/sandbox-actions.log"), "utf8"),
    /reboot/,
    "rebooted (recorded in the sandbox), as Deckhouse's 099_reboot does on the first run",
  );
  const a = await annotations(n.name);
  t.notOk("update.node.deckhouse.io/disruption-required" in a, "provisioning asks nobody");
  t.notOk("node.deckhouse.io/configuration-checksum" in a, "the run after the reboot says it is done");
  await t.rejects(readFile(path.join(n.root, "var/lib/bashible/.bb-workspace/flag/reboot")), { code: "ENOENT" });
});

t.test("the reboot annotation reboots only after disruption approval, then is cleared", async (t) => {
  const n = await node("conv-4");
  const file = await writeBundle(n.root, makeBundle([step("one")]), `../b-${n.name}.json`);
  t.equal((await bashible(["once", "--root", n.root, "--bundle", file, "--kubeconfig", n.kubeconfig])).status, 0);
  const actionsFile = path.join(n.root, "var/lib/bashible/sandbox-actions.log");
  await api.patchNode(admin, n.name, {
    metadata: {
      annotations: { "update.node.deckhouse.io/reboot": "", "node.deckhouse.io/configuration-checksum": null },
    },
  });

  // Not approved within the run's wait: no reboot, and the run says what it waits for.
  const short = await bashible([
    "once",
    "--root",
    n.root,
    "--bundle",
    file,
    "--kubeconfig",
    n.kubeconfig,
    "--approval-timeout",
    "1",
  ]);
  t.equal(short.status, 1, "waiting is not success");
  t.equal((await annotations(n.name))["update.node.deckhouse.io/disruption-required"], "", "the node asked");
  await t.rejects(readFile(actionsFile, "utf8"), { code: "ENOENT" }, "no reboot without approval");
  const st = JSON.parse((await bashible(["status", "--root", n.root, "--json"])).stdout);
  t.equal(st.lastRun.outcome, "waiting-disruption-approval");
  t.match(st.waiting.for, /disruption approval: reboot/);

  // Approved: the next run reboots (recorded in the sandbox).
  await api.patchNode(admin, n.name, {
    metadata: { annotations: { "update.node.deckhouse.io/disruption-approved": "" } },
  });
  const r = await bashible([
    "once",
    "--root",
    n.root,
    "--bundle",
    file,
    "--kubeconfig",
    n.kubeconfig,
    "--log-format",
    "json",
  ]);
  t.equal(r.status, 0, r.stdout);
  t.match(r.stdout, /update\.node\.deckhouse\.io\/reboot/);
  t.match(await readFile(actionsFile, "utf8"), /reboot/, "the reboot was asked for (recorded in the sandbox)");
  const after = await annotations(n.name);
  t.notOk("update.node.deckhouse.io/reboot" in after, "the reboot annotation is consumed");
  t.notOk(
    "node.deckhouse.io/configuration-checksum" in after,
    "no checksum annotation before the reboot: the run after it writes it (the controller must not uncordon yet)",
  );
});
