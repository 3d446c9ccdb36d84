// The rest of Deckhouse's bashbooster helpers, each run by real bash as a step: bb-assert*,
// bb-template, bb-read-*, bb-wait, bb-task-*, bb-download, bb-create_user_and_group (its
// decisions; creating users needs root and is left to the node tests), bb-is-distro-like?,
// bb-discover-node-name, bb-ctrd-v1/v2-has-registry-fields and bb-rp-* through the agent; and
// the helper list in docs/deckhouse-compatibility.md is the library's. One bash run per test.
import t from "tap";
import { chmod, readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { LIBRARY, sandbox, type Sandbox } from "../lib/bashbooster.ts";

async function withSandbox(t: { teardown(fn: () => unknown): void }, osRelease?: string): Promise<Sandbox> {
  const sb = await sandbox(osRelease);
  t.teardown(() => sb.cleanup());
  return sb;
}

t.test("bb-assert*: a false assertion ends the step with exit 10 and its message", async (t) => {
  const sb = await withSandbox(t);
  await writeFile(path.join(sb.dir, "f"), "x");
  const r = await sb.step(
    `bb-assert '[[ 1 -eq 1 ]]'; bb-assert-file ${sb.dir}/f; bb-assert-dir ${sb.dir}; X=1 bb-assert-var HOME
echo passed
bb-assert-file ${sb.dir}/nope
echo never
`,
  );
  t.equal(r.code, 10);
  t.equal(r.stdout, "passed\n");
  t.match(r.stderr, new RegExp(`File '${sb.dir}/nope' not found`));
  const custom = await sb.step("bb-assert false 'custom message'\n");
  t.equal(custom.code, 10);
  t.match(custom.stderr, /custom message/);
});

t.test("bb-template expands variables and commands; bb-read-* set prefixed variables", async (t) => {
  const sb = await withSandbox(t);
  const d = sb.dir;
  await writeFile(path.join(d, "tpl"), "host=$NAME at $(echo now)\n");
  await writeFile(path.join(d, "p.properties"), "# comment\nkey.one = value 1\nkey-two: two\n");
  await writeFile(path.join(d, "c.ini"), "[main]\nport = 8080\n[extra.x]\nname = it's\n");
  await writeFile(path.join(d, "j.json"), JSON.stringify({ a: { b: "c" }, list: [1, "x"], n: null }));
  const r = await sb.step(
    `NAME=worker bb-template ${d}/tpl
bb-read-properties ${d}/p.properties P_; echo "$P_key_one|$P_key_two"
bb-read-ini ${d}/c.ini '*' I_; echo "$I_main_port|$I_extra_x_name"
bb-read-json ${d}/j.json J; echo "$J_a_b|$J_list_len|$J_list_1|[$J_n]"
bb-read-json ${d}/missing J || echo unreadable
`,
  );
  t.equal(r.code, 0, r.stderr);
  t.equal(r.stdout, "host=worker at now\nvalue 1|two\n8080|it's\nc|2|x|[]\nunreadable\n");
});

t.test("bb-wait waits for a condition, and gives up after its timeout", async (t) => {
  const sb = await withSandbox(t);
  const r = await sb.step(
    `n=0; bb-wait '(( ++n >= 2 ))'; echo "held after $n"
bb-wait false 1 || echo "timed out"
`,
  );
  t.equal(r.code, 0, r.stderr);
  t.equal(r.stdout, "held after 2\ntimed out\n");
  t.match(r.stderr, /Timeout has been reached during wait for 'false'/);
});

t.test("bb-task-*: each task once per run, dependencies first; an undefined task ends the step", async (t) => {
  const sb = await withSandbox(t);
  const r = await sb.step(
    `base() { echo base; }
app() { bb-task-depends base; echo app; }
bb-task-def base; bb-task-def app; bb-task-def alias app
bb-task-run app base alias
bb-task-run missing
`,
  );
  t.equal(r.code, 14);
  t.equal(
    r.stdout,
    "base\napp\napp\n",
    "base once though named three times; alias is another name for app, so app runs again",
  );
  t.match(r.stderr, /Undefined task 'missing'/);
});

t.test("bb-download fetches once into the workspace and prints the path", async (t) => {
  const sb = await withSandbox(t);
  const src = path.join(sb.dir, "payload.txt");
  await writeFile(src, "payload\n");
  const r = await sb.step(
    `f="$(bb-download file://${src})"; cat "$f"; echo changed > ${src}
cat "$(bb-download file://${src})"
cat "$(bb-download file://${src} payload.txt true)"
bb-download file://${sb.dir}/none >/dev/null || echo failed
`,
  );
  t.equal(r.code, 0, r.stderr);
  t.equal(r.stdout, "payload\npayload\nchanged\nfailed\n", "cached, unless forced");
});

t.test("OS and node helpers: bb-is-distro-like?, bb-discover-node-name", async (t) => {
  const sb = await withSandbox(t, 'ID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"\n');
  const r = await sb.step(
    `bb-is-distro-like? debian && echo like-debian
bb-is-distro-like? ubuntu && echo is-ubuntu
bb-is-distro-like? rhel || echo not-rhel
bb-discover-node-name; bb-d8-node-name
`,
    { D8_NODE_HOSTNAME: "worker-7" },
  );
  t.equal(r.code, 0, r.stderr);
  t.equal(r.stdout, "like-debian\nis-ubuntu\nnot-rhel\nworker-7\n");
  t.equal(await readFile(path.join(sb.state, "discovered-node-name"), "utf8"), "worker-7\n");
});

t.test("bb-create_user_and_group leaves an existing user as it is", async (t) => {
  const sb = await withSandbox(t);
  const r = await sb.step(`bb-create_user_and_group root 0 root 0; echo done\n`);
  t.equal(r.code, 0, r.stderr);
  t.match(r.stderr, /User root with UID 0 and GID 0 already exists/);
  t.equal(r.stdout, "done\n");
});

t.test("bb-ctrd-v1/v2-has-registry-fields read containerd's TOML", async (t) => {
  const sb = await withSandbox(t);
  const d = sb.dir;
  await writeFile(
    path.join(d, "v1.toml"),
    '[plugins."io.containerd.grpc.v1.cri".registry.mirrors."x"]\nendpoint = ["https://x"]\n',
  );
  await writeFile(
    path.join(d, "v2.toml"),
    'version = 3\n[plugins."io.containerd.cri.v1.images".registry]\nconfig_path = "/etc/containerd/registry.d"\n',
  );
  await writeFile(path.join(d, "bad.toml"), "[[[\n");
  const r = await sb.step(
    `bb-ctrd-v1-has-registry-fields ${d}/v1.toml && echo v1-has
bb-ctrd-v2-has-registry-fields ${d}/v1.toml || echo v1-not-v2
bb-ctrd-v2-has-registry-fields ${d}/v2.toml && echo v2-has
bb-ctrd-v1-has-registry-fields ${d}/bad.toml
echo never
`,
  );
  t.equal(r.code, 1);
  t.equal(r.stdout, "v1-has\nv1-not-v2\nv2-has\n");
  t.match(r.stderr, /Failed to parse TOML config/);
});

t.test("bb-rp-* go through the agent as bb-package-*", async (t) => {
  const sb = await withSandbox(t);
  const agent = path.join(sb.dir, "agent");
  const calls = path.join(sb.dir, "calls");
  await writeFile(
    agent,
    `#!/bin/bash
echo "$*" >> ${calls}
case "$1 $2" in
  "package installed") [[ "$3" == jq* ]] ;;
  "package install") echo "installed jq" >> "$4" ;;
  *) exit 0 ;;
esac
`,
  );
  await chmod(agent, 0o755);
  const hex = "a".repeat(64);
  const r = await sb.step(
    `bb-event-on bb-package-installed on; on() { echo "installed:$1"; }
bb-rp-install jq:${hex}
bb-rp-is-installed? jq ${hex} && echo jq-there
bb-rp-is-installed? crictl || echo crictl-absent
bb-package-is-installed? jq && echo jq-there
bb-rpp-get-install
`,
    { BASHIBLE_AGENT: agent },
  );
  t.equal(r.code, 0, r.stderr);
  t.equal(r.stdout, "installed:jq\njq-there\ncrictl-absent\njq-there\n");
  const c = (await readFile(calls, "utf8")).trim().split("\n");
  t.match(c[0], new RegExp(`^package install --result \\S+ jq:sha256:${hex}$`), "a bare hex tag is a sha256 digest");
  t.equal(c[1], `package installed jq:sha256:${hex}`);
});

t.test("the helper list in docs/deckhouse-compatibility.md is the library's", async (t) => {
  const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
  const lib = await readFile(LIBRARY, "utf8");
  const defined = new Set([...lib.matchAll(/^(bb-[A-Za-z0-9_?-]+)\(\)/gm)].map((m) => m[1]!));
  const doc = await readFile(path.join(REPO, "docs/deckhouse-compatibility.md"), "utf8");
  const section = doc.slice(doc.indexOf("## Helpers provided"), doc.indexOf("### Events and when handlers run"));
  // The table's "helpers" column (its third column names events and flags too).
  const cells = section
    .split("\n")
    .filter((l) => l.startsWith("| ") && !l.startsWith("| area") && !l.startsWith("|---"))
    .map((l) => l.split(/(?<!\\)\|/)[2] ?? "");
  const listed = new Set(cells.flatMap((c) => [...c.matchAll(/`(bb-[A-Za-z0-9_?-]+)/g)].map((m) => m[1]!)));
  // Internal to the library (set-up, EXIT trap), not for scripts.
  const internal = [
    "bb-workspace-init",
    "bb-workspace-cleanup",
    "bb-tmp-init",
    "bb-tmp-cleanup",
    "bb-event-init",
    "bb-flag-init",
    "bb-cleanup",
  ];
  t.same([...defined].filter((f) => !listed.has(f) && !internal.includes(f)).sort(), [], "every helper is listed");
  t.same([...listed].filter((f) => !defined.has(f)).sort(), [], "every listed helper exists");
  const missing = doc.slice(doc.indexOf("not provided:"));
  const notProvided = [...missing.slice(0, missing.indexOf("\n")).matchAll(/`(bb-[A-Za-z0-9_?-]+)`/g)].map(
    (m) => m[1]!,
  );
  t.same(
    notProvided.filter((f) => defined.has(f)),
    [],
    "nothing listed as not provided exists",
  );
});
