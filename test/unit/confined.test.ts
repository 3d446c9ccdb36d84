// The host layer's confinement, directly: what is followed, what is refused, and that a refused
// operation changes nothing. Runs as any user (no chown needed).
import t, { type Test } from "tap";
import { chmod, link, mkdir, mkdtemp, readdir, readFile, rm, stat, symlink, writeFile } from "node:fs/promises";
import { execFileSync } from "node:child_process";
import os from "node:os";
import path from "node:path";
import {
  ConfinedFs,
  components,
  LinkRefusedError,
  NotRegularFileError,
  UntrustedDirectoryError,
} from "../../host/confined.ts";
import { Host } from "../../host/host.ts";

async function tree(t: Test) {
  const base = await mkdtemp(path.join(os.tmpdir(), "bashible-confined-"));
  t.teardown(() => rm(base, { recursive: true, force: true }));
  const root = path.join(base, "root");
  const out = path.join(base, "outside");
  await mkdir(path.join(root, "etc"), { recursive: true });
  await mkdir(out);
  await writeFile(path.join(out, "secret"), "SECRET\n");
  await writeFile(path.join(root, "etc/hostname"), "node\n");
  return { root, out, fs: new ConfinedFs(root) };
}

t.test("node paths name things inside the root; '..' is refused", async (t) => {
  t.same(components("/etc//ssl/./certs"), ["etc", "ssl", "certs"]);
  t.throws(() => components("/etc/../../x"), /contains '\.\.'/);
  t.throws(() => components("etc/x"), /absolute/);
  const { fs } = await tree(t);
  await t.rejects(fs.readFile("/../../etc/passwd"), /contains '\.\.'/);
  const host = new Host("/tmp/r", { id: "debian", versionId: "12", family: "debian", packageManager: "apt" });
  t.throws(() => host.path("/a/../../../etc"), /contains '\.\.'/);
  t.equal(host.path("/etc/x"), "/tmp/r/etc/x");
});

t.test("a link at any component is refused for reads, writes, mkdir and removal", async (t) => {
  const { root, out, fs } = await tree(t);
  await symlink(out, path.join(root, "etc/linked"));
  await symlink(path.join(out, "secret"), path.join(root, "etc/file-link"));
  await t.rejects(fs.readFile("/etc/linked/secret"), LinkRefusedError);
  await t.rejects(fs.readFile("/etc/file-link"), LinkRefusedError);
  await t.rejects(fs.writeAtomic("/etc/linked/new", [Buffer.from("x")], { mode: 0o644 }), LinkRefusedError);
  await t.rejects(fs.writeAtomic("/etc/file-link", [Buffer.from("x")], { mode: 0o644 }), LinkRefusedError);
  await t.rejects(fs.mkdir("/etc/linked/dir", { mode: 0o755 }), LinkRefusedError);
  await t.rejects(fs.remove("/etc/linked/secret"), LinkRefusedError);
  await t.rejects(fs.listDir("/etc/linked"), LinkRefusedError);
  await t.rejects(fs.realPath("/etc/file-link"), LinkRefusedError);
  t.same(await readdir(out), ["secret"], "nothing appeared outside");
  t.equal(await readFile(path.join(out, "secret"), "utf8"), "SECRET\n");
  const err = await fs.readFile("/etc/linked/secret").catch((e: Error) => e);
  t.match((err as Error).message, new RegExp(`/etc/linked is a symbolic link \\(to ${out}\\); refused`));
  t.equal((err as { permanent?: boolean }).permanent, true, "waiting will not fix it");
  await fs.remove("/etc/file-link");
  t.equal(await readFile(path.join(out, "secret"), "utf8"), "SECRET\n", "removing a link removes the link only");
});

t.test("links a system ships are resolved inside the root, never against the host", async (t) => {
  const { root, fs } = await tree(t);
  await mkdir(path.join(root, "run/lock"), { recursive: true });
  await mkdir(path.join(root, "var"));
  await symlink("/run/lock", path.join(root, "var/lock"));
  await mkdir(path.join(root, "usr/lib"), { recursive: true });
  await writeFile(path.join(root, "usr/lib/os-release"), "ID=debian\n");
  await symlink("../usr/lib/os-release", path.join(root, "etc/os-release"));
  t.equal(await fs.realPath("/var/lock/bashible"), path.join(root, "run/lock/bashible"));
  await fs.writeAtomic("/var/lock/x", [Buffer.from("x")], { mode: 0o644 });
  t.equal(await readFile(path.join(root, "run/lock/x"), "utf8"), "x");
  // A final-component system link is read like any file only through its directory walk:
  // /etc/os-release is the file itself, so it is refused as a link; its directory may be one.
  await t.rejects(fs.readFile("/etc/os-release"), LinkRefusedError);
  // A system link's target that climbs above the root stays at the root.
  await rm(path.join(root, "var/lock"));
  await symlink("../../../../../../run/lock", path.join(root, "var/lock"));
  t.equal(await fs.realPath("/var/lock/y"), path.join(root, "run/lock/y"));
});

