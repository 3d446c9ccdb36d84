// The library's package helpers. dnf, yum, zypper and ALT's apt-get + rpm cannot run here: their
// helpers are checked for the commands they run, through recorders first on PATH (apt runs for
// real in test/integration/bashbooster-apt.test.ts). Registry packages and the disruption
// approval go through the agent (BASHIBLE_AGENT): checked against a stand-in that records its
// arguments and answers as the contract says.
import t from "tap";
import { chmod, mkdir, readFile, symlink, writeFile } from "node:fs/promises";
import { existsSync } from "node:fs";
import path from "node:path";
import { sandbox, type Sandbox } from "../lib/bashbooster.ts";

async function withSandbox(t: { teardown(fn: () => unknown): void }, osRelease?: string): Promise<Sandbox> {
  const sb = await sandbox(osRelease);
  t.teardown(() => sb.cleanup());
  return sb;
}

// ---- dnf, yum, zypper, ALT's apt-get: the commands they would run ----------------------------

/** A bin directory of recorders: each logs its argv (and the proxy in effect) and keeps "installed" state. */
async function recorders(sb: Sandbox, names: string[]): Promise<{ bin: string; log: () => Promise<string[]> }> {
  const bin = path.join(sb.dir, "bin");
  const stateDir = path.join(sb.dir, "pkgstate");
  await mkdir(bin);
  await mkdir(stateDir);
  const logFile = path.join(sb.dir, "commands.log");
  const recorder = path.join(bin, "recorder");
  await writeFile(
    recorder,
    `#!/bin/bash
name=$(basename "$0")
echo "$name $*\${HTTP_PROXY:+ [proxy $HTTP_PROXY]}" >> "${logFile}"
state="${stateDir}"
args=("$@")
case "$name $1 $2" in
  "rpm -q "*) [ -e "$state/\${args[-1]}" ]; exit ;;
  "dnf list installed"|"yum -C list") [ -e "$state/\${args[-1]}" ]; exit ;;
esac
case "$*" in
  *install*) for a in "$@"; do case "$a" in -*|install|--*) ;; *) touch "$state/$a" ;; esac; done ;;
  *remove*) for a in "$@"; do case "$a" in -*|remove) ;; *) rm -f "$state/$a" ;; esac; done ;;
esac
exit 0
`,
  );
  await chmod(recorder, 0o755);
  for (const n of names) await symlink(recorder, path.join(bin, n));
  return {
    bin,
    log: async () =>
      (await readFile(logFile, "utf8").catch(() => ""))
        .split("\n")
        .filter((l) => l && !/^(rpm -q|dnf list installed|yum -C list installed)/.test(l)),
  };
}

const PKG_EVENTS =
  'bb-event-on bb-package-installed on_installed\non_installed() { echo "installed:$1"; }\n' +
  'bb-event-on bb-package-removed on_removed\non_removed() { echo "removed:$1"; }\n';

t.test("bb-dnf-install / bb-dnf-remove run dnf as Deckhouse does, through the proxy", async (t) => {
  const sb = await withSandbox(t, "ID=rocky\n");
  const rec = await recorders(sb, ["dnf", "yum"]);
  const env = { PATH: `${rec.bin}:${process.env.PATH}`, BASHIBLE_HTTP_PROXY: "http://proxy:3128" };
  const r = await sb.step(`${PKG_EVENTS}bb-dnf-install kernel-tools wget\n`, env);
  t.equal(r.code, 0, r.stderr);
  t.same(await rec.log(), [
    "dnf clean all [proxy http://proxy:3128]",
    "dnf makecache [proxy http://proxy:3128]",
    "dnf install -y kernel-tools wget [proxy http://proxy:3128]",
  ]);
  t.equal(r.stdout, "installed:wget\n", "one event per call, with the last package named (Deckhouse's behaviour)");
  t.equal(
    // biome-ignore lint/suspicious/noTemplateCurlyInString: bash parameter expansions
    (await sb.step('echo "${HTTP_PROXY:-none}"; bb-dnf-install wget; echo "${HTTP_PROXY:-none}"\n', env)).stdout,
    "none\nnone\n",
    "the proxy is not left behind",
  );

  await sb.step("bb-run-finished\n", env);
  const extra = await sb.step(`${PKG_EVENTS}bb-dnf-install curl\n`, {
    ...env,
    BB_DNF_INSTALL_EXTRA_ARGS: "--nogpgcheck",
  });
  t.equal(extra.stdout, "installed:curl\n");
  t.same(
    (await rec.log()).slice(-3),
    [
      "dnf clean all [proxy http://proxy:3128]",
      "dnf makecache [proxy http://proxy:3128]",
      "dnf install --nogpgcheck -y curl [proxy http://proxy:3128]",
    ],
    "the package index is refreshed again in a new converge",
  );

  const removed = await sb.step(`${PKG_EVENTS}bb-dnf-remove wget absent\n`, env);
  t.equal(removed.stdout, "removed:wget\n");
  t.equal((await rec.log()).at(-1), "dnf remove -y wget [proxy http://proxy:3128]");
  t.equal((await sb.step("bb-pkg-mgr; bb-pkg install jq\n", env)).stdout, "dnf\n", "bb-pkg dispatches to dnf");
  t.equal((await rec.log()).at(-1), "dnf install -y jq [proxy http://proxy:3128]");
});

