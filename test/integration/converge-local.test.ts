// The converge runtime in a sandbox root with a bundle file: plan, once, status, retries,
// bad bundles, the lock, forced runs and the daemon. No cluster needed.
import t from "tap";
import { readFile, rm, writeFile, mkdir, readdir } from "node:fs/promises";
import path from "node:path";
import { bashible, bashibleDaemon, waitFor } from "../../scripts/lib/cli.ts";
import { makeBundle, sandbox, script, treeHash, writeBundle } from "../../scripts/lib/bundle.ts";
import { requireRoot } from "../fixtures/root.ts";

await requireRoot("the agent sets root ownership on what it writes");

const hello = (text: string) =>
  script(
    "050_hello",
    `mkdir -p "$BASHIBLE_ROOT/etc/hello"\necho "${text} $NODE_NAME" > "$BASHIBLE_ROOT/etc/hello/greeting"\necho ran >> "$BASHIBLE_ROOT/runs"`,
  );

async function runs(root: string): Promise<number> {
  return ((await readFile(path.join(root, "runs"), "utf8").catch(() => "")).match(/ran/g) ?? []).length;
}

t.test("plan shows pending work and changes nothing; once applies; then both are quiet", async (t) => {
  const root = await sandbox();
  const file = await writeBundle(root, makeBundle([hello("hi")]), "../b-" + path.basename(root) + ".json");
  const before = await treeHash(root);
  const p = await bashible(["plan", "--root", root, "--bundle", file]);
  t.equal(p.status, 2, "exit 2: changes pending");
  t.match(p.stdout, /~ 050_hello \(Script\): 1 change/);
  t.match(p.stdout, /never ran successfully/);
  t.equal(await treeHash(root), before, "plan wrote nothing, not even state files");

  const once = await bashible(["once", "--root", root, "--bundle", file, "--log-format", "json"]);
  t.equal(once.status, 0, once.stderr);
  t.equal(await readFile(path.join(root, "etc/hello/greeting"), "utf8"), "hi node-1\n");
  const lines = once.stdout
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l));
  t.ok(
    lines.some((l) => l.msg === "converge finished"),
    "JSON log lines on stdout",
  );

  const again = await bashible(["plan", "--root", root, "--bundle", file]);
  t.equal(again.status, 0, "a converged node plans nothing");
  t.match(again.stdout, /0 of 1 steps would change the node/);
  t.match(again.stdout, /gate: in sync/);
  await bashible(["once", "--root", root, "--bundle", file]);
  t.equal(await runs(root), 1, "a second once runs nothing");

  const status = await bashible(["status", "--root", root, "--json"]);
  const st = JSON.parse(status.stdout);
  t.equal(st.configurationChecksum, st.appliedChecksum);
  t.equal(st.lastRun.outcome, "in-sync");
  t.equal(st.steps[0].outcome, "changed");
});

t.test("removing configuration_checksum forces a full run", async (t) => {
  const root = await sandbox();
  const file = await writeBundle(root, makeBundle([hello("hi")]), "../b-" + path.basename(root) + ".json");
  await bashible(["once", "--root", root, "--bundle", file]);
  await rm(path.join(root, "var/lib/bashible/configuration_checksum"));
  const p = await bashible(["plan", "--root", root, "--bundle", file]);
  t.equal(p.status, 2);
  t.match(p.stdout, /full run forced/);
  await bashible(["once", "--root", root, "--bundle", file]);
  t.equal(await runs(root), 2);
});

