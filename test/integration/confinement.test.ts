// Confinement, tried as an attacker would: links planted inside a sandbox root before (or
// during) a run must never make the agent write, chmod, chown, read into a plan or execute
// anything outside what it manages. Each case checks the error, that the world outside is
// byte-for-byte unchanged, and that no secret reached stdout, logs or the plan. Needs root
// (NodeUsers own their homes; the agent chowns).
import t, { type Test } from "tap";
import { chmod, chown, lstat, mkdir, mkdtemp, readFile, rename, rm, stat, symlink, writeFile } from "node:fs/promises";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import os from "node:os";
import path from "node:path";
import { bashible } from "../../scripts/lib/cli.ts";
import { makeBundle, sandbox, treeHash, writeBundle } from "../../scripts/lib/bundle.ts";
import type { BundleStep } from "../../bundles/types.ts";
import { Host } from "../../host/host.ts";
import { osProfile } from "../../agent/converge/converge.ts";
import { applyPrimitive } from "../../host/primitives.ts";
import { hostFlags } from "../../host/flags.ts";
import { planFile } from "../../host/file-plan.ts";
import { requireRoot } from "../fixtures/root.ts";

await requireRoot("homes owned by NodeUsers, chown");

const execFileP = promisify(execFile);

const SECRET = "root:$6$SHADOW-SECRET-HASH$doNotShowThisAnywhere:19000:0:99999:7:::";
const KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMallory mallory@laptop";

/** A directory outside the sandbox standing in for the real /etc: what an attack would hit. */
async function outside(t: Test): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), "bashible-outside-"));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  await writeFile(path.join(dir, "shadow"), `${SECRET}\n`, { mode: 0o640 });
  await writeFile(path.join(dir, "passwd"), "root:x:0:0:root:/root:/bin/bash\n", { mode: 0o644 });
  await mkdir(path.join(dir, "opt/deckhouse/bin"), { recursive: true });
  return dir;
}

/** How the outside looks: every path, mode, owner and content. */
async function snapshot(dir: string): Promise<string> {
  const st = await stat(dir);
  return `${st.mode} ${st.uid}:${st.gid} ${await treeHash(dir)}`;
}

async function nodeRoot(t: Test): Promise<string> {
  const root = await sandbox();
  t.teardown(() => rm(root, { recursive: true, force: true }));
  await writeFile(path.join(root, "etc/passwd"), "root:x:0:0:root:/root:/bin/bash\n");
  await writeFile(path.join(root, "etc/group"), "root:x:0:\nusers:x:100:\n");
  await writeFile(path.join(root, "etc/shadow"), "root:*:19000:0:99999:7:::\n", { mode: 0o640 });
  await writeFile(path.join(root, "etc/gshadow"), "root:*::\nusers:*::\n", { mode: 0o640 });
  await writeFile(path.join(root, "etc/sudoers"), "root ALL=(ALL:ALL) ALL\n", { mode: 0o440 });
  return root;
}

const users = (keys = [KEY]): BundleStep => ({
  name: "000_add_node_users",
  kind: "NodeUsers",
  spec: { users: [{ name: "mallory", uid: 1666, sshPublicKeys: keys, isSudoer: false, extraGroups: [] }] },
});

async function once(root: string, steps: BundleStep[]) {
  const file = await writeBundle(path.dirname(root), makeBundle(steps), `b-${path.basename(root)}.json`);
  const r = await bashible(["once", "--root", root, "--bundle", file, "--retry-interval", "0", "--log-format", "json"]);
  const p = await bashible(["plan", "--root", root, "--bundle", file]);
  const status = JSON.parse((await bashible(["status", "--root", root, "--json"])).stdout);
  return { once: r, plan: p, status, all: r.stdout + r.stderr + p.stdout + p.stderr };
}

const home = (root: string) => path.join(root, "home/deckhouse/mallory");