t.test("bb-dnf-install falls back to yum where there is no dnf; bb-yum-* run yum", async (t) => {
  const sb = await withSandbox(t, "ID=centos\n");
  const rec = await recorders(sb, ["yum"]);
  const env = { PATH: `${rec.bin}:/usr/bin:/bin` };
  const r = await sb.step(`${PKG_EVENTS}bb-dnf-install nfs-utils\nbb-yum-remove nfs-utils\n`, env);
  t.equal(r.code, 0, r.stderr);
  t.match(r.stderr, /bb-dnf-install downgraded to yum/);
  t.same(await rec.log(), ["yum clean all", "yum makecache", "yum install -y nfs-utils", "yum remove -y nfs-utils"]);
  t.equal(r.stdout, "installed:nfs-utils\n", "yum's remove fires no event, as in Deckhouse");
  t.equal((await sb.step("bb-yum-or-apt-install tar\n", env)).code, 0);
  t.equal((await rec.log()).at(-1), "yum install -y tar");
});

t.test("bb-zypper-* and ALT Linux's bb-apt-rpm-* run their tools", async (t) => {
  const suse = await withSandbox(t, "ID=opensuse-leap\n");
  const z = await recorders(suse, ["zypper", "rpm"]);
  const zr = await suse.step(`${PKG_EVENTS}bb-pkg install open-iscsi\nbb-zypper-remove open-iscsi\n`, {
    PATH: `${z.bin}:${process.env.PATH}`,
  });
  t.equal(zr.code, 0, zr.stderr);
  t.same(await z.log(), [
    "zypper clean",
    "zypper refresh",
    "zypper install -y open-iscsi",
    "zypper remove -y open-iscsi",
  ]);
  t.equal(zr.stdout, "installed:open-iscsi\n");

  const alt = await withSandbox(t, "ID=altlinux\n");
  const a = await recorders(alt, ["apt-get", "rpm"]);
  const ar = await alt.step(
    `${PKG_EVENTS}bb-pkg-mgr\nbb-apt-rpm-install jq\nbb-apt-rpm-install jq\nbb-apt-rpm-install --force jq\nbb-apt-rpm-remove jq\n`,
    {
      PATH: `${a.bin}:${process.env.PATH}`,
    },
  );
  t.equal(ar.code, 0, ar.stderr);
  t.same(await a.log(), ["apt-get update", "apt-get install -y jq", "apt-get install -y jq", "apt-get remove -y jq"]);
  t.equal(ar.stdout, "apt-rpm\ninstalled:jq\ninstalled:jq\ninstalled:jq\nremoved:jq\n");
});

// ---- registry packages and disruption approval, through the agent ------------------------------

/** Stands in for the agent: records argv; answers per the contract (result lines, exit code). */
async function agent(sb: Sandbox, behaviour: string): Promise<{ path: string; calls: () => Promise<string[]> }> {
  const file = path.join(sb.dir, "agent");
  const calls = path.join(sb.dir, "agent.calls");
  await writeFile(file, `#!/bin/bash\necho "$*" >> "${calls}"\n${behaviour}\n`);
  await chmod(file, 0o755);
  return {
    path: file,
    calls: async () => (await readFile(calls, "utf8").catch(() => "")).split("\n").filter(Boolean),
  };
}

const D1 = `sha256:${"a".repeat(64)}`;
const D2 = `sha256:${"b".repeat(64)}`;