t.test("a failing step is retried, then stops the run and is reported", async (t) => {
  const root = await sandbox();
  const b = makeBundle([
    hello("hi"),
    script("060_flaky", `echo "trying with token $TOKEN_NOT_SET"; echo attempt >> "$BASHIBLE_ROOT/attempts"; exit 7`),
    script("070_after", `touch "$BASHIBLE_ROOT/after"`),
  ]);
  const file = await writeBundle(root, b, "../b-" + path.basename(root) + ".json");
  const r = await bashible([
    "once",
    "--root",
    root,
    "--bundle",
    file,
    "--retry-interval",
    "0.05",
    "--max-retries",
    "4",
  ]);
  t.equal(r.status, 1);
  t.equal((await readFile(path.join(root, "attempts"), "utf8")).trim().split("\n").length, 4, "four attempts");
  t.rejects(readFile(path.join(root, "after")), "later steps did not run");
  const log = await readFile(path.join(root, "var/log/d8/bashible/step.060_flaky.log"), "utf8");
  t.match(log, /attempt 4 failed: command failed \(exit 7\)/);
  const st = JSON.parse((await bashible(["status", "--root", root, "--json"])).stdout);
  t.equal(st.failedChecksum, b.checksum);
  t.equal(st.failureCount, 1);
  t.notOk(st.configurationChecksum, "nothing applied");
  t.same(
    st.steps.map((s: { outcome: string }) => s.outcome),
    ["changed", "failed", "not-run"],
  );
  await bashible(["once", "--root", root, "--bundle", file, "--retry-interval", "0", "--max-retries", "1"]);
  const st2 = JSON.parse((await bashible(["status", "--root", root, "--json"])).stdout);
  t.equal(st2.failureCount, 2, "failures of the same checksum are counted");
  const human = await bashible(["status", "--root", root]);
  t.equal(human.status, 1);
  t.match(human.stdout, /failed checksum: .* \(2 failed runs in a row\)/);
});

t.test("bad bundles are rejected with a clear error and the last good one stays", async (t) => {
  const root = await sandbox();
  const good = makeBundle([hello("good")]);
  const file = path.join(path.dirname(root), `b-${path.basename(root)}.json`);
  await writeFile(file, JSON.stringify(good));
  t.equal((await bashible(["once", "--root", root, "--bundle", file])).status, 0);

  const tampered = { ...makeBundle([hello("evil")]), checksum: good.checksum };
  const unknownKind = makeBundle([{ name: "080_x", kind: "Teleport", spec: {} } as never]);
  const cases: [string, string, RegExp][] = [
    ["not JSON", "this is not json", /not JSON/],
    ["truncated", JSON.stringify(good).slice(0, 200), /not JSON \(truncated\?\)/],
    ["checksum mismatch", JSON.stringify(tampered), /checksum mismatch/],
    ["unknown step kind", JSON.stringify(unknownKind), /unknown kind 'Teleport'/],
    ["too large", JSON.stringify({ ...good, pad: "x".repeat(9 * 1024 * 1024) }), /larger than the \d+-byte limit/],
  ];
  for (const [what, content, msg] of cases) {
    await writeFile(file, content);
    const r = await bashible(["once", "--root", root, "--bundle", file, "--log-format", "json"]);
    t.equal(r.status, 1, `${what}: once fails: the bundle asked for was not applied`);
    t.match(r.stdout, msg, `${what}: says why`);
    t.match(
      r.stdout,
      new RegExp(
        `keeping the last good bundle.*${good.checksum.slice(0, 12)}|${good.checksum.slice(0, 12)}.*keeping the last good bundle`,
      ),
      `${what}: says which bundle is kept`,
    );
    t.equal((await readFile(path.join(root, "var/lib/bashible/configuration_checksum"), "utf8")).trim(), good.checksum);
    t.equal(await readFile(path.join(root, "etc/hello/greeting"), "utf8"), "good node-1\n", `${what}: nothing applied`);
    const st = JSON.parse((await bashible(["status", "--root", root, "--json"])).stdout);
    t.match(st.fetchError.message, msg, `${what}: status shows it`);
  }
  const p = await bashible(["plan", "--root", root, "--bundle", file]);
  t.match(p.stdout, /fetch failed, planned against the last good bundle/);
  t.equal(p.status, 1, "plan cannot say 'in sync' without the current bundle");
});

t.test("the last 10 applied bundles are kept", async (t) => {
  const root = await sandbox();
  const file = path.join(path.dirname(root), `b-${path.basename(root)}.json`);
  for (let i = 0; i < 12; i++) {
    await writeFile(file, JSON.stringify(makeBundle([hello(`v${i}`)])));
    t.equal((await bashible(["once", "--root", root, "--bundle", file])).status, 0);
  }
  const kept = await readdir(path.join(root, "var/lib/bashible/bundles"));
  t.equal(kept.length, 10);
});

