// The bash helper library (steps/bashbooster/bashbooster.sh), function by function, run by
// real bash as the agent runs a NodeGroupConfiguration step: logging, events and when their
// handlers run, flags where the agent reads them, temporary files, bb-sync-file/-dir, the OS
// and bundle helpers (the same table as bundles/os-families.ts), proxy and node-name helpers.
import t from "tap";
import { chmod, link, lstat, mkdir, readFile, readdir, rm, stat, symlink, writeFile } from "node:fs/promises";
import { existsSync } from "node:fs";
import path from "node:path";
import { sandbox, type Sandbox } from "../lib/bashbooster.ts";
import { DECKHOUSE_OS_BY_ID } from "../../bundles/os-families.ts";
import { PATHS } from "../../bundles/paths.ts";

async function withSandbox(t: { teardown(fn: () => unknown): void }, osRelease?: string): Promise<Sandbox> {
  const sb = await sandbox(osRelease);
  t.teardown(() => sb.cleanup());
  return sb;
}

t.test("logging: '<prefix> [LEVEL] message' on stderr, filtered by BB_LOG_LEVEL", async (t) => {
  const sb = await withSandbox(t);
  const script =
    'bb-log-debug "d"; bb-log-info "i"; bb-log-warning "w"; bb-log-warn "w2"; bb-log-error "e"; echo out\n';
  const r = await sb.step(script);
  t.equal(r.code, 0);
  t.equal(r.stdout, "out\n", "nothing on stdout but the script's own");
  t.equal(r.stderr, "100_test.sh [INFO] i\n100_test.sh [WARNING] w\n100_test.sh [WARNING] w2\n100_test.sh [ERROR] e\n");
  t.match((await sb.step(script, { BB_LOG_LEVEL: "DEBUG" })).stderr, /^100_test.sh \[DEBUG\] d\n/);
  t.equal((await sb.step(script, { BB_LOG_LEVEL: "4" })).stderr, "100_test.sh [ERROR] e\n", "numeric levels");
  const inHelper = await sb.step("bb-flag-set x\n");
  t.equal(inHelper.stderr, `bb-flag [INFO] Creating flag 'x' at '${sb.flags}'\n`, "a helper logs under its area");
  t.match(
    (await sb.step("bb-log-deprecated new-thing old-thing\n")).stderr,
    /'old-thing' is deprecated, use 'new-thing' instead/,
  );
});

t.test("bb-exit and bb-exit-on-error end the step with the code given", async (t) => {
  const sb = await withSandbox(t);
  const r = await sb.step('bb-exit 7 "seven"\necho never\n');
  t.equal(r.code, 7);
  t.equal(r.stdout, "");
  t.match(r.stderr, /\[ERROR\] seven/);
  const ok = await sb.step('bb-exit 0 "fine"\necho never\n');
  t.equal(ok.code, 0);
  t.match(ok.stderr, /\[INFO\] fine/);
  const e = await sb.step('false || bb-exit-on-error "it failed"\necho never\n');
  t.equal(e.code, 1);
  t.match(e.stderr, /it failed/);
  const q = await sb.step("if false; then :; fi; true; if bb-error?; then echo err; else echo fine $BB_ERROR; fi\n");
  t.equal(q.stdout, "fine 0\n");
  t.equal((await sb.step("bb-exe? bash && echo yes; bb-exe? no-such-cmd || echo no\n")).stdout, "yes\nno\n");
});

t.test("flags live in the workspace's flag directory, the agent's PATHS.flags, across steps", async (t) => {
  const sb = await withSandbox(t);
  t.equal(path.relative(sb.state, sb.flags), path.relative(PATHS.stateDir, PATHS.flags), "same layout as PATHS.flags");
  const set = await sb.step("bb-flag-set reboot\nbb-flag-set disruption\nbb-flag? reboot && echo set\n");
  t.equal(set.stdout, "set\n");
  t.same((await readdir(sb.flags)).sort(), ["disruption", "reboot"], "the agent finds them after the step");
  const next = await sb.step(
    "bb-flag? reboot && echo still; bb-flag-unset disruption; bb-flag? disruption || echo gone\n",
  );
  t.equal(next.stdout, "still\ngone\n", "flags outlive the step");
  await sb.step("bb-flag-unset reboot\n");
  t.notOk(existsSync(sb.flags), "an empty flag directory is removed when the step ends");
  t.notOk(existsSync(path.join(sb.state, ".bb-workspace")), "so is an empty workspace");
  const bad = await sb.step("bb-flag-set ../escape\n");
  t.equal(bad.code, 1);
  t.match(bad.stderr, /invalid flag name/);
  t.notOk(existsSync(path.join(sb.state, ".bb-workspace", "escape")));
  const custom = path.join(sb.dir, "ws");
  await sb.step("bb-flag-set kubelet-need-restart\n", { BB_WORKSPACE: custom });
  t.ok(existsSync(path.join(custom, "flag", "kubelet-need-restart")), "BB_WORKSPACE moves the workspace");
});