t.test("a NodeUser's ~/.ssh turned into a link to /etc: nothing is written, chmodded or chowned there", async (t) => {
  const root = await nodeRoot(t);
  const out = await outside(t);
  t.equal((await once(root, [users()])).once.status, 0, "mallory exists");
  // mallory (uid 1666 owns her home) replaces ~/.ssh with a link to "/etc".
  await rm(path.join(home(root), ".ssh"), { recursive: true });
  await symlink(out, path.join(home(root), ".ssh"));
  await chown(path.join(home(root), ".ssh"), 1666, 100).catch(() => undefined);
  const before = await snapshot(out);
  const r = await once(root, [users([KEY, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINew new@x"])]);
  t.equal(await snapshot(out), before, "outside: no file, mode or owner changed");
  t.match(r.status.steps[0].problems, [
    { subject: "NodeUser mallory", message: /\.ssh is a symbolic link .*left alone/ },
  ]);
  t.match(r.plan.stdout, /NodeUser mallory: .*\.ssh is a symbolic link/);
  t.notMatch(r.all, /SHADOW-SECRET/);
});

t.test("authorized_keys linked to a shadow file: its content never reaches a plan, a log or the target", async (t) => {
  const root = await nodeRoot(t);
  const out = await outside(t);
  await once(root, [users()]);
  const keys = path.join(home(root), ".ssh/authorized_keys");
  await rm(keys);
  await symlink(path.join(out, "shadow"), keys);
  const before = await snapshot(out);
  const r = await once(root, [users([KEY, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINew new@x"])]);
  t.notMatch(r.all, /SHADOW-SECRET/, "the target's content is in no output");
  t.equal(await snapshot(out), before, "the target is untouched");
  t.match(r.status.steps[0].problems, [{ message: /authorized_keys is a symbolic link/ }]);
  t.ok((await lstat(keys)).isSymbolicLink(), "left alone for a person to look at");
});

for (const [what, nodePath, steps] of [
  ["/home/deckhouse", "home/deckhouse", [users()]],
  ["/etc/profile.d", "etc/profile.d", [{ name: "004_add_deckhouse_paths", kind: "DeckhousePath", spec: {} }]],
  ["/opt (an intermediate directory)", "opt", [{ name: "004_add_deckhouse_paths", kind: "DeckhousePath", spec: {} }]],
  [
    "the CA anchors directory",
    "usr/local/share/ca-certificates",
    [{ name: "003_install_ca_certificates", kind: "CACertificates", spec: { certificates: [] } }],
  ],
] as [string, string, BundleStep[]][]) {
  t.test(`a link at ${what} is refused with the path and the link named`, async (t) => {
    const root = await nodeRoot(t);
    const out = await outside(t);
    await mkdir(path.dirname(path.join(root, nodePath)), { recursive: true });
    await symlink(out, path.join(root, nodePath));
    if (steps[0]?.kind === "CACertificates") {
      // give it something to write
      const { createCA } = await import("../../scripts/lib/pki.ts");
      const ca = await createCA(out, "x", "X");
      (steps[0].spec as { certificates: unknown[] }).certificates = [
        { name: "x", pem: await readFile(ca.cert, "utf8") },
      ];
    }
    const before = await snapshot(out);
    const r = await once(root, steps);
    t.equal(r.once.status, 1, "the run fails");
    t.match(r.all, new RegExp(`/${nodePath.split("/")[0]}[^ ]* is a symbolic link \\(to ${out}\\); refused`));
    t.equal(await snapshot(out), before, "nothing outside changed");
    t.match(r.once.stdout, /"permanent":true/, "not retried: waiting cannot fix it");
  });
}

t.test("a package store reached through a link: no script found there is ever run", async (t) => {
  const root = await nodeRoot(t);
  const out = await outside(t);
  // An "installed" package outside the root, marked as ours, with an uninstall that would show.
  await mkdir(path.join(out, "evil"), { recursive: true });
  await writeFile(path.join(out, "evil/digest"), `sha256:${"e".repeat(64)}\n`);
  await writeFile(path.join(out, "evil/installed-by"), "bashible\n");
  await writeFile(path.join(out, "evil/uninstall"), `touch ${out}/UNINSTALL-RAN\n`, { mode: 0o755 });
  await mkdir(path.join(root, "var/cache"), { recursive: true });
  await symlink(out, path.join(root, "var/cache/registrypackages"));
  const before = await snapshot(out);
  const r = await once(root, [
    { name: "007_fetch_registry_packages", kind: "RegistryPackages", spec: { packages: [] } },
  ]);
  t.equal(r.once.status, 1);
  t.match(r.all, /\/var\/cache\/registrypackages is a symbolic link/);
  t.equal(await snapshot(out), before, "no uninstall ran, nothing changed");
});

t.test("a package directory swapped for a link is never executed", async (t) => {
  const root = await nodeRoot(t);
  const out = await outside(t);
  await mkdir(path.join(out, "evil"), { recursive: true });
  await writeFile(path.join(out, "evil/installed-by"), "bashible\n");
  await writeFile(path.join(out, "evil/uninstall"), `touch ${out}/UNINSTALL-RAN\n`, { mode: 0o755 });
  await mkdir(path.join(root, "var/cache/registrypackages"), { recursive: true });
  await symlink(path.join(out, "evil"), path.join(root, "var/cache/registrypackages/evil"));
  const r = await once(root, [
    { name: "007_fetch_registry_packages", kind: "RegistryPackages", spec: { packages: [] } },
  ]);
  t.equal(r.once.status, 0, "a link in the store is not a package of ours");
  await t.rejects(stat(path.join(out, "UNINSTALL-RAN")), { code: "ENOENT" }, "its uninstall never ran");
});

t.test("a link swapped in between plan and apply is refused at the write", async (t) => {
  const root = await nodeRoot(t);
  const out = await outside(t);
  const host = new Host(root, await osProfile(root));
  await mkdir(path.join(root, "home/deckhouse/mallory/.ssh"), { recursive: true });
  const change = await planFile(host, {
    path: "/home/deckhouse/mallory/.ssh/authorized_keys",
    content: `${KEY}\n`,
    mode: 0o600,
    uid: 1666,
    gid: 100,
  });
  if (!change) throw new Error("nothing planned");
  // Between the plan and the write, ~/.ssh becomes a link to the outside.
  await rename(path.join(home(root), ".ssh"), path.join(home(root), ".ssh-old"));
  await symlink(out, path.join(home(root), ".ssh"));
  const before = await snapshot(out);
  await t.rejects(applyPrimitive(host, change, { secrets: [], flags: hostFlags(host) }), /\.ssh is a symbolic link/);
  t.equal(await snapshot(out), before);
});

t.test("links real systems ship are followed inside the root, as a chroot would", async (t) => {
  const root = await nodeRoot(t);
  // Debian: /var/run → /run (absolute). The converge lock (/run/bashible) is reached through it.
  await mkdir(path.join(root, "run"), { recursive: true });
  await mkdir(path.join(root, "var"), { recursive: true });
  await symlink("/run", path.join(root, "var/run"));
  const r = await once(root, [{ name: "004_add_deckhouse_paths", kind: "DeckhousePath", spec: {} }]);
  t.equal(r.once.status, 0, r.all);
  const host = new Host(root, await osProfile(root));
  t.equal(await host.fs.realPath("/var/run/bashible/x"), path.join(root, "run/bashible/x"));
  // The same name planted by someone else in a directory they can write is refused.
  await mkdir(path.join(root, "tmp"), { mode: 0o1777 });
  await symlink("/etc", path.join(root, "tmp/lock"));
  await t.rejects(host.readText("/tmp/lock/passwd"), /symbolic link/);
  // And a path in a directory anyone can write is never handed to a program as a string.
  await chmod(path.join(root, "tmp"), 0o1777);
  await t.rejects(host.fs.realPath("/tmp/x"), /\/tmp can be written by others \(owner uid 0, mode 1777\)/);
});

t.test("a lock planted by any user where Deckhouse keeps it does not stop converges", async (t) => {
  const root = await nodeRoot(t);
  // Debian: /var/lock → /run/lock, mode 1777. An unprivileged user plants "the holder is pid 1"
  // (alive forever) and, in a second round, a FIFO that would block a reader.
  await mkdir(path.join(root, "run/lock"), { recursive: true });
  await chmod(path.join(root, "run/lock"), 0o1777);
  await mkdir(path.join(root, "var"), { recursive: true });
  await symlink("/run/lock", path.join(root, "var/lock"));
  const pid1Start = (await readFile("/proc/1/stat", "utf8")).split(") ")[1]?.split(" ")[19];
  await writeFile(path.join(root, "run/lock/bashible"), `1 ${pid1Start}\n`);
  await chown(path.join(root, "run/lock/bashible"), 65534, 65534);
  const step: BundleStep = { name: "004_add_deckhouse_paths", kind: "DeckhousePath", spec: {} };
  t.equal((await once(root, [step])).once.status, 0, "converged despite the planted lock");
  await rm(path.join(root, "run/lock/bashible"));
  await execFileP("mkfifo", [path.join(root, "run/lock/bashible")]);
  await rm(path.join(root, "var/lib/bashible/configuration_checksum"));
  t.equal((await once(root, [step])).once.status, 0, "converged despite a FIFO");
  // The real lock's directory is root's alone; if someone made it writable, converges stop
  // with an error that says so instead of trusting it.
  await chmod(path.join(root, "run/bashible"), 0o777);
  await rm(path.join(root, "var/lib/bashible/configuration_checksum"));
  const r = await once(root, [step]);
  t.equal(r.once.status, 1);
  t.match(r.all, /\/run\/bashible can be written by others/);
});