t.test("one converge at a time; a stale lock from a killed run is taken over", async (t) => {
  const root = await sandbox();
  const b = makeBundle([script("050_slow", `sleep 2; touch "$BASHIBLE_ROOT/slow-done"`)]);
  const file = await writeBundle(root, b, "../b-" + path.basename(root) + ".json");
  const first = bashible(["once", "--root", root, "--bundle", file]);
  await waitFor("the lock", () =>
    readFile(path.join(root, "run/bashible/converge.lock"), "utf8").catch(() => undefined),
  );
  const second = await bashible(["once", "--root", root, "--bundle", file]);
  t.equal(second.status, 1);
  t.match(second.stdout + second.stderr, /another converge holds/);
  t.equal((await first).status, 0);

  await mkdir(path.join(root, "run/bashible"), { recursive: true });
  await writeFile(path.join(root, "run/bashible/converge.lock"), "999999 1\n");
  await rm(path.join(root, "var/lib/bashible/configuration_checksum"));
  t.equal((await bashible(["once", "--root", root, "--bundle", file])).status, 0, "stale lock ignored");
});

t.test("scripts see Deckhouse's environment and ours", async (t) => {
  const root = await sandbox("ID=rocky\nVERSION_ID=9.4\n", "node-env");
  const b = makeBundle([
    script(
      "050_env",
      `env | grep -E '^(NODE_NAME|NODE_GROUP|D8_NODE_HOSTNAME|FIRST_BASHIBLE_RUN|BOOTSTRAP_DIR|TMPDIR|HOME|LANG|LC_NUMERIC|PATH|BUNDLE|BASHIBLE_ROOT|BASHIBLE_STEP|BASHIBLE_FIRST_RUN|KUBERNETES_VERSION)=' | sort > "$BASHIBLE_ROOT/env"`,
    ),
  ]);
  const file = await writeBundle(root, b, "../b-" + path.basename(root) + ".json");
  t.equal((await bashible(["once", "--root", root, "--bundle", file])).status, 0);
  const env = await readFile(path.join(root, "env"), "utf8");
  t.match(env, /BUNDLE=centos/, "Deckhouse's bundle name for Rocky");
  t.match(env, /NODE_NAME=node-env/);
  t.match(env, /D8_NODE_HOSTNAME=node-env/);
  t.match(env, /NODE_GROUP=worker/);
  t.match(env, /FIRST_BASHIBLE_RUN=no/);
  t.match(env, new RegExp(`BOOTSTRAP_DIR=${root}/var/lib/bashible`));
  t.match(env, new RegExp(`HOME=${root}/var/lib/bashible`));
  t.match(env, new RegExp(`TMPDIR=${root}/opt/deckhouse/tmp`));
  t.match(env, /LANG=C\n/);
  t.match(env, /LC_NUMERIC=C/);
  t.match(env, new RegExp(`PATH=${root}/opt/deckhouse/bin:.*/usr/local/bin`));
  t.match(env, new RegExp(`BASHIBLE_ROOT=${root}`));
  t.match(env, /BASHIBLE_STEP=050_env/);
  t.match(env, /BASHIBLE_FIRST_RUN=false/);
});

