// Confinement on a real root: the built agent converges a booted Debian node (systemd-nspawn,
// systemd as PID 1, no Node.js) as root, and a NodeUser — acting as herself, with runuser —
// plants links in her home. Nothing outside her home changes and nothing of /etc/shadow shows.
import t from "tap";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { buildDist } from "../../scripts/build.ts";
import { nodeForTest, type NspawnNode } from "../../scripts/lib/nspawn-node.ts";
import { debianRoot } from "../../scripts/lib/debian-root.ts";
import { makeBundle } from "../../scripts/lib/bundle.ts";
import type { BundleStep } from "../../bundles/types.ts";
import { requireRoot } from "../fixtures/root.ts";

await requireRoot("debootstrap, overlayfs, systemd-nspawn");

const SECRET_HASH = "$6$nodesalt$THIS-SHADOW-HASH-MUST-NEVER-SHOW";
const KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMallory mallory@laptop";
const users = (keys: string[]): BundleStep => ({
  name: "000_add_node_users",
  kind: "NodeUsers",
  spec: { users: [{ name: "mallory", uid: 1666, sshPublicKeys: keys, isSudoer: false, extraGroups: [] }] },
});

const { dir: lower } = await debianRoot({ log: (l) => t.comment(l) });
const dist = await mkdtemp(path.join(os.tmpdir(), "bashible-dist-"));
t.teardown(() => rm(dist, { recursive: true, force: true }));
await buildDist(dist);

async function once(node: NspawnNode, steps: BundleStep[]) {
  await node.writeFile("/root/bundle.json", JSON.stringify(makeBundle(steps)));
  const run = await node.exec(["/mnt/bashible", "once", "--bundle", "/root/bundle.json", "--retry-interval", "0"]);
  const plan = await node.exec(["/mnt/bashible", "plan", "--bundle", "/root/bundle.json"]);
  // status exits 3 when steps reported problems (the links this suite plants).
  const shown = await node.exec(["/mnt/bashible", "status", "--json"]);
  if (shown.exitCode !== 0 && shown.exitCode !== 3) throw new Error(`status exited ${shown.exitCode}: ${shown.stderr}`);
  const status = JSON.parse(shown.stdout);
  return { run, plan, status, statusCode: shown.exitCode, all: run.stdout + run.stderr + plan.stdout + plan.stderr };
}

/** Mode, owner and listing of /etc: what a redirected write, chmod or chown would change. */
const etcState = async (node: NspawnNode) =>
  (await node.mustExec(["sh", "-c", "stat -c '%a %u:%g' /etc; ls -A /etc | sort | sha256sum; sha256sum /etc/shadow"]))
    .stdout;

t.test("on a booted node, a NodeUser's links in her home redirect nothing", async (t) => {
  const node = await nodeForTest(t, { root: lower, nspawnArgs: [`--bind-ro=${dist}:/mnt`] });
  await node.mustExec(["usermod", "-p", SECRET_HASH, "root"]);
  const first = await once(node, [users([KEY])]);
  t.equal(first.run.exitCode, 0, first.all);
  t.equal((await node.mustExec(["cat", "/home/deckhouse/mallory/.ssh/authorized_keys"])).stdout, `${KEY}\n`);

  // mallory, as herself, turns ~/.ssh into a link to /etc.
  await node.mustExec(["runuser", "-u", "mallory", "--", "sh", "-c", "rm -rf ~/.ssh && ln -s /etc ~/.ssh"]);
  const before = await etcState(node);
  const second = await once(node, [users([KEY, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINew new@x"])]);
  t.equal(await etcState(node), before, "/etc: mode, owner, entries and shadow unchanged");
  t.not((await node.exec(["test", "-e", "/etc/authorized_keys"])).exitCode, 0, "no authorized_keys in /etc");
  t.match(second.status.steps[0].problems, [{ subject: "NodeUser mallory", message: /\.ssh is a symbolic link/ }]);

  // Now authorized_keys itself points at /etc/shadow.
  await node.mustExec([
    "runuser",
    "-u",
    "mallory",
    "--",
    "sh",
    "-c",
    "rm ~/.ssh && mkdir -m 700 ~/.ssh && ln -s /etc/shadow ~/.ssh/authorized_keys",
  ]);
  const third = await once(node, [users([KEY, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIThird third@x"])]);
  t.notMatch(third.all, /THIS-SHADOW-HASH/, "the shadow file's content is in no output");
  const journal = await node.exec(["sh", "-c", "cat /var/log/d8/bashible/*.log"]);
  t.notMatch(journal.stdout, /THIS-SHADOW-HASH/, "nor in a step log");
  t.equal(await etcState(node), before, "/etc/shadow untouched");
  t.match(third.status.steps[0].problems, [{ message: /authorized_keys is a symbolic link/ }]);
});