t.test("bb-tmp-file and bb-tmp-dir: inside the workspace, gone when the step ends", async (t) => {
  const sb = await withSandbox(t);
  const r = await sb.step(
    'f="$(bb-tmp-file)"; d="$(bb-tmp-dir)"; echo "$f"; echo "$d"; stat -c %a "$f"; test -d "$d"\n',
    {},
    {},
  );
  t.equal(r.code, 0);
  const [file, dir, mode] = r.stdout.trim().split("\n");
  t.ok(file?.startsWith(path.join(sb.state, ".bb-workspace", "tmp_")));
  t.ok(dir?.startsWith(path.join(sb.state, ".bb-workspace", "tmp_")));
  t.equal(mode, "644", "made like touch makes files (umask 022), so bb-sync-file copies a readable mode");
  t.notOk(existsSync(file!));
  t.notOk(existsSync(dir!));
  const again = await sb.step('a="$(bb-tmp-file)"; b="$(bb-tmp-file)"; [ "$a" != "$b" ] && echo distinct\n');
  t.equal(again.stdout, "distinct\n");
});

t.test("events: handlers run at once with the event's arguments, once each", async (t) => {
  const sb = await withSandbox(t);
  const r = await sb.step(`
h() { echo "h:$#:$1|$2"; }
bb-event-on my-event h
bb-event-on my-event h
bb-event-on my-event "echo preset"
bb-event-fire my-event "a b" c
echo between
bb-event-off my-event h
bb-event-fire my-event x
bb-event-fire never-subscribed y
`);
  t.equal(r.code, 0);
  t.equal(r.stdout, "h:2:a b|c\npreset a b c\nbetween\npreset x\n");
  t.match(r.stderr, /bb-event \[INFO\] Run handlers for event 'my-event'/);
  const sub = await sb.step("( bb-event-on ev 'echo from-subshell' )\nbb-event-fire ev\n");
  t.equal(sub.stdout, "from-subshell\n", "a handler registered in a subshell counts, as in Deckhouse");
});

t.test("events: recursion stops at Deckhouse's depth with exit code 12", async (t) => {
  const sb = await withSandbox(t);
  t.equal((await sb.step("echo $BB_EVENT_MAX_DEPTH\n")).stdout, "1000\n", "Deckhouse's depth by default");
  // A script may lower it, as bashbooster's own tests do: 1000 nested bash frames cost seconds.
  const r = await sb.step(
    "BB_EVENT_MAX_DEPTH=5\nloop() { echo level; bb-event-fire again; }\nbb-event-on again loop\nbb-event-fire again\necho never\n",
  );
  t.equal(r.code, 12);
  t.equal(r.stdout, "level\n".repeat(4), "handlers ran until the depth was reached");
  t.match(r.stderr, /Max recursion depth has been reached on processing event 'again'/);
});

