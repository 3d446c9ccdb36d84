// Errors that name the fix (issue 27): what a new user meets first, run as they would run it.
// The non-root cases run the CLI as uid 65534 (setpriv) on trees and bundles it can read; each
// message must say what is wrong and what to do, and the command must exit 1 at once (no raw
// EACCES, no errno without a path, no class names, no daemon logging the same error forever).
import t from "tap";
import { spawn } from "node:child_process";
import { chmod, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { MAIN } from "../../scripts/lib/cli.ts";
import { makeBundle, sandbox, script, writeBundle } from "../../scripts/lib/bundle.ts";
import { requireRoot } from "../fixtures/root.ts";

await requireRoot("to run the CLI as another user, and to seed root-only files");

const USER = 65534;

/** The CLI as uid 65534 (or as root), from "/", with its exit status and both streams. */
function cli(args: string[], o: { asUser?: boolean } = {}): Promise<{ status: number; out: string }> {
  const argv = o.asUser
    ? // env -u: the test runner's spawn hook adds NODE_OPTIONS that write under the checkout.
      [
        "setpriv",
        `--reuid=${USER}`,
        `--regid=${USER}`,
        "--clear-groups",
        "env",
        "-u",
        "NODE_OPTIONS",
        process.execPath,
        MAIN,
        ...args,
      ]
    : [process.execPath, MAIN, ...args];
  return new Promise((resolve) => {
    // A user's environment, not the test runner's.
    const env = { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: "/", LANG: "C" };
    const child = spawn(argv[0] as string, argv.slice(1), { cwd: "/", env });
    let out = "";
    child.stdout.on("data", (d) => (out += d));
    child.stderr.on("data", (d) => (out += d));
    child.on("close", (code) => resolve({ status: code ?? 1, out }));
  });
}

const work = await mkdtemp(path.join(os.tmpdir(), "cli-errors-"));
t.teardown(() => rm(work, { recursive: true, force: true }));
await chmod(work, 0o755);
const users = {
  name: "000_add_node_users",
  kind: "NodeUsers" as const,
  spec: { users: [{ name: "alice", uid: 1100, sshPublicKeys: [], isSudoer: false, extraGroups: [] }] },
};
const bundle = await writeBundle(work, makeBundle([users, script("050_hello", "echo hi")]));
await chmod(bundle, 0o644);
/** A node tree as root leaves it: readable by all, /etc/shadow root's. */
const nodeTree = await sandbox();
await chmod(nodeTree, 0o755);
await writeFile(path.join(nodeTree, "etc/passwd"), "root:x:0:0:root:/root:/bin/bash\n");
await writeFile(path.join(nodeTree, "etc/group"), "root:x:0:\nusers:x:100:\n");
await writeFile(path.join(nodeTree, "etc/shadow"), "root:*:19000:0:99999:7:::\n", { mode: 0o640 });
t.teardown(() => rm(nodeTree, { recursive: true, force: true }));
/** A tree the other user owns, as `once --root ~/sbx` would use. */
const ownTree = path.join(work, "sbx");
await mkdir(path.join(ownTree, "etc"), { recursive: true });
await writeFile(path.join(ownTree, "etc/os-release"), "ID=debian\nVERSION_ID=12\n");

const NEEDS_ROOT = /needs root \(.*\); this is uid 65534: run it with sudo/;
const RAW = /EACCES|EPERM|\/proc\/self\/fd|"error":"/;

t.test("once as another user: needs root, run it with sudo; exit 1 before touching anything", async (t) => {
  for (const args of [
    ["once", "--bundle", bundle],
    ["once", "--root", ownTree, "--bundle", bundle],
  ]) {
    const r = await cli(args, { asUser: true });
    t.equal(r.status, 1, args.join(" "));
    t.match(r.out, NEEDS_ROOT, r.out);
    t.notMatch(r.out, RAW, "no raw errno, fd path or class name");
  }
});

t.test("run as another user: says it needs root and exits instead of retrying every minute", async (t) => {
  const r = await cli(["run", "--bundle", bundle, "--tick", "1"], { asUser: true });
  t.equal(r.status, 1);
  t.match(r.out, /bashible run needs root/);
  t.notMatch(r.out, RAW);
});

t.test("plan as another user names the file it could not read and says to use sudo", async (t) => {
  const r = await cli(["plan", "--root", nodeTree, "--bundle", bundle], { asUser: true });
  t.equal(r.status, 1, "a step could not be planned");
  t.match(
    r.out,
    `cannot plan: cannot read ${nodeTree}/etc/shadow: permission denied (EACCES); this is uid 65534, not root: run it with sudo`,
  );
  t.notMatch(r.out, /\/proc\/self\/fd/, "the node's path, not the descriptor the walk used");
});

t.test("status as another user: status.json is root's; the message says so and what to do", async (t) => {
  t.equal((await cli(["once", "--root", nodeTree, "--bundle", bundle, "--retry-interval", "0"])).status, 0);
  const r = await cli(["status", "--root", nodeTree], { asUser: true });
  t.equal(r.status, 1);
  t.match(r.out, `cannot read ${nodeTree}/var/lib/bashible/status.json: permission denied`);
  t.match(r.out, /not root: run it with sudo/);
  t.notMatch(r.out, /"error":"/);
});

t.test("an empty, missing or OS-less --root says what is wrong with it, not that the OS is unsupported", async (t) => {
  const empty = path.join(work, "empty");
  await mkdir(empty);
  const cases: [string, string[], RegExp][] = [
    ["empty", ["--root", ""], /--root needs a directory/],
    ["missing", ["--root", path.join(work, "nope")], /--root .*\/nope does not exist: point it at a node's root/],
    ["a file", ["--root", bundle], /is not a directory: point it at a node's root/],
    ["no os-release", ["--root", empty], /--root .*\/empty has no etc\/os-release .*: point it at a node's root/],
  ];
  for (const [what, root, msg] of cases) {
    for (const cmd of ["once", "plan"]) {
      const r = await cli([cmd, ...root, "--bundle", bundle]);
      t.equal(r.status, 1, `${cmd}, ${what}`);
      t.match(r.out, msg, `${cmd}, ${what}: ${r.out}`);
      t.notMatch(r.out, /not supported/, `${cmd}, ${what}: not blamed on the OS`);
      t.notMatch(r.out, /"error":"/, "no class name in the error line");
    }
  }
});