t.test("scripts are sourced from a file, as Deckhouse runs them", async (t) => {
  const root = await sandbox();
  const b = makeBundle([
    // A command reading stdin gets end-of-file, not the rest of the script.
    script("050_stdin", `cat > "$BASHIBLE_ROOT/read"\necho after > "$BASHIBLE_ROOT/after"\n`),
    // A top-level return ends the step successfully.
    script("051_return", `echo before > "$BASHIBLE_ROOT/before"\nreturn 0\necho never > "$BASHIBLE_ROOT/never"\n`),
    // -e and pipefail: a failing pipeline fails the step.
    script("052_pipefail", `false | true\necho unreachable > "$BASHIBLE_ROOT/unreachable"\n`),
  ]);
  const file = await writeBundle(root, b, "../b-" + path.basename(root) + ".json");
  const r = await bashible(["once", "--root", root, "--bundle", file, "--max-retries", "1", "--log-format", "json"]);
  t.equal(r.status, 1, "052 fails the run");
  t.equal(await readFile(path.join(root, "read"), "utf8"), "", "stdin was empty");
  t.equal(await readFile(path.join(root, "after"), "utf8"), "after\n", "and the script went on");
  t.equal(await readFile(path.join(root, "before"), "utf8"), "before\n");
  await t.rejects(readFile(path.join(root, "never")), { code: "ENOENT" }, "return 0 ended the step");
  await t.rejects(readFile(path.join(root, "unreachable")), { code: "ENOENT" }, "pipefail stopped 052");
  const st = JSON.parse((await bashible(["status", "--root", root, "--json"])).stdout);
  t.same(
    st.steps.map((s: { name: string; outcome: string }) => `${s.name} ${s.outcome}`),
    ["050_stdin changed", "051_return changed", "052_pipefail failed"],
  );
  t.equal(
    await readFile(path.join(root, "var/lib/bashible/bundle_steps/051_return"), "utf8"),
    b.steps[1]?.kind === "Script" ? b.steps[1].spec.script : "",
  );
});

t.test("a script's output streams to the journal and the step log as it happens", async (t) => {
  const root = await sandbox();
  const b = makeBundle([script("050_talk", `echo "first line"\necho "to stderr" >&2\n`)]);
  const file = await writeBundle(root, b, "../b-" + path.basename(root) + ".json");
  const r = await bashible(["once", "--root", root, "--bundle", file, "--log-format", "json"]);
  t.equal(r.status, 0);
  const lines = r.stdout
    .split("\n")
    .filter(Boolean)
    .map((l) => JSON.parse(l));
  t.ok(
    lines.some((l) => l.msg === "first line" && l.stream === "stdout" && l.step === "050_talk"),
    "stdout line in the journal",
  );
  t.ok(
    lines.some((l) => l.msg === "to stderr" && l.stream === "stderr"),
    "stderr line in the journal",
  );
  t.match(await readFile(path.join(root, "var/log/d8/bashible/step.050_talk.log"), "utf8"), /first line\nto stderr\n/);
});

t.test("an unsupported OS is a clear error", async (t) => {
  const root = await sandbox("ID=gentoo\n");
  const file = await writeBundle(root, makeBundle([hello("x")]), "../b-" + path.basename(root) + ".json");
  const r = await bashible(["once", "--root", root, "--bundle", file]);
  t.equal(r.status, 1);
  t.match(r.stdout + r.stderr, /'gentoo' is not supported/);
});

t.test("the daemon applies a changed bundle within seconds", async (t) => {
  const root = await sandbox();
  const file = await writeBundle(root, makeBundle([hello("one")]), "../b-" + path.basename(root) + ".json");
  const d = bashibleDaemon(["--root", root, "--bundle", file, "--tick", "3600"]);
  let out = "";
  d.stdout?.on("data", (c) => (out += c));
  t.teardown(() => void d.kill("SIGKILL"));
  const greeting = () => readFile(path.join(root, "etc/hello/greeting"), "utf8").catch(() => "");
  await waitFor("first converge", async () => ((await greeting()) === "one node-1\n" ? true : undefined));
  await writeBundle(root, makeBundle([hello("two")]), "../b-" + path.basename(root) + ".json");
  await waitFor(
    "the new bundle applied",
    async () => ((await greeting()) === "two node-1\n" ? true : undefined),
    10_000,
  );
  t.pass("applied without waiting for the minute tick");
  const exited = new Promise((r) => d.once("exit", r));
  d.kill("SIGTERM");
  t.equal(await exited, 0, "stops cleanly on SIGTERM");
  t.match(out, /"msg":"converge due"/);
});