t.test("delayed events run when the step ends: after its last line, once, even after a failure", async (t) => {
  const sb = await withSandbox(t);
  // Deckhouse's documentation example: the handler is defined after bb-event-on and bb-sync-file.
  const r = await sb.step(`
bb-event-on ca-file-updated update-certs
bb-event-delay ca-file-updated
bb-event-delay ca-file-updated
bb-event-delay other "x y"
echo "last line"
update-certs() { echo "update-certs ran"; }
other() { echo "other:$1"; }
`);
  t.equal(r.code, 0);
  t.equal(r.stdout, "last line\nupdate-certs ran\n", "once, after the last line; 'other' has no handler");
  const withArgs = await sb.step('bb-event-on other other\nother() { echo "other:$1"; }\nbb-event-delay other "x y"\n');
  t.equal(withArgs.stdout, "other:x y\n");

  const failed = await sb.step("bb-event-on e h\nh() { echo handler; }\nbb-event-delay e\nfalse\necho never\n");
  t.equal(failed.code, 1, "the step's failure stands");
  t.equal(failed.stdout, "handler\n", "delayed handlers still run, as in Deckhouse");

  const returned = await sb.step("bb-event-on e h\nh() { echo handler; }\nbb-event-delay e\nreturn 0\necho never\n");
  t.equal(returned.code, 0, "a top-level return 0 ends the step successfully");
  t.equal(returned.stdout, "handler\n");

  const handlerFails = await sb.step(
    "bb-event-on e h\nh() { false; echo not-reached; }\nbb-event-delay e\necho body\n",
  );
  t.equal(handlerFails.code, 1, "a failing delayed handler fails the step");
  t.equal(handlerFails.stdout, "body\n", "handlers keep errexit");
  t.notOk(existsSync(path.join(sb.state, ".bb-workspace")), "and the workspace is still cleaned");

  const chained = await sb.step(
    "bb-event-on a ha\nbb-event-on b hb\nha() { echo ha; bb-event-delay b; }\nhb() { echo hb; }\nbb-event-delay a\n",
  );
  t.equal(chained.stdout, "ha\nhb\n", "events delayed by handlers run too");
  const cleanup = await sb.step("bb-event-on bb-cleanup 'echo cleaning'\necho body\n");
  t.equal(cleanup.stdout, "body\ncleaning\n", "the bb-cleanup event fires at the end");
});

t.test(
  "bb-sync-file: copies when different, fires bb-sync-file-changed at once and the event at the end",
  async (t) => {
    const sb = await withSandbox(t);
    const dst = path.join(sb.dir, "etc", "example.conf");
    await mkdir(path.dirname(dst));
    const script = (content: string) => `
bb-event-on bb-sync-file-changed 'echo changed-now'
bb-event-on conf-updated restart
restart() { echo "restart $1"; }
src="$(bb-tmp-file)"
printf '%s\\n' '${content}' > "$src"
bb-sync-file "${dst}" "$src" conf-updated svc
echo "body done"
`;
    const first = await sb.step(script("a = 1"));
    t.equal(first.code, 0);
    t.equal(first.stdout, "changed-now " + dst + "\nbody done\nrestart svc\n");
    t.equal(await readFile(dst, "utf8"), "a = 1\n");
    t.equal(((await stat(dst)).mode & 0o777).toString(8), "644");

    // A converge that ended (the agent calls bb-run-finished): the same content changes nothing.
    await sb.step("bb-run-finished\n");
    const same = await sb.step(script("a = 1"));
    t.equal(same.stdout, "body done\n", "no event when nothing changed");
    const changed = await sb.step(script("a = 2"));
    t.equal(changed.stdout, "changed-now " + dst + "\nbody done\nrestart svc\n");
    t.equal(await readFile(dst, "utf8"), "a = 2\n");
  },
);

t.test("bb-sync-file: a change whose step failed fires again on the retry, until the converge ends", async (t) => {
  const sb = await withSandbox(t);
  const dst = path.join(sb.dir, "unit.conf");
  const step = (tail: string) =>
    `bb-event-on bb-sync-file-changed 'echo changed:'\nbb-sync-file "${dst}" - <<'EOF'\nx=1\nEOF\n${tail}`;
  const failing = await sb.step(step("false\n"));
  t.equal(failing.code, 1);
  t.equal(failing.stdout, `changed: ${dst}\n`);
  const retry = await sb.step(step(""));
  t.equal(retry.stdout, `changed: ${dst}\n`, "the retry sees it as changed although the content is in place");
  t.match(await readFile(path.join(sb.state, "bashbooster_unhandled_synced_files"), "utf8"), dst);
  await sb.step("bb-run-finished\n");
  t.equal((await sb.step(step(""))).stdout, "", "after the converge: unchanged");
});

