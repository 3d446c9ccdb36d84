// The sync helpers (bb-sync-file, bb-sync-dir) run as root, attacked by a local user: nobody
// (uid 65534), acting through setpriv, plants links and swaps directories wherever they can
// write, before the step runs. Root's files must keep content and mode, nothing may be removed
// behind a link, and the step must fail naming what it refused.
import t, { type Test } from "tap";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { chmod, chown, mkdir, readFile, readdir, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import { sandbox, type Sandbox } from "../lib/bashbooster.ts";
import { requireRoot } from "../fixtures/root.ts";

await requireRoot("root's files attacked by another user");

const USER = 65534;
const run = promisify(execFile);
/** A shell command as the attacker. */
const asUser = (cmd: string) =>
  run("setpriv", [`--reuid=${USER}`, `--regid=${USER}`, "--clear-groups", "sh", "-c", cmd]);

interface World {
  sb: Sandbox;
  /** Root's: a 0600 secret and a directory of files. */
  secret: string;
  rootDir: string;
  /** A directory the attacker owns (a NodeUser's home, say). */
  userDir: string;
  /** Every path, mode, owner and content of root's files. */
  snapshot(): Promise<string>;
}

async function world(t: Test): Promise<World> {
  const sb = await sandbox();
  t.teardown(() => sb.cleanup());
  await chmod(sb.dir, 0o755); // the attacker must reach their own directory
  const rootDir = path.join(sb.dir, "root-only");
  await mkdir(rootDir, { mode: 0o755 });
  const secret = path.join(rootDir, "secret");
  await writeFile(secret, "s3cret\n", { mode: 0o600 });
  await writeFile(path.join(rootDir, "keep.conf"), "keep\n", { mode: 0o644 });
  const userDir = path.join(sb.dir, "home-nobody");
  await mkdir(userDir, { mode: 0o755 });
  await chown(userDir, USER, USER);
  const snapshot = async () => {
    const out: string[] = [];
    for (const n of (await readdir(rootDir)).sort()) {
      const st = await stat(path.join(rootDir, n));
      out.push(`${n} ${(st.mode & 0o7777).toString(8)} ${st.uid} ${await readFile(path.join(rootDir, n), "utf8")}`);
    }
    return out.join("|");
  };
  return { sb, secret, rootDir, userDir, snapshot };
}

t.test("a link the user planted at the destination does not overwrite root's 0600 file", async (t) => {
  const w = await world(t);
  const before = await w.snapshot();
  const dst = path.join(w.userDir, "app.conf");
  await asUser(`ln -s ${w.secret} ${dst}`);
  const r = await w.sb.step(`bb-sync-file "${dst}" - <<'EOF'\nowned = true\nEOF\n`);
  t.equal(r.code, 1, "the step fails");
  t.match(r.stderr, `bb-sync-file: ${w.userDir} can be written by others (owner uid ${USER}, mode 0755); refused`);
  t.equal(await w.snapshot(), before, "the secret keeps its content, its 0600 and its owner");
});

t.test("a directory the user swapped for a link on the way is refused", async (t) => {
  const w = await world(t);
  const before = await w.snapshot();
  // Root made userDir/conf (root-owned), the user replaced it with a link to root's directory.
  await mkdir(path.join(w.userDir, "conf"));
  await asUser(`mv ${w.userDir}/conf ${w.userDir}/conf.old && ln -s ${w.rootDir} ${w.userDir}/conf`);
  const r = await w.sb.step(`bb-sync-file "${w.userDir}/conf/keep.conf" - <<'EOF'\nowned\nEOF\n`);
  t.equal(r.code, 1);
  t.match(r.stderr, `${w.userDir} can be written by others`);
  t.equal(await w.snapshot(), before);
});

t.test("a two-way bb-sync-dir deletes nothing through the user's link", async (t) => {
  const w = await world(t);
  const before = await w.snapshot();
  const src = path.join(w.sb.dir, "src");
  await mkdir(src);
  await writeFile(path.join(src, "only.conf"), "x\n");
  // The destination inside the user's directory: they point it at root's directory.
  await asUser(`ln -s ${w.rootDir} ${w.userDir}/conf.d`);
  const inHome = await w.sb.step(`bb-sync-dir "${w.userDir}/conf.d" "${src}"\n`);
  t.equal(inHome.code, 1);
  t.match(inHome.stderr, `bb-sync-dir: ${w.userDir} can be written by others`);
  // A root-owned destination with a subdirectory the user owns: a link they plant inside it.
  const dst = path.join(w.sb.dir, "dst");
  await mkdir(path.join(dst, "sub"), { recursive: true });
  await chown(path.join(dst, "sub"), USER, USER);
  await mkdir(path.join(src, "sub"));
  await asUser(`ln -s ${w.rootDir} ${dst}/sub/inner`);
  await mkdir(path.join(src, "sub", "inner"));
  const sub = await w.sb.step(`bb-sync-dir "${dst}" "${src}"\n`);
  t.equal(sub.code, 1);
  t.match(sub.stderr, `${dst}/sub can be written by others (owner uid ${USER}`);
  t.equal(await w.snapshot(), before, "every file of root's directory is still there, unchanged");
});

t.test("a sticky world-writable directory is not a place to sync a file into", async (t) => {
  const w = await world(t);
  const before = await w.snapshot();
  const shared = path.join(w.sb.dir, "shared");
  await mkdir(shared);
  await chmod(shared, 0o1777);
  await asUser(`ln -s ${w.secret} ${shared}/app.conf`);
  const r = await w.sb.step(`bb-sync-file "${shared}/app.conf" - <<'EOF'\nowned\nEOF\n`);
  t.equal(r.code, 1);
  t.match(r.stderr, `${shared} can be written by others (owner uid 0, mode 1777); refused`);
  t.equal(await w.snapshot(), before);
  // Below a root-owned sticky directory, a directory of root's own is fine (nobody can swap it).
  await mkdir(path.join(shared, "root-owned"));
  const ok = await w.sb.step(`bb-sync-file "${shared}/root-owned/app.conf" - <<'EOF'\nfine\nEOF\n`);
  t.equal(ok.code, 0, ok.stderr);
  t.equal(await readFile(path.join(shared, "root-owned", "app.conf"), "utf8"), "fine\n");
});
