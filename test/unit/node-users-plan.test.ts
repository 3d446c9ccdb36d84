// NodeUsers planning over account files alone (no shadow tools, no root): what it would do,
// what it reports as problems, and that a plan never carries the password hash.
import t from "tap";
import { writeFile } from "node:fs/promises";
import path from "node:path";
import { stepEnv } from "../fixtures/steps.ts";
import type { BundleStep, NodeUserSpec } from "../../bundles/types.ts";

const HASH = "$6$plan$hashNeverInPlans";

async function accounts(root: string, extra = ""): Promise<void> {
  const etc = path.join(root, "etc");
  await writeFile(
    path.join(etc, "passwd"),
    `root:x:0:0:root:/root:/bin/bash\nbob:x:1200:100:created by deckhouse:/home/deckhouse/bob:/bin/bash\ncarol:x:1300:1300:Carol:/home/carol:/bin/bash\n${extra}`,
  );
  await writeFile(path.join(etc, "group"), "root:x:0:\nsudo:x:27:\nusers:x:100:\nvideo:x:44:bob\nnodeadmin:x:998:\n");
  await writeFile(path.join(etc, "shadow"), `root:*:1::::::\nbob:${HASH}:1::::::\ncarol:!:1::::::\n`);
  await writeFile(path.join(etc, "sudoers"), "root ALL=(ALL) ALL\n%sudo ALL=(ALL) ALL\n#includedir /etc/sudoers.d\n");
}

const step = (users: NodeUserSpec[]): BundleStep => ({
  name: "000_add_node_users",
  kind: "NodeUsers",
  spec: { users },
});
const u = (o: Partial<NodeUserSpec>): NodeUserSpec => ({
  name: "bob",
  uid: 1200,
  sshPublicKeys: [],
  isSudoer: false,
  extraGroups: [],
  ...o,
});

t.test("a managed user whose groups and password changed: one update, the hash nowhere in the plan", async (t) => {
  const env = await stepEnv(t);
  await accounts(env.root);
  const plan = await env.plan(step([u({ passwordHash: "$6$new$other", extraGroups: [] })]));
  const bob = plan.changes.find((c) => c.kind === "user");
  t.match(bob?.summary, /update user bob: groups video → \(none\); password hash changes/);
  t.notMatch(JSON.stringify(plan), /\$6\$/);
  t.same(plan.problems, []);
});

t.test("removal only of marked users; unmarked ones are never touched", async (t) => {
  const env = await stepEnv(t);
  await accounts(env.root);
  const plan = await env.plan(step([]));
  t.same(
    plan.changes.filter((c) => c.kind === "user").map((c) => c.summary),
    ["remove user bob (uid 1200) and /home/deckhouse/bob"],
  );
});

t.test("root by the back door is a problem: a sudoers group, or a group root owns, without isSudoer", async (t) => {
  const env = await stepEnv(t);
  await accounts(env.root);
  await writeFile(
    path.join(env.root, "etc/group"),
    "root:x:0:\nsudo:x:27:\nusers:x:100:\nops:x:500:\nnodeadmin:x:998:\n",
  );
  await writeFile(
    path.join(env.root, "etc/sudoers"),
    "root ALL=(ALL) ALL\n%ops ALL=(ALL) NOPASSWD: ALL\n#includedir /etc/sudoers.d\n",
  );
  const plan = await env.plan(
    step([u({ name: "eve", uid: 1400, extraGroups: ["ops"] }), u({ name: "root2", uid: 1401, extraGroups: ["sudo"] })]),
  );
  t.match(plan.problems, [
    { subject: "NodeUser eve", message: /extraGroups ops grant root on this node; only isSudoer may do that/ },
    { subject: "NodeUser root2", message: /extraGroups sudo grant root/ },
  ]);
  t.notOk(
    plan.changes.some((c) => c.kind === "user" && c.action === "create"),
    "neither user is created",
  );
  const sudoer = await env.plan(step([u({ name: "eve", uid: 1400, extraGroups: ["ops"], isSudoer: true })]));
  t.same(sudoer.problems, [], "with isSudoer the same groups are fine");
});
