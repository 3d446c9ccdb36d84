// Where `bashible server --standalone` writes its CA key, tried as a local user would attack it:
// a directory planted first where the server writes (the old default, $TMPDIR/bashible-server),
// a link planted there, a directory of someone else's, one others can read. Root runs the
// server; user nobody plants, in a sticky world-writable directory like /tmp.
import t from "tap";
import { execFileSync, spawn } from "node:child_process";
import { chmod, lstat, mkdir, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { defaultStateDir } from "../../cluster/server/private-dir.ts";

if (process.geteuid?.() !== 0) {
  t.comment("skipped: needs root (it plants files as user nobody)");
  process.exit(0);
}

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const NOBODY = 65534;
const tmp = await mkdtemp(path.join(os.tmpdir(), "bashible-certdir-"));
t.teardown(() => rm(tmp, { recursive: true, force: true }));
await chmod(tmp, 0o755);
const shared = path.join(tmp, "shared");
await mkdir(shared);
await chmod(shared, 0o1777);
const asNobody = (...argv: string[]) =>
  execFileSync("setpriv", [`--reuid=${NOBODY}`, `--regid=${NOBODY}`, "--clear-groups", ...argv]);
// A root-only file a link could make root overwrite.
const victimDir = path.join(tmp, "victim");
await mkdir(victimDir, { mode: 0o700 });
await writeFile(path.join(victimDir, "ca.key"), "root's own secret\n", { mode: 0o600 });

/** Runs the standalone server until it listens (then stops it) or exits; returns what it said. */
function server(
  args: string[],
  env: NodeJS.ProcessEnv = {},
): Promise<{ listening: boolean; code: number | null; out: string }> {
  return new Promise((resolve) => {
    const child = spawn(
      process.execPath,
      [path.join(REPO, "agent/main.ts"), "server", "--standalone", "--port", "0", "--address", "127.0.0.1", ...args],
      { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] },
    );
    let out = "";
    let listening = false;
    const take = (d: Buffer) => {
      out += d.toString();
      if (!listening && out.includes("bundle server listening")) {
        listening = true;
        child.kill("SIGTERM");
      }
    };
    child.stdout.on("data", take);
    child.stderr.on("data", take);
    child.once("exit", (code) => resolve({ listening, code, out }));
  });
}

t.test("the default is a root-only state directory, not $TMPDIR/bashible-server", async (t) => {
  t.equal(defaultStateDir({}, 0), "/var/lib/bashible-server");
  t.equal(defaultStateDir({ STATE_DIRECTORY: "/var/lib/x" }, 0), "/var/lib/x/certs", "systemd's StateDirectory=");
  t.equal(defaultStateDir({}, 1000, "/home/u"), "/home/u/.local/state/bashible-server");
  // nobody plants the old default first, open to all.
  const planted = path.join(shared, "bashible-server");
  asNobody("mkdir", "-m", "777", planted);
  const state = path.join(tmp, "state");
  const r = await server([], { TMPDIR: shared, STATE_DIRECTORY: state });
  t.ok(r.listening, r.out);
  t.same(await readdir(planted), [], "nothing written where nobody planted its directory");
  const dir = await lstat(path.join(state, "certs"));
  t.equal(dir.mode & 0o777, 0o700, "the state directory is 0700");
  t.equal(dir.uid, 0);
  t.equal((await lstat(path.join(state, "certs", "ca.key"))).mode & 0o777, 0o600, "the CA key is 0600");
});

t.test("a --cert-dir someone else planted is refused and nothing is written", async (t) => {
  const theirs = path.join(shared, "theirs");
  asNobody("mkdir", "-m", "700", theirs);
  const r = await server(["--cert-dir", theirs]);
  t.notOk(r.listening);
  t.equal(r.code, 1);
  t.match(r.out, `${theirs} is owned by uid ${NOBODY}`);

  const open = path.join(shared, "open");
  asNobody("mkdir", "-m", "777", open);
  const r2 = await server(["--cert-dir", path.join(open, "certs")]);
  t.equal(r2.code, 1, "nor one inside a directory of theirs");
  t.same(await readdir(open), [], "nothing created in it");
});

t.test("a link planted as --cert-dir is refused: root never writes where it points", async (t) => {
  const link = path.join(shared, "link");
  asNobody("ln", "-s", victimDir, link);
  const r = await server(["--cert-dir", link]);
  t.equal(r.code, 1);
  t.match(r.out, /owned by uid 65534|is a link/);
  t.equal(await readFile(path.join(victimDir, "ca.key"), "utf8"), "root's own secret\n", "the 0600 file is untouched");
  t.same((await readdir(victimDir)).sort(), ["ca.key"]);
});

t.test("a directory of its own that others can read is refused until chmod 700", async (t) => {
  const loose = path.join(tmp, "loose");
  await mkdir(loose, { mode: 0o755 });
  await chmod(loose, 0o755);
  const r = await server(["--cert-dir", loose]);
  t.equal(r.code, 1);
  t.match(r.out, /mode 0755: others could read or change the CA key kept there; chmod 700/);
  await chmod(loose, 0o700);
  const ok = await server(["--cert-dir", loose]);
  t.ok(ok.listening, ok.out);
});