t.test("a path handed to a program never runs through a directory others can write", async (t) => {
  const { root, fs } = await tree(t);
  await mkdir(path.join(root, "opt/deckhouse/tmp/pkg"), { recursive: true });
  t.equal(await fs.realPath("/opt/deckhouse/tmp/pkg/a.tgz"), path.join(root, "opt/deckhouse/tmp/pkg/a.tgz"));
  // Deckhouse's TMPDIR is 1777: anyone may create entries there, so anything below it could be
  // swapped between the agent's check and the program's own lookup of the string.
  await chmod(path.join(root, "opt/deckhouse/tmp"), 0o1777);
  await t.rejects(fs.realPath("/opt/deckhouse/tmp/pkg/a.tgz"), UntrustedDirectoryError);
  await t.rejects(fs.realPath("/opt/deckhouse/tmp/missing/a.tgz"), /\/opt\/deckhouse\/tmp can be written by others/);
  await t.rejects(fs.realPath("/opt/deckhouse/tmp"), /mode 1777/, "the final directory too");
  // Group-writable counts as others.
  await chmod(path.join(root, "opt/deckhouse/tmp"), 0o775);
  await t.rejects(fs.realPath("/opt/deckhouse/tmp/pkg"), UntrustedDirectoryError);
  // Confined reads and writes still work there: they never hand out the string.
  await fs.writeAtomic("/opt/deckhouse/tmp/pkg/ok", [Buffer.from("x")], { mode: 0o644 });
  t.equal((await fs.readFile("/opt/deckhouse/tmp/pkg/ok"))?.toString(), "x");
});

t.test("FIFOs, devices and directories are never read into a plan", async (t) => {
  const { root, fs } = await tree(t);
  execFileSync("mkfifo", [path.join(root, "etc/fifo")]);
  const err = await fs.readFile("/etc/fifo").catch((e: Error) => e);
  t.type(err, NotRegularFileError, "refused without blocking on the FIFO");
  t.match((err as Error).message, /is a FIFO, not a regular file/);
  await t.rejects(fs.readFile("/etc"), /not a regular file/);
});

t.test("a hard-linked file in a directory others can write is refused; replaced, never written through", async (t) => {
  const { root, out, fs } = await tree(t);
  await mkdir(path.join(root, "home"), { mode: 0o777 });
  await execFileSync("chmod", ["0777", path.join(root, "home")]);
  await link(path.join(out, "secret"), path.join(root, "home/keys"));
  await t.rejects(fs.readFile("/home/keys"), /2 hard links in a directory another user can write/);
  await fs.writeAtomic("/home/keys", [Buffer.from("new\n")], { mode: 0o600 });
  t.equal(await readFile(path.join(out, "secret"), "utf8"), "SECRET\n", "the other name keeps its content");
  t.equal((await stat(path.join(out, "secret"))).mode & 0o777, 0o644, "and its mode");
});

t.test("a write that its check refuses keeps the old file and leaves no candidate", async (t) => {
  const { root, fs } = await tree(t);
  await fs.writeAtomic("/etc/conf", [Buffer.from("good\n")], { mode: 0o644 });
  await t.rejects(
    fs.writeAtomic(
      "/etc/conf",
      [Buffer.from("bad\n")],
      { mode: 0o644 },
      {
        check: async (candidate) => {
          t.equal(await readFile(candidate, "utf8"), "bad\n", "the checker sees the candidate's real path");
          throw new Error("refused by the program");
        },
      },
    ),
    /refused by the program/,
  );
  t.equal(await readFile(path.join(root, "etc/conf"), "utf8"), "good\n");
  t.same((await readdir(path.join(root, "etc"))).sort(), ["conf", "hostname"]);
});

t.test("reads stop at their limit", async (t) => {
  const { root, fs } = await tree(t);
  await writeFile(path.join(root, "etc/big"), Buffer.alloc(2048));
  await t.rejects(fs.readFile("/etc/big", 1024), /at most 1024 read/);
  t.equal((await fs.readFile("/etc/big", 4096))?.length, 2048);
  t.equal(await fs.readFile("/etc/absent"), undefined, "absent is undefined, not an error");
});

t.test("recursive removal refuses trees other users can write into", async (t) => {
  const { root, fs } = await tree(t);
  await mkdir(path.join(root, "srv/shared/sub"), { recursive: true });
  execFileSync("chmod", ["0777", path.join(root, "srv/shared")]);
  if (process.getuid?.() === 0) {
    await t.rejects(fs.remove("/srv/shared", { recursive: true }), /not removing a tree another user can write into/);
  }
  execFileSync("chmod", ["0755", path.join(root, "srv/shared")]);
  if (process.getuid?.() === 0) {
    await fs.remove("/srv/shared", { recursive: true });
    await t.rejects(stat(path.join(root, "srv/shared")), { code: "ENOENT" });
  }
});