t.test("bb-sync-file: '-' reads stdin, the source's mode is kept, a missing source is an error", async (t) => {
  const sb = await withSandbox(t);
  const dst = path.join(sb.dir, "from-stdin");
  const r = await sb.step(`bb-sync-file "${dst}" - <<'EOF'\nline one\n$HOME stays literal\nEOF\n`);
  t.equal(r.code, 0);
  t.equal(await readFile(dst, "utf8"), "line one\n$HOME stays literal\n");
  const src = path.join(sb.dir, "secret.src");
  await writeFile(src, "s3cret\n", { mode: 0o600 });
  await sb.step(`bb-sync-file "${path.join(sb.dir, "secret")}" "${src}"\n`);
  t.equal(((await stat(path.join(sb.dir, "secret"))).mode & 0o777).toString(8), "600");
  const missing = await sb.step(`bb-sync-file "${path.join(sb.dir, "x")}" /nonexistent/file\necho never\n`);
  t.equal(missing.code, 1);
  t.match(missing.stderr, /source '\/nonexistent\/file' is not a file/);
  t.notOk(existsSync(path.join(sb.dir, "x")), "nothing created");
});

t.test("bb-sync-dir: two-way by default, -o/--one-way keeps extra files, events as Deckhouse fires them", async (t) => {
  const sb = await withSandbox(t);
  const src = path.join(sb.dir, "src");
  const dst = path.join(sb.dir, "dst");
  await mkdir(path.join(src, "sub"), { recursive: true });
  await writeFile(path.join(src, "a.conf"), "a\n");
  await writeFile(path.join(src, ".hidden"), "h\n");
  await writeFile(path.join(src, "sub", "b.conf"), "b\n");
  const events =
    "for e in bb-sync-dir-created bb-sync-file-changed bb-sync-file-removed bb-sync-dir-removed; do bb-event-on $e \"echo $e\"; done\nbb-event-on updated 'echo updated'\n";
  const first = await sb.step(`${events}bb-sync-dir "${dst}" "${src}" updated\n`);
  t.equal(first.code, 0);
  t.equal(
    first.stdout,
    [
      `bb-sync-dir-created ${dst}`,
      `bb-sync-file-changed ${dst}/.hidden`,
      `bb-sync-file-changed ${dst}/a.conf`,
      `bb-sync-dir-created ${dst}/sub`,
      `bb-sync-file-changed ${dst}/sub/b.conf`,
      "updated",
      "",
    ].join("\n"),
  );
  t.equal(await readFile(path.join(dst, "sub", "b.conf"), "utf8"), "b\n");

  await writeFile(path.join(dst, "extra"), "x\n");
  await mkdir(path.join(dst, "olddir"));
  await sb.step("bb-run-finished\n");
  const oneWay = await sb.step(`${events}bb-sync-dir "${dst}" -o "${src}"\n`);
  t.equal(oneWay.stdout, "", "one-way (option as the second argument): extra files stay, nothing changed");
  t.ok(existsSync(path.join(dst, "extra")));
  const twoWay = await sb.step(`${events}bb-sync-dir --two-way "${dst}" "${src}" updated\n`);
  t.equal(twoWay.stdout, `bb-sync-file-removed ${dst}/extra\nbb-sync-dir-removed ${dst}/olddir\nupdated\n`);
  t.notOk(existsSync(path.join(dst, "extra")));
  t.notOk(existsSync(path.join(dst, "olddir")));
});

// The agent's link rule (README "Security") in the sync helpers. These cases need no second
// user: a link or a writable directory the step itself did not expect is refused all the same
// (test/integration/bashbooster-links.test.ts plants them as another user, as root).
async function victim(sb: Sandbox): Promise<{ file: string; dir: string; snapshot: () => Promise<string> }> {
  const dir = path.join(sb.dir, "victim");
  await mkdir(dir);
  const file = path.join(dir, "secret");
  await writeFile(file, "s3cret\n", { mode: 0o600 });
  await writeFile(path.join(dir, "keep.conf"), "keep\n");
  const snapshot = async () => {
    const names = (await readdir(dir)).sort();
    const parts = await Promise.all(
      names.map(async (n) => {
        const st = await stat(path.join(dir, n));
        return `${n} ${(st.mode & 0o7777).toString(8)} ${await readFile(path.join(dir, n), "utf8")}`;
      }),
    );
    return parts.join("|");
  };
  return { file, dir, snapshot };
}