t.test("a torn status.json does not stop the daemon from converging", async (t) => {
  const root = await sandbox();
  const file = await writeBundle(root, makeBundle([hello("one")]), "../b-" + path.basename(root) + ".json");
  t.equal((await bashible(["once", "--root", root, "--bundle", file])).status, 0);
  await writeFile(path.join(root, "var/lib/bashible/status.json"), '{"appliedBootId": "tru');
  const d = bashibleDaemon(["--root", root, "--bundle", file, "--tick", "3600"]);
  t.teardown(() => void d.kill("SIGKILL"));
  const two = makeBundle([hello("two")]);
  await writeBundle(root, two, "../b-" + path.basename(root) + ".json");
  // The run's end, not a side effect on the way: status.json records the applied checksum last.
  const status = await waitFor(
    "the run that applies the new bundle to finish",
    async () => {
      const text = await readFile(path.join(root, "var/lib/bashible/status.json"), "utf8").catch(() => "");
      try {
        const st = JSON.parse(text) as { appliedChecksum?: string };
        return st.appliedChecksum === two.checksum ? st : undefined;
      } catch {
        return undefined;
      }
    },
    30_000,
  );
  t.equal(status.appliedChecksum, two.checksum, "converged; status.json rewritten");
  t.equal(await readFile(path.join(root, "etc/hello/greeting"), "utf8"), "two node-1\n");
  const aside = await readdir(path.join(root, "var/lib/bashible/corrupt"));
  t.match(aside, [/^status\.json\.corrupt-/], "the torn file is kept aside for a person to read");
});

t.test("scripts use Deckhouse's helpers: bb-sync-file, events, and bb-flag-set reboot (a reboot last)", async (t) => {
  const root = await sandbox();
  await mkdir(path.join(root, "var/lib/bashible"), { recursive: true });
  const b = makeBundle([
    script(
      "050_helpers",
      [
        `bb-event-on 'bb-sync-file-changed' '_changed'`,
        `_changed() { echo "changed $1" >> "$BASHIBLE_ROOT/events"; }`,
        `mkdir -p "$BASHIBLE_ROOT/etc/demo"`,
        `echo "value=1" | bb-sync-file "$BASHIBLE_ROOT/etc/demo/app.conf" -`,
        `bb-is-bundle > "$BASHIBLE_ROOT/bundle"`,
        `bb-flag-set reboot`,
      ].join("\n"),
    ),
  ]);
  const file = await writeBundle(root, b, "../b-" + path.basename(root) + ".json");
  const r = await bashible(["once", "--root", root, "--bundle", file, "--log-format", "json"]);
  t.equal(r.status, 0, r.stdout + r.stderr);
  t.equal(await readFile(path.join(root, "etc/demo/app.conf"), "utf8"), "value=1\n");
  t.match(await readFile(path.join(root, "events"), "utf8"), /changed .*etc\/demo\/app\.conf/, "the handler ran");
  t.equal((await readFile(path.join(root, "bundle"), "utf8")).trim(), "debian");
  t.match(
    await readFile(path.join(root, "var/lib/bashible/sandbox-actions.log"), "utf8"),
    /reboot/,
    "the flag set by the script made the run reboot last (no cluster: the operator approves)",
  );
  await t.rejects(
    readFile(path.join(root, "var/lib/bashible/.bb-workspace/flag/reboot")),
    { code: "ENOENT" },
    "flag cleared",
  );
});

/** A node tree with accounts the shadow tools can change, and the sudo group that grants root. */
async function accountsTree(): Promise<string> {
  const root = await sandbox();
  await writeFile(path.join(root, "etc/passwd"), "root:x:0:0:root:/root:/bin/bash\n");
  await writeFile(path.join(root, "etc/group"), "root:x:0:\nsudo:x:27:\nusers:x:100:\n");
  await writeFile(path.join(root, "etc/shadow"), "root:*:19000:0:99999:7:::\n", { mode: 0o640 });
  await writeFile(path.join(root, "etc/gshadow"), "root:*::\nsudo:*::\nusers:*::\n", { mode: 0o640 });
  await writeFile(path.join(root, "etc/sudoers"), "root ALL=(ALL:ALL) ALL\n", { mode: 0o440 });
  return root;
}