t.test("bb-package-install asks the agent and fires bb-package-installed for what it installed", async (t) => {
  const sb = await withSandbox(t);
  const a = await agent(
    sb,
    `result="$4"
echo "installed jq" >> "$result"; echo "skipped crictl" >> "$result"
exit \${AGENT_EXIT:-0}`,
  );
  const env = { BASHIBLE_AGENT: a.path };
  const r = await sb.step(`${PKG_EVENTS}bb-package-install jq:${D1} crictl:${D2}\necho after\n`, env);
  t.equal(r.code, 0, r.stderr);
  t.equal(r.stdout, "installed:jq\nafter\n", "skipped packages fire nothing");
  const [call] = await a.calls();
  t.match(
    call,
    new RegExp(`^package install --result ${sb.state}/\\.bb-workspace/tmp_\\w+/\\d+ jq:${D1} crictl:${D2}$`),
  );

  const failed = await sb.step(`${PKG_EVENTS}bb-package-install jq:${D1}\necho never\n`, { ...env, AGENT_EXIT: "3" });
  t.equal(failed.code, 3, "the agent's failure fails the step");
  t.equal(failed.stdout, "installed:jq\n", "events for what did get installed still fire");

  t.equal((await sb.step("bb-package-install\necho none\n", env)).stdout, "none\n");
  const bad = await sb.step("bb-package-install jq:latest\n", env);
  t.equal(bad.code, 1);
  t.match(bad.stderr, /'jq:latest' is not NAME:sha256:<64 hex>/);
  const noAgent = await sb.step(`bb-package-install jq:${D1}\n`);
  t.equal(noAgent.code, 1);
  t.match(noAgent.stderr, /bb-package-install needs the bashible agent/);
  t.equal((await a.calls()).length, 2, "no call for bad input");
  const argv = await sb.step(`${PKG_EVENTS}bb-package-install jq:${D1}\n`, { BASHIBLE_AGENT: `'bash' '${a.path}'` });
  t.equal(argv.stdout, "installed:jq\n", "BASHIBLE_AGENT may be the agent's argv, shell-quoted, as the agent sets it");
  t.equal((await a.calls()).length, 3);
  await sb.step(`bb-package-install jq:${D1}@deckhouse/ee/modules/x\n`, env);
  t.match((await a.calls())[3], new RegExp(`jq:${D1}@deckhouse/ee/modules/x$`), "a repository may follow the digest");
  t.equal((await sb.step(`bb-package-fetch jq:${D1}\necho fetched\n`, env)).stdout, "fetched\n", "fetch only checks");
});

t.test("bb-package-remove asks the agent and fires bb-package-removed", async (t) => {
  const sb = await withSandbox(t);
  const a = await agent(sb, 'echo "removed jq" >> "$4"');
  const r = await sb.step(`${PKG_EVENTS}bb-package-remove jq\n`, { BASHIBLE_AGENT: a.path });
  t.equal(r.stdout, "removed:jq\n");
  t.match((await a.calls())[0], /^package remove --result \S+ jq$/);
});

t.test(
  "bb-deckhouse-get-disruptive-update-approval: first run and a set flag skip it; the agent decides otherwise",
  async (t) => {
    const sb = await withSandbox(t);
    // biome-ignore lint/suspicious/noTemplateCurlyInString: a bash parameter expansion
    const a = await agent(sb, "exit ${AGENT_EXIT:-0}");
    const script = "bb-deckhouse-get-disruptive-update-approval\necho continues\nbb-flag? disruption && echo flagged\n";
    const first = await sb.step(script, { BASHIBLE_AGENT: a.path, FIRST_BASHIBLE_RUN: "yes" });
    t.equal(first.stdout, "continues\n", "first run: approved without asking, no flag");
    t.same(await a.calls(), []);

    const approved = await sb.step(script, { BASHIBLE_AGENT: a.path, FIRST_BASHIBLE_RUN: "no" });
    t.equal(approved.code, 0);
    t.equal(approved.stdout, "continues\nflagged\n");
    t.same(await a.calls(), ["internal-disruption"]);
    t.ok(existsSync(path.join(sb.flags, "disruption")), "the disruption flag is where the agent reads flags");

    await sb.step(script, { BASHIBLE_AGENT: a.path });
    t.equal((await a.calls()).length, 1, "with the flag set the agent is not asked again");
    await sb.step("bb-flag-unset disruption\n");

    const rolling = await sb.step(script, { BASHIBLE_AGENT: a.path, AGENT_EXIT: "10" });
    t.equal(rolling.code, 0, "RollingUpdate: the step ends successfully");
    t.equal(rolling.stdout, "", "nothing after the call runs");
    t.notOk(existsSync(path.join(sb.flags, "disruption")));

    const refused = await sb.step(script, { BASHIBLE_AGENT: a.path, AGENT_EXIT: "1" });
    t.equal(refused.code, 1);
    t.equal(refused.stdout, "");
    t.match(refused.stderr, /disruption approval failed \(agent exit code 1\)/);
  },
);