t.test("bb-sync-file refuses a link at the destination; what it points to keeps content and mode", async (t) => {
  const sb = await withSandbox(t);
  const v = await victim(sb);
  const before = await v.snapshot();
  const dst = path.join(sb.dir, "app.conf");
  await symlink(v.file, dst);
  const r = await sb.step(`bb-sync-file "${dst}" - <<'EOF'\nnew = 1\nEOF\necho never\n`);
  t.equal(r.code, 1, "the step fails");
  t.match(r.stderr, `bb-sync [ERROR] bb-sync-file: ${dst} is a symbolic link (to ${v.file}); refused`);
  t.notMatch(r.stdout, /never/);
  t.equal(await v.snapshot(), before, "the link's target: same content, still 0600");
  t.ok((await lstat(dst)).isSymbolicLink(), "the link is left for a person to look at");
});

t.test("bb-sync-file replaces a hard link at the destination instead of writing through it", async (t) => {
  const sb = await withSandbox(t);
  const v = await victim(sb);
  const before = await v.snapshot();
  const dst = path.join(sb.dir, "app.conf");
  await link(v.file, dst);
  const r = await sb.step(`bb-sync-file "${dst}" - <<'EOF'\nnew = 1\nEOF\n`);
  t.equal(r.code, 0, r.stderr);
  t.equal(await readFile(dst, "utf8"), "new = 1\n");
  t.equal((await stat(dst)).nlink, 1, "a new file, not the victim's inode");
  t.equal(await v.snapshot(), before, "the other name of the old inode is untouched");
});

t.test(
  "bb-sync-file: a link on the way, a directory others can write, '..' and a missing directory are refused",
  async (t) => {
    const sb = await withSandbox(t);
    const v = await victim(sb);
    const before = await v.snapshot();
    await mkdir(path.join(sb.dir, "etc"));
    await symlink(v.dir, path.join(sb.dir, "etc", "linked"));
    const onTheWay = await sb.step(`bb-sync-file "${sb.dir}/etc/linked/keep.conf" - <<'EOF'\nx\nEOF\n`);
    t.equal(onTheWay.code, 1);
    t.match(onTheWay.stderr, `${sb.dir}/etc/linked is a symbolic link (to ${v.dir}); refused`);
    await mkdir(path.join(sb.dir, "open"));
    await chmod(path.join(sb.dir, "open"), 0o777);
    const open = await sb.step(`bb-sync-file "${sb.dir}/open/a.conf" - <<'EOF'\nx\nEOF\n`);
    t.equal(open.code, 1);
    t.match(
      open.stderr,
      `${sb.dir}/open can be written by others (owner uid ${process.getuid?.()}, mode 0777); refused`,
    );
    t.notOk(existsSync(path.join(sb.dir, "open", "a.conf")));
    const climb = await sb.step(`bb-sync-file "${sb.dir}/etc/../victim/keep.conf" - <<'EOF'\nx\nEOF\n`);
    t.equal(climb.code, 1);
    t.match(climb.stderr, "contains '..'; refused");
    const missing = await sb.step(`bb-sync-file "${sb.dir}/nodir/a.conf" - <<'EOF'\nx\nEOF\n`);
    t.equal(missing.code, 1);
    t.match(missing.stderr, `directory ${sb.dir}/nodir does not exist`);
    t.equal(await v.snapshot(), before, "nothing changed behind any of them");
  },
);

t.test("bb-sync-dir: a link at the destination or under it is refused; nothing is removed behind it", async (t) => {
  const sb = await withSandbox(t);
  const v = await victim(sb);
  const before = await v.snapshot();
  const src = path.join(sb.dir, "src");
  await mkdir(path.join(src, "sub"), { recursive: true });
  await writeFile(path.join(src, "sub", "only.conf"), "x\n");
  const dst = path.join(sb.dir, "dst");
  await mkdir(dst);
  await symlink(v.dir, path.join(dst, "sub"));
  const under = await sb.step(`bb-sync-dir "${dst}" "${src}"\n`);
  t.equal(under.code, 1);
  t.match(under.stderr, `bb-sync-dir: ${dst}/sub is a symbolic link (to ${v.dir}); refused`);
  await rm(dst, { recursive: true });
  await symlink(v.dir, dst);
  const at = await sb.step(`bb-sync-dir "${dst}" "${src}"\n`);
  t.equal(at.code, 1);
  t.match(at.stderr, `${dst} is a symbolic link (to ${v.dir}); refused`);
  t.equal(await v.snapshot(), before, "two-way sync deleted nothing in the link's target");
});