t.test("a problem a step reports is a warning of once and plan, and exit 3: the rest is applied", async (t) => {
  const root = await accountsTree();
  t.teardown(() => rm(root, { recursive: true, force: true }));
  const users = {
    name: "000_add_node_users",
    kind: "NodeUsers" as const,
    spec: {
      users: [
        { name: "ivan", uid: 1301, sshPublicKeys: [], isSudoer: false, extraGroups: ["sudo"] },
        { name: "dora", uid: 1302, sshPublicKeys: [], isSudoer: false, extraGroups: [] },
      ],
    },
  };
  const file = await writeBundle(root, makeBundle([users, hello("hi")]), `../b-${path.basename(root)}.json`);
  const refused = /not applied: NodeUser ivan: extraGroups sudo grant root on this node; only isSudoer may do that/;

  const once = await bashible(["once", "--root", root, "--bundle", file, "--log-format", "json"]);
  t.equal(once.status, 3, "exit 3: applied except for a problem");
  const warnings = once.stdout
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l))
    .filter((l) => l.level === "warn");
  t.match(warnings, [
    { step: "000_add_node_users", subject: "NodeUser ivan", msg: refused },
    { msg: /1 problem held part of the bundle back \(exit 3\); the rest is applied/ },
  ]);
  t.equal(await readFile(path.join(root, "etc/hello/greeting"), "utf8"), "hi node-1\n", "the rest is applied");
  t.match(await readFile(path.join(root, "etc/passwd"), "utf8"), /^dora:/m);
  t.notMatch(await readFile(path.join(root, "etc/passwd"), "utf8"), /^ivan:/m, "the refused user is not created");

  const plan = await bashible(["plan", "--root", root, "--bundle", file]);
  t.equal(plan.status, 3, "plan: nothing pending, a problem reported");
  t.match(plan.stdout, /! NodeUser ivan: extraGroups sudo grant root/);
  t.match(plan.stderr, refused, "and a warning on stderr, where --json or a pager would not bury it");

  const again = await bashible(["once", "--root", root, "--bundle", file]);
  t.equal(again.status, 3, "in sync, and the problem still stands");
  t.match(again.stdout, /NodeUser ivan: extraGroups sudo grant root.*reported by the run that applied this bundle/);
  t.equal(await runs(root), 1, "nothing ran again");
  t.equal((await bashible(["status", "--root", root])).status, 3, "status says the same");
});

t.test("status.json is root's alone, and a refused bundle's values are not quoted into it", async (t) => {
  const root = await sandbox();
  t.teardown(() => rm(root, { recursive: true, force: true }));
  const file = path.join(path.dirname(root), `b-${path.basename(root)}.json`);
  t.teardown(() => rm(file, { force: true }));
  await writeFile(file, JSON.stringify(makeBundle([hello("good")])));
  t.equal((await bashible(["once", "--root", root, "--bundle", file])).status, 0);
  // A key line with a second one injected after a newline, and a password hash likewise.
  const injected = makeBundle([
    {
      name: "000_add_node_users",
      kind: "NodeUsers",
      spec: {
        users: [
          {
            name: "ivan",
            uid: 1301,
            sshPublicKeys: ["ssh-ed25519 AAAAC3Nza ivan@x\nssh-ed25519 AAAAINJECTED attacker@evil"],
            passwordHash: "$6$SECRETSALT$SECRETHASH\nroot::0:0",
            isSudoer: false,
            extraGroups: [],
          },
        ],
      },
    },
  ]);
  await writeFile(file, JSON.stringify(injected));
  const r = await bashible(["once", "--root", root, "--bundle", file, "--log-format", "json"]);
  t.equal(r.status, 1, "refused");
  t.match(r.stdout, /spec\.users\[0\]\.sshPublicKeys\[0\]: a string \(its value not shown\) is not a single-line SSH/);
  const statusFile = path.join(root, "var/lib/bashible/status.json");
  const text = await readFile(statusFile, "utf8");
  t.match(text, /sshPublicKeys\[0\]/, "status names the field");
  t.notMatch(text, /ivan@x|INJECTED|SECRET/, "but quotes no value of the refused bundle");
  t.notMatch(r.stdout + r.stderr, /ivan@x|INJECTED|SECRET/, "nor does the log");
  const { stat } = await import("node:fs/promises");
  t.equal((await stat(statusFile)).mode & 0o777, 0o600, "0600: it quotes what commands and bundles said");
});
