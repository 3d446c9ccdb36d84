// NodeUsers with the real shadow tools (--prefix) on sandbox trees, visudo for the sudoers
// drop-in, and a real kube-apiserver with the NodeUser CRD for status.errors.
import t from "tap";
import { mkdir, readdir, readFile, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import { withControlPlane } from "../../scripts/lib/control-plane-fixture.ts";
import { OS_RELEASE, stepEnv, type StepEnv } from "../fixtures/steps.ts";
import { treeHash } from "../../scripts/lib/bundle.ts";
import { SUDOERS_CONTENT, SUDOERS_DROP_IN } from "../../steps/node-users.ts";
import { NODE_USERS, PATHS } from "../../bundles/paths.ts";
import type { BundleStep, NodeUserSpec } from "../../bundles/types.ts";
import type { KubeClient } from "../../lib/kube/client.ts";
import type { StepStatus } from "../../agent/converge/state.ts";
import { installCrds } from "../../cluster/crds/install.ts";
import { requireRoot } from "../fixtures/root.ts";

await requireRoot("the shadow tools and chown");

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
    [
      "root:x:0:",
      "daemon:x:1:",
      "sudo:x:27:",
      "users:x:100:",
      "docker:x:999:",
      "video:x:44:",
      "carol:x:1200:",
      "",
    ].join("\n"),
  );
  await writeFile(
    path.join(etc, "shadow"),
    ["root:*:19000:0:99999:7:::", "daemon:*:19000:0:99999:7:::", "carol:!:19000:0:99999:7:::", ""].join("\n"),
    { mode: 0o640 },
  );
  await writeFile(
    path.join(etc, "gshadow"),
    ["root:*::", "daemon:*::", "sudo:*::", "users:*::", "docker:*::", "video:*::", "carol:!::", ""].join("\n"),
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
const MARKER = NODE_USERS.marker;

const alice = (over: Partial<NodeUserSpec> = {}): NodeUserSpec => ({
  name: "alice",
  uid: 1100,
  sshPublicKeys: [KEY_1],
  passwordHash: HASH_A,
  isSudoer: true,
  extraGroups: ["video"],
  ...over,
});
const dave: NodeUserSpec = { name: "dave", uid: 1101, sshPublicKeys: [KEY_2], isSudoer: false, extraGroups: [] };

/** Plans (checking the plan changes nothing and carries no hash), then applies as the engine does. */
async function converge(env: StepEnv, users: NodeUserSpec[], kube?: KubeClient) {
  const step = bundleStep(users);
  const o = kube ? { kube } : {};
  const before = await treeHash(env.root);
  const plan = await env.plan(step, o);
  if ((await treeHash(env.root)) !== before) throw new Error("plan changed the tree");
  const json = JSON.stringify(plan);
  for (const u of users)
    if (u.passwordHash && json.includes(u.passwordHash)) throw new Error("plan carries a password hash");
  const status: StepStatus = await env.apply(step, o);
  return { plan, changes: plan.changes, status };
}

const read = (env: StepEnv, p: string) => readFile(path.join(env.root, p), "utf8");
const line = async (env: StepEnv, file: string, name: string) =>
  (await read(env, file)).split("\n").find((l) => l.startsWith(`${name}:`));

const SUDOERS_CONTENT_LEN = Buffer.byteLength(SUDOERS_CONTENT);

for (const osName of ["debian", "rocky"] as const) {
  t.test(`${osName}: creates users with keys, groups, sudo and password; a second run plans nothing`, async (t) => {
    const env = await stepEnv(t, OS_RELEASE[osName]);
    await seedAccounts(env);
    const { changes, status } = await converge(env, [alice(), dave]);
    t.same(
      changes.map((c) => c.summary),
      [
        "create group nodeadmin",
        "create /etc/sudoers.d (0750, 0:0)",
        `create ${SUDOERS_DROP_IN} (0440, ${SUDOERS_CONTENT_LEN} bytes)`,
        "add '#includedir /etc/sudoers.d' to /etc/sudoers",
        "create /home/deckhouse (0755, 0:0)",
        "create user alice (uid 1100, home /home/deckhouse/alice, groups nodeadmin,video, password hash set)",
        "create /home/deckhouse/alice/.ssh (0700, 1100:100)",
        `create /home/deckhouse/alice/.ssh/authorized_keys (0600, ${KEY_1.length + 1} bytes)`,
        "create user dave (uid 1101, home /home/deckhouse/dave)",
        "create /home/deckhouse/dave/.ssh (0700, 1101:100)",
        `create /home/deckhouse/dave/.ssh/authorized_keys (0600, ${KEY_2.length + 1} bytes)`,
      ],
    );
    t.equal(status.outcome, "changed");
    t.notOk(status.problems, "no problems");
    t.equal(await line(env, "etc/passwd", "alice"), `alice:x:1100:100:${MARKER}:/home/deckhouse/alice:/bin/bash`);
    t.equal((await line(env, "etc/shadow", "alice"))?.split(":")[1], HASH_A);
    t.equal((await line(env, "etc/shadow", "dave"))?.split(":")[1], "*", "no hash: no password login");
    t.match(await line(env, "etc/group", "nodeadmin"), /^nodeadmin:x:\d+:alice$/);
    t.equal(await line(env, "etc/group", "video"), "video:x:44:alice");
    const keys = path.join(env.root, "home/deckhouse/alice/.ssh/authorized_keys");
    t.equal(await readFile(keys, "utf8"), `${KEY_1}\n`);
    const ks = await stat(keys);
    t.same([ks.mode & 0o7777, ks.uid, ks.gid], [0o600, 1100, 100]);
    const ds = await stat(path.dirname(keys));
    t.same([ds.mode & 0o7777, ds.uid], [0o700, 1100]);
    t.equal(await read(env, SUDOERS_DROP_IN.slice(1)), SUDOERS_CONTENT);
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
    t.same((await env.plan(bundleStep([alice(), dave]))).changes, [], "a second run plans nothing");
  });
}

t.test("updates keys, groups and password of a managed user; the hash never shows", async (t) => {
  const env = await stepEnv(t);
  await seedAccounts(env);
  await converge(env, [alice()]);
  const keysFile = path.join(env.root, "home/deckhouse/alice/.ssh/authorized_keys");
  const mtime = (await stat(keysFile)).mtimeMs;
  await converge(env, [alice()]);
  t.equal((await stat(keysFile)).mtimeMs, mtime, "authorized_keys is not rewritten without a change");

  const next = alice({ sshPublicKeys: [KEY_1, KEY_2], isSudoer: false, passwordHash: HASH_B });
  const { changes, status } = await converge(env, [next]);
  t.same(
    changes.map((c) => c.summary),
    [
      "update user alice: groups nodeadmin,video → video; password hash changes",
      "update /home/deckhouse/alice/.ssh/authorized_keys: content",
    ],
  );
  t.notMatch(JSON.stringify(changes), /\$6\$|\$y\$/, "no hash in the plan");
  t.equal(status.outcome, "changed");
  t.equal(await readFile(keysFile, "utf8"), `${KEY_1}\n${KEY_2}\n`);
  t.equal((await line(env, "etc/shadow", "alice"))?.split(":")[1], HASH_B);
  t.match(await line(env, "etc/group", "nodeadmin"), /^nodeadmin:x:\d+:$/);
  const log = await read(env, "var/log/d8/bashible/step.000_add_node_users.log").catch(() => "");
  t.notOk(log.includes(HASH_A) || log.includes(HASH_B), "no hash in the step log");
  t.same((await env.plan(bundleStep([next]))).changes, []);
});

// useradd commits passwd and shadow, then makes the home as root (mkdir 0, chown 0:0, chmod
// 0755) and only then chowns it to the user: `strace -e inject=chown:signal=KILL:when=2 useradd
// …` leaves exactly an existing account with an empty root:root 0755 home. The same useradd the
// agent runs, with the home put back as that kill leaves it, stands in for the kill here.
t.test("a home an interrupted useradd left to root is given to the user; then nothing is planned", async (t) => {
  const env = await stepEnv(t);
  await seedAccounts(env);
  await mkdir(path.join(env.root, "home/deckhouse"), { mode: 0o755 });
  const { execFile } = await import("node:child_process");
  const { promisify } = await import("node:util");
  const home = path.join(env.root, "home/deckhouse/dave");
  await promisify(execFile)("useradd", [
    "--prefix",
    env.root,
    "--uid",
    "1101",
    "--gid",
    "100",
    "--home-dir",
    "/home/deckhouse/dave",
    "--create-home",
    "--shell",
    "/bin/bash",
    "--comment",
    MARKER,
    "dave",
  ]);
  const { chown, chmod, rm } = await import("node:fs/promises");
  await rm(home, { recursive: true });
  await mkdir(home);
  await chown(home, 0, 0);
  await chmod(home, 0o755);
  const { changes, status } = await converge(env, [dave]);
  t.ok(
    changes.some((c) => /^give \/home\/deckhouse\/dave to dave \(1101:100, 0755; was 0755 0:0/.test(c.summary)),
    changes.map((c) => c.summary).join("\n"),
  );
  t.equal(status.outcome, "changed");
  const st = await stat(home);
  t.same([st.uid, st.gid, st.mode & 0o7777], [1101, 100, 0o755], "the home is dave's");
  t.same((await env.plan(bundleStep([dave]))).changes, [], "and the next run plans nothing");

  // Killed before the chmod (mode 0), and a run that never got to add the account: useradd
  // keeps the existing home as it is, so the repair follows it.
  await chown(home, 0, 0);
  await chmod(home, 0);
  const again = await converge(env, [dave]);
  t.ok(again.changes.some((c) => c.summary.startsWith("give /home/deckhouse/dave to dave (1101:100, 0700")));
  t.same(((await stat(home)).mode & 0o7777).toString(8), "700");
  const erin: NodeUserSpec = { ...dave, name: "erin", uid: 1102 };
  const erinHome = path.join(env.root, "home/deckhouse/erin");
  await mkdir(erinHome, { mode: 0o755 });
  const created = await converge(env, [dave, erin]);
  t.notOk(created.status.problems, "no problems");
  t.same([(await stat(erinHome)).uid, (await stat(erinHome)).gid], [1102, 100]);
  t.same((await env.plan(bundleStep([dave, erin]))).changes, []);
});

t.test("a user no longer listed is removed with its home; processes are not killed in a sandbox", async (t) => {
  const env = await stepEnv(t);
  await seedAccounts(env);
  await converge(env, [alice(), dave]);
  const { changes, status } = await converge(env, [dave]);
  t.same(
    changes.map((c) => c.summary),
    ["remove user alice (uid 1100) and /home/deckhouse/alice"],
  );
  t.equal(status.outcome, "changed");
  t.notOk(await line(env, "etc/passwd", "alice"));
  t.notOk(await line(env, "etc/shadow", "alice"));
  t.match(await line(env, "etc/group", "nodeadmin"), /^nodeadmin:x:\d+:$/);
  await t.rejects(stat(path.join(env.root, "home/deckhouse/alice")), { code: "ENOENT" });
  t.ok(await line(env, "etc/passwd", "carol"), "an unmarked user is never removed");
  t.same((await env.plan(bundleStep([dave]))).changes, []);
  // Nothing was recorded as a real-machine action and nothing was killed.
  await t.rejects(readFile(path.join(env.root, PATHS.sandboxActions)), { code: "ENOENT" });
});

t.test("clashes and bad specs are problems per user, not changes; the others converge", async (t) => {
  const env = await stepEnv(t);
  await seedAccounts(env);
  const users: NodeUserSpec[] = [
    alice({ name: "carol", uid: 1200 }), // the name of an unmarked user
    alice({ name: "erin", uid: 1200 }), // the uid of an unmarked user
    alice({ name: "frank", uid: 999 }), // a system uid
    alice({ name: "gina", uid: 1300, extraGroups: ["nosuchgroup"] }),
    alice({ name: "ivan", uid: 1301, isSudoer: false, extraGroups: ["sudo"] }), // root without isSudoer
    dave,
  ];
  const { plan, status } = await converge(env, users);
  t.match(
    plan.problems.map((p) => `${p.subject}: ${p.message}`),
    [
      /NodeUser carol: a user 'carol' not created by deckhouse exists \(GECOS 'Carol,,,'\); it is left alone/,
      /NodeUser erin: uid 1200 belongs to unmanaged user 'carol'/,
      /NodeUser frank: uid 999 refused/,
      /NodeUser gina: extraGroups nosuchgroup do not exist on this node/,
      /NodeUser ivan: extraGroups sudo grant root on this node; only isSudoer may do that/,
    ],
  );
  t.notOk(
    plan.changes.some((c) => /carol|erin|frank|gina|ivan/.test(c.summary)),
    "a problem is never dressed as a change",
  );
  t.equal(status.problems?.length, 5, "the run records the problems");
  t.notMatch(JSON.stringify(status), /\$6\$/, "no hash in the problems");
  t.equal(await line(env, "etc/passwd", "carol"), "carol:x:1200:1200:Carol,,,:/home/carol:/bin/bash");
  t.equal((await line(env, "etc/shadow", "carol"))?.split(":")[1], "!", "the foreign user's password is untouched");
  t.ok(await line(env, "etc/passwd", "dave"));
  t.same((await env.plan(bundleStep(users))).changes, [], "with only problems left, the node plans nothing");
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
  const hank: NodeUserSpec = { ...dave, name: "hank", uid: 1400, extraGroups: ["audio"] };
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
  await converge(env, [hank, dave], cp.admin);
  t.same(await errors("hank"), { "node-1": "extraGroups audio do not exist on this node" });
  t.same(await errors("dave"), {});
  t.ok(await line(env, "etc/passwd", "dave"));

  await writeFile(path.join(env.root, "etc/group"), `${await read(env, "etc/group")}audio:x:29:\n`);
  await converge(env, [hank, dave], cp.admin);
  t.ok(await line(env, "etc/passwd", "hank"));
  t.same(await errors("hank"), {}, "cleared on success");
});

t.test("a sudoers drop-in that visudo refuses is not installed", async (t) => {
  const env = await stepEnv(t);
  await seedAccounts(env);
  const { applyPrimitive } = await import("../../host/primitives.ts");
  const { hostFlags } = await import("../../host/flags.ts");
  const { changes } = await env.plan(bundleStep([]));
  const dropIn = changes.find((c) => c.kind === "file" && c.path === SUDOERS_DROP_IN);
  if (dropIn?.kind !== "file") throw new Error("no drop-in planned");
  await env.host.mkdir("/etc/sudoers.d", { mode: 0o750 });
  await t.rejects(
    applyPrimitive(
      env.host,
      { ...dropIn, content: "%nodeadmin ALL=(ALL) ALL garbage(\n" },
      { secrets: [], flags: hostFlags(env.host) },
    ),
    /visudo/,
  );
  await t.rejects(stat(path.join(env.root, SUDOERS_DROP_IN)), { code: "ENOENT" });
  t.same(await readdir(path.join(env.root, "etc/sudoers.d")), [], "no candidate left behind");
});