t.test("the links real systems ship are followed inside BASHIBLE_ROOT, as the agent follows them", async (t) => {
  const sb = await withSandbox(t);
  const root = path.join(sb.dir, "root");
  await mkdir(path.join(root, "run"), { recursive: true });
  await mkdir(path.join(root, "var"));
  await mkdir(path.join(root, "etc"));
  await symlink("/run", path.join(root, "var", "run")); // absolute, as Debian ships it
  const name = `bb-links-${process.pid}.conf`;
  const r = await sb.step(`bb-sync-file "$BASHIBLE_ROOT/var/run/${name}" - <<'EOF'\nx\nEOF\n`, {
    BASHIBLE_ROOT: root,
  });
  t.equal(r.code, 0, r.stderr);
  t.equal(await readFile(path.join(root, "run", name), "utf8"), "x\n", "written under the root's /run");
  t.notOk(existsSync(path.join("/run", name)), "never the machine's own /run");
  await symlink(path.join(root, "run"), path.join(root, "etc", "conf.d"));
  const other = await sb.step(`bb-sync-file "$BASHIBLE_ROOT/etc/conf.d/${name}" - <<'EOF'\nx\nEOF\n`, {
    BASHIBLE_ROOT: root,
  });
  t.equal(other.code, 1, "any other link is refused");
  t.match(other.stderr, `${root}/etc/conf.d is a symbolic link`);
});

t.test("bb-is-bundle / bb-is-family / bb-pkg-mgr agree with bundles/os-families.ts for every ID", async (t) => {
  const sb = await withSandbox(t);
  for (const [id, want] of Object.entries(DECKHOUSE_OS_BY_ID)) {
    await writeFile(path.join(sb.dir, "os-release"), `NAME="Some OS"\nID="${id}"\nVERSION_ID=1\n`);
    const r = await sb.step('echo "$(bb-is-bundle) $(bb-is-family) $(bb-pkg-mgr)"\n');
    t.equal(r.stdout, `${want.bundle} ${want.family} ${want.packageManager}\n`, id);
  }
  await writeFile(path.join(sb.dir, "os-release"), "ID=gentoo\n");
  const unknown = await sb.step('echo "$(bb-is-bundle)"\n');
  t.equal(unknown.stdout, "unknown\n");
  t.match(unknown.stderr, /'gentoo' is not supported/);
  await writeFile(path.join(sb.dir, "os-release"), "ID=ubuntu\n");
  const root = path.join(sb.dir, "root");
  await mkdir(path.join(root, "etc"), { recursive: true });
  await writeFile(path.join(root, "etc", "os-release"), "ID=altlinux\n");
  t.equal(
    (await sb.step("bb-is-bundle\n", { BB_OS_RELEASE: "", BASHIBLE_ROOT: root })).stdout,
    "altlinux\n",
    "under a sandbox root",
  );
  t.equal((await sb.step("bb-is-bundle\n")).stdout, "ubuntu-lts\n", "Ubuntu is ubuntu-lts, not debian");
});

t.test("bb-is-<os>-version? compare VERSION_ID (Astra's takes a pattern)", async (t) => {
  const sb = await withSandbox(t, 'ID=ubuntu\nVERSION_ID="22.04"\n');
  const probe =
    // biome-ignore lint/suspicious/noTemplateCurlyInString: a bash parameter expansion
    "for v in 22.04 24.04; do bb-is-ubuntu-version? $v && echo ubuntu-$v; done; bb-is-debian-version? 22.04 && echo same-field; bb-is-astra-version? '^1\\.7' || echo not-astra; echo ${VERSION_ID:-untouched}\n";
  t.equal((await sb.step(probe)).stdout, "ubuntu-22.04\nsame-field\nnot-astra\nuntouched\n");
  await writeFile(path.join(sb.dir, "os-release"), 'ID=astra\nVERSION_ID="1.7_x86-64"\n');
  t.equal((await sb.step("bb-is-astra-version? '^1\\.7' && echo astra-1.7\n")).stdout, "astra-1.7\n");
});

