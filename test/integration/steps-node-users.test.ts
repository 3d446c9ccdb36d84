// NodeUsers with the real shadow tools (--prefix) on sandbox trees, visudo for the sudoers
// drop-in, and a real kube-apiserver with the NodeUser CRD for status.errors.
import t from "tap";
import { mkdir, readFile, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import { withControlPlane } from "../fixtures/control-plane.ts";
import { OS_RELEASE, stepEnv, type StepEnv } from "../fixtures/steps.ts";
import { treeHash } from "../fixtures/bundle.ts";
import step, { MARKER, SUDOERS_DROP_IN } from "../../steps/node-users.ts";
import type { BundleStep, NodeUserSpec } from "../../bundles/types.ts";
import type { KubeClient } from "../../lib/kube/client.ts";
import { SANDBOX_ACTIONS_LOG } from "../../agent/host/host.ts";
import { installCrds } from "../../cluster/crds/install.ts";

const HASH_A = "$6$saltsaltsalt$6b5dVkQ0yJm8m1y0hN0Q3vHb2vQ0Yb2Q0vHb2vQ0Yb2Q0vHb2vQ0Yb2Q0vHb2vQ0Yb2Q0vHb2vQ0Yb2Q0v";
const HASH_B = "$y$j9T$sEcReTsAlT$Zx1Zx1Zx1Zx1Zx1Zx1Zx1Zx1Zx1Zx1Zx1Zx1Zx1Zx1";
const KEY_1 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKey1 alice@laptop";
const KEY_2 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKey2 alice@desk";

/** A minimal account database, with a foreign (unmarked) user and a sudoers lacking includedir. */
async function seedAccounts(env: StepEnv): Promise<void> {
  const etc = path.join(env.root, "etc");
  await writeFile(
    path.join(etc, "passwd"),
    [
      "root:x:0:0:root:/root:/bin/bash",
      "daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin",
      "carol:x:1200:1200:Carol,,,:/home/carol:/bin/bash",
      "",
    ].join("\n"),
  );
  await writeFile(
    path.join(etc, "group"),
    ["root:x:0:", "daemon:x:1:", "sudo:x:27:", "users:x:100:", "docker:x:999:", "carol:x:1200:", ""].join("\n"),
  );
  await writeFile(
    path.join(etc, "shadow"),
    ["root:*:19000:0:99999:7:::", "daemon:*:19000:0:99999:7:::", "carol:!:19000:0:99999:7:::", ""].join("\n"),
    { mode: 0o640 },
  );
  await writeFile(
    path.join(etc, "gshadow"),
    ["root:*::", "daemon:*::", "sudo:*::", "users:*::", "docker:*::", "carol:!::", ""].join("\n"),
    { mode: 0o640 },
  );
  await writeFile(path.join(etc, "sudoers"), "Defaults env_reset\nroot ALL=(ALL:ALL) ALL\n", { mode: 0o440 });
  await mkdir(path.join(env.root, "home"), { recursive: true });
}

const bundleStep = (users: NodeUserSpec[]): BundleStep => ({
  name: "000_add_node_users",
  kind: "NodeUsers",
  spec: { users },
});

const alice = (over: Partial<NodeUserSpec> = {}): NodeUserSpec => ({
  name: "alice",
  uid: 1100,
  sshPublicKeys: [KEY_1],
  passwordHash: HASH_A,
  isSudoer: true,
  extraGroups: ["docker"],
  ...over,
});
const dave: NodeUserSpec = { name: "dave", uid: 1101, sshPublicKeys: [KEY_2], isSudoer: false, extraGroups: [] };

async function converge(env: StepEnv, users: NodeUserSpec[], kube?: KubeClient) {
  const ctx = env.ctx(bundleStep(users), kube ? { kube } : {});
  const before = await treeHash(env.root);
  const changes = await step.plan({ users }, env.host, ctx);
  if ((await treeHash(env.root)) !== before) throw new Error("plan changed the tree");
  const json = JSON.stringify(changes);
  for (const u of users)
    if (u.passwordHash && json.includes(u.passwordHash)) throw new Error("plan carries a password hash");
  const result = await step.apply(changes, { users }, env.host, ctx);
  return { changes, result };
}

const read = (env: StepEnv, p: string) => readFile(path.join(env.root, p), "utf8");
const line = async (env: StepEnv, file: string, name: string) =>
  (await read(env, file)).split("\n").find((l) => l.startsWith(`${name}:`));

for (const osName of ["debian", "rocky"] as const) {
  t.test(`${osName}: creates users with keys, groups, sudo and password; a second run plans nothing`, async (t) => {
    const env = await stepEnv(t, OS_RELEASE[osName]);
    await seedAccounts(env);
    const { changes, result } = await converge(env, [alice(), dave]);
    t.same(
      changes.map((c) => c.summary),
      [
        "create group nodeadmin",
        `create ${SUDOERS_DROP_IN} (0440, ${SUDOERS_CONTENT_LEN} bytes)`,
        "add '#includedir /etc/sudoers.d' to /etc/sudoers",
        "create user alice (uid 1100, home /home/deckhouse/alice, groups docker,nodeadmin, password hash set)",
        "create /home/deckhouse/alice/.ssh (0700, 1100:100)",
        `create /home/deckhouse/alice/.ssh/authorized_keys (0600, ${KEY_1.length + 1} bytes)`,
        "create user dave (uid 1101, home /home/deckhouse/dave)",
        "create /home/deckhouse/dave/.ssh (0700, 1101:100)",
        `create /home/deckhouse/dave/.ssh/authorized_keys (0600, ${KEY_2.length + 1} bytes)`,
      ],
    );
    t.same(result?.outputs, { created: ["alice", "dave"], updated: [], removed: [], failed: [] });
    t.notOk(result?.warnings);
    t.equal(await line(env, "etc/passwd", "alice"), `alice:x:1100:100:${MARKER}:/home/deckhouse/alice:/bin/bash`);
    t.equal((await line(env, "etc/shadow", "alice"))?.split(":")[1], HASH_A);
    t.equal((await line(env, "etc/shadow", "dave"))?.split(":")[1], "*", "no hash: no password login");
    t.match(await line(env, "etc/group", "nodeadmin"), /^nodeadmin:x:\d+:alice$/);
    t.equal(await line(env, "etc/group", "docker"), "docker:x:999:alice");
    const keys = path.join(env.root, "home/deckhouse/alice/.ssh/authorized_keys");
    t.equal(await readFile(keys, "utf8"), `${KEY_1}\n`);
    const ks = await stat(keys);
    t.same([ks.mode & 0o7777, ks.uid, ks.gid], [0o600, 1100, 100]);
    const ds = await stat(path.dirname(keys));
    t.same([ds.mode & 0o7777, ds.uid], [0o700, 1100]);
    t.equal(
      await read(env, SUDOERS_DROP_IN.slice(1)),
      "# Managed by bashible (NodeUsers step): NodeUsers with isSudoer.\n%nodeadmin ALL=(ALL) ALL\n",
    );
    t.equal((await stat(path.join(env.root, SUDOERS_DROP_IN))).mode & 0o7777, 0o440);
    t.match(
      await read(env, "etc/sudoers"),
      /^Defaults env_reset\nroot ALL=\(ALL:ALL\) ALL\n#includedir \/etc\/sudoers.d\n$/,
    );
    t.equal(
      await line(env, "etc/passwd", "carol"),
      "carol:x:1200:1200:Carol,,,:/home/carol:/bin/bash",
      "foreign user untouched",
    );
    const again = await step.plan({ users: [alice(), dave] }, env.host, env.ctx(bundleStep([])));
    t.same(again, [], "a second run plans nothing");
  });
}

const SUDOERS_CONTENT_LEN = Buffer.byteLength(
  "# Managed by bashible (NodeUsers step): NodeUsers with isSudoer.\n%nodeadmin ALL=(ALL) ALL\n",
);

t.test("updates keys, groups and password of a managed user; the hash never shows", async (t) => {
  const env = await stepEnv(t);
  await seedAccounts(env);
  await converge(env, [alice()]);
  const keysFile = path.join(env.root, "home/deckhouse/alice/.ssh/authorized_keys");
  const mtime = (await stat(keysFile)).mtimeMs;
  await converge(env, [alice()]);
  t.equal((await stat(keysFile)).mtimeMs, mtime, "authorized_keys is not rewritten without a change");

  const next = alice({ sshPublicKeys: [KEY_1, KEY_2], isSudoer: false, passwordHash: HASH_B });
  const { changes, result } = await converge(env, [next]);
  t.same(
    changes.map((c) => c.summary),
    [
      "update user alice: groups docker,nodeadmin → docker; password hash changes",
      "update /home/deckhouse/alice/.ssh/authorized_keys: content",
    ],
  );
  t.notMatch(JSON.stringify(changes), /\$6\$|\$y\$/, "no hash in the plan");
  t.same(result?.outputs, { created: [], updated: ["alice"], removed: [], failed: [] });
  t.equal(await readFile(keysFile, "utf8"), `${KEY_1}\n${KEY_2}\n`);
  t.equal((await line(env, "etc/shadow", "alice"))?.split(":")[1], HASH_B);
  t.match(await line(env, "etc/group", "nodeadmin"), /^nodeadmin:x:\d+:$/);
  const log = await read(env, "var/log/d8/bashible/step.000_add_node_users.log").catch(() => "");
  t.notOk(log.includes(HASH_A) || log.includes(HASH_B), "no hash in the step log");
  t.same(await step.plan({ users: [next] }, env.host, env.ctx(bundleStep([]))), []);
});

t.test("a user no longer listed is removed with its home; processes are not killed in a sandbox", async (t) => {
  const env = await stepEnv(t);
  await seedAccounts(env);
  await converge(env, [alice(), dave]);
  const { changes, result } = await converge(env, [dave]);
  t.same(
    changes.map((c) => c.summary),
    ["remove user alice (uid 1100) and /home/deckhouse/alice"],
  );
  t.same(result?.outputs, { created: [], updated: [], removed: ["alice"], failed: [] });
  t.notOk(await line(env, "etc/passwd", "alice"));
  t.notOk(await line(env, "etc/shadow", "alice"));
  t.match(await line(env, "etc/group", "nodeadmin"), /^nodeadmin:x:\d+:$/);
  await t.rejects(stat(path.join(env.root, "home/deckhouse/alice")), { code: "ENOENT" });
  t.ok(await line(env, "etc/passwd", "carol"), "an unmarked user is never removed");
  t.same(await step.plan({ users: [dave] }, env.host, env.ctx(bundleStep([]))), []);
  // Nothing was recorded as a real-machine action and nothing was killed.
  await t.rejects(readFile(path.join(env.root, SANDBOX_ACTIONS_LOG)), { code: "ENOENT" });
});

t.test("clashes and bad specs are reported per user while the others converge", async (t) => {
  const env = await stepEnv(t);
  await seedAccounts(env);
  const users: NodeUserSpec[] = [
    alice({ name: "carol", uid: 1200 }), // the name of an unmarked user
    alice({ name: "erin", uid: 1200 }), // the uid of an unmarked user
    alice({ name: "frank", uid: 999 }), // a system uid
    alice({ name: "gina", uid: 1300, extraGroups: ["nosuchgroup"] }),
    dave,
  ];
  const { changes, result } = await converge(env, users);
  t.same(result?.outputs, { created: ["dave"], updated: [], removed: [], failed: ["carol", "erin", "frank", "gina"] });
  t.match(result?.warnings, [
    /NodeUser carol: a user 'carol' not created by deckhouse exists \(GECOS 'Carol,,,'\); it is left alone/,
    /NodeUser erin: uid 1200 belongs to unmanaged user 'carol'/,
    /NodeUser frank: uid 999 refused/,
    /NodeUser gina: extraGroups nosuchgroup do not exist on this node/,
  ]);
  t.notMatch(JSON.stringify(result), /\$6\$/, "no hash in warnings");
  t.equal(changes.filter((c) => /reported, nothing changed/.test(c.summary)).length, 4);
  t.equal(await line(env, "etc/passwd", "carol"), "carol:x:1200:1200:Carol,,,:/home/carol:/bin/bash");
  t.equal((await line(env, "etc/shadow", "carol"))?.split(":")[1], "!", "the foreign user's password is untouched");
  t.ok(await line(env, "etc/passwd", "dave"));
});

t.test("NodeUser status.errors: set for a failing user, cleared once it converges", async (t) => {
  const cp = await withControlPlane(t);
  await installCrds(cp.admin);
  const create = (u: NodeUserSpec) =>
    cp.admin.request("POST", "/apis/deckhouse.io/v1/nodeusers", {
      body: {
        apiVersion: "deckhouse.io/v1",
        kind: "NodeUser",
        metadata: { name: u.name },
        spec: { uid: u.uid, sshPublicKeys: u.sshPublicKeys, isSudoer: u.isSudoer, extraGroups: u.extraGroups },
      },
    });
  const hank: NodeUserSpec = { ...dave, name: "hank", uid: 1400, extraGroups: ["wheel"] };
  await create(hank);
  await create(dave);
  const errors = async (name: string) =>
    (
      await cp.admin.request<{ status?: { errors?: Record<string, string> } }>(
        "GET",
        `/apis/deckhouse.io/v1/nodeusers/${name}`,
      )
    ).status?.errors ?? {};

  const env = await stepEnv(t);
  await seedAccounts(env);
  const r1 = await converge(env, [hank, dave], cp.admin);
  t.same(r1.result?.outputs, { created: ["dave"], updated: [], removed: [], failed: ["hank"] });
  t.same(await errors("hank"), { "node-1": "extraGroups wheel do not exist on this node" });
  t.same(await errors("dave"), {});

  await writeFile(path.join(env.root, "etc/group"), `${await read(env, "etc/group")}wheel:x:10:\n`);
  const r2 = await converge(env, [hank, dave], cp.admin);
  t.same(r2.result?.outputs, { created: ["hank"], updated: [], removed: [], failed: [] });
  t.same(await errors("hank"), {}, "cleared on success");
});

t.test("a sudoers drop-in that visudo refuses is not installed", async (t) => {
  const env = await stepEnv(t);
  await seedAccounts(env);
  const ctx = env.ctx(bundleStep([]));
  const changes = await step.plan({ users: [] }, env.host, ctx);
  const bad = changes.map((c) =>
    c.kind === "file" && c.path === SUDOERS_DROP_IN ? { ...c, content: "%nodeadmin ALL=(ALL) ALL garbage(\n" } : c,
  );
  await t.rejects(step.apply(bad, { users: [] }, env.host, ctx), /visudo refuses the new content, not installed/);
  await t.rejects(stat(path.join(env.root, SUDOERS_DROP_IN)), { code: "ENOENT" });
});