t.test("the generated bundle header works: a script for other bundles exits 0 early", async (t) => {
  const sb = await withSandbox(t, "ID=rocky\n");
  const header = (bundles: string) => `case $(bb-is-bundle) in\n  ${bundles}) ;;\n  *) exit 0 ;;\nesac\necho ran\n`;
  t.equal((await sb.step(header("centos|redos"))).stdout, "ran\n");
  t.equal((await sb.step(header("ubuntu-lts"))).stdout, "");
});

t.test("bb-pkg dispatches to the node's package manager", async (t) => {
  const sb = await withSandbox(t, "ID=debian\n");
  const r = await sb.step('bb-apt-frob() { echo "apt frob $*"; }\nbb-pkg frob a b\n');
  t.equal(r.stdout, "apt frob a b\n");
  const bad = await sb.step("bb-pkg nothing-like-this x\n");
  t.equal(bad.code, 1);
  t.match(bad.stderr, /action 'nothing-like-this' is not supported for package manager 'apt'/);
});

t.test("bb-set-proxy / bb-unset-proxy export and clear the cluster's proxy", async (t) => {
  const sb = await withSandbox(t);
  // biome-ignore lint/suspicious/noTemplateCurlyInString: bash parameter expansions
  const show = 'echo "${HTTP_PROXY:-}|${https_proxy:-}|${NO_PROXY:-}"\n';
  const r = await sb.step(`bb-set-proxy\n${show}bb-unset-proxy\n${show}`, {
    BASHIBLE_HTTP_PROXY: "http://proxy:3128",
    BASHIBLE_HTTPS_PROXY: "http://proxy:3129",
    BASHIBLE_NO_PROXY: ".svc,10.0.0.0/8",
  });
  t.equal(r.stdout, "http://proxy:3128|http://proxy:3129|127.0.0.1,169.254.169.254,.svc,10.0.0.0/8\n||\n");
  const none = await sb.step(`bb-set-proxy\n${show}`, { HTTP_PROXY: "http://stale:1" });
  t.equal(none.stdout, "||\n", "no proxy configured: any inherited one is cleared");
  const scoped = await sb.step(`f() { bb-set-proxy; trap bb-unset-proxy RETURN; echo "in:$HTTP_PROXY"; }\nf\n${show}`, {
    BASHIBLE_HTTP_PROXY: "http://p:1",
  });
  t.equal(scoped.stdout, "in:http://p:1\n||\n", "Deckhouse's documented function-scoped pattern");
});

t.test("bb-d8-node-name and friends", async (t) => {
  const sb = await withSandbox(t);
  t.equal((await sb.step("bb-d8-node-name\n", { D8_NODE_HOSTNAME: "worker-1" })).stdout, "worker-1\n");
  await writeFile(path.join(sb.state, "discovered-node-name"), "worker-1.example\n");
  await writeFile(path.join(sb.state, "discovered-node-ip"), "10.0.0.5\n");
  t.equal(
    (await sb.step("bb-d8-node-name; bb-d8-machine-name; bb-d8-node-ip\n")).stdout,
    "worker-1.example\nworker-1.example\n10.0.0.5\n",
  );
});

t.test("bb-var sets a default only when the variable is empty", async (t) => {
  const sb = await withSandbox(t);
  t.equal((await sb.step('A=set; bb-var A x; bb-var B "y z"; echo "$A|$B"\n')).stdout, "set|y z\n");
});

t.test("the library is safe under nullglob and set -u in the calling script", async (t) => {
  const sb = await withSandbox(t);
  await writeFile(path.join(sb.state, "bb-flagX"), "");
  const r = await sb.step("shopt -s nullglob; set -u\nbb-flag-set apt-updated\nbb-apt-update\necho ok\n");
  t.equal(r.stdout, "ok\n", "bb-apt-update sees its flag although a file matches the glob bb-flag?");
  t.equal(r.code, 0);
});
