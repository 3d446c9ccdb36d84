// The NodeGroupConfiguration corpus (test/fixtures/ngc-corpus) the way an operator runs it:
// rendered by the bundle server's renderer and applied by the built agent (`bashible once`) on a
// booted Debian node (systemd-nspawn of a cached debootstrap root, no Node.js on it). Each
// script's effect is checked, and a forced second converge changes no file and fires no
// handler again. Needs root.
import t from "tap";
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { lstat, mkdir, mkdtemp, readdir, readFile, readlink, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { loadConfigDir } from "../../cluster/sources/directory.ts";
import { renderGroup } from "../../cluster/render/render.ts";
import type { RenderInputs } from "../../cluster/render/inputs.ts";
import { buildDist } from "../../scripts/build.ts";
import { nodeForTest, type NspawnNode } from "../../scripts/lib/nspawn-node.ts";
import { debianRoot } from "../../scripts/lib/debian-root.ts";
import { requireRoot } from "../fixtures/root.ts";

await requireRoot("debootstrap, overlayfs, systemd-nspawn");

const run = promisify(execFile);
const HERE = path.dirname(fileURLToPath(import.meta.url));
const corpus = (await loadConfigDir(path.resolve(HERE, "../fixtures/ngc-corpus"))).snapshot.inputs.configurations;
const example = (await loadConfigDir(path.resolve(HERE, "../../examples/cluster"))).snapshot.inputs as RenderInputs;
const PACKAGE = "bb-test-hello";

const work = await mkdtemp(path.join(os.tmpdir(), "ngc-node-"));
t.teardown(() => rm(work, { recursive: true, force: true }));
const dist = path.join(work, "dist");
await buildDist(dist);
const { dir: lower } = await debianRoot({ log: (l) => t.comment(l) });

// The corpus's package, in a local apt repository the node reads instead of the network.
const pkg = path.join(work, "pkg");
await mkdir(path.join(pkg, "DEBIAN"), { recursive: true });
await mkdir(path.join(pkg, "usr/share", PACKAGE), { recursive: true });
await writeFile(
  path.join(pkg, "DEBIAN/control"),
  `Package: ${PACKAGE}\nVersion: 1.2-1\nArchitecture: all\nMaintainer: test <test@example.com>\nDescription: test package\n`,
);
await writeFile(path.join(pkg, "usr/share", PACKAGE, "hello"), "hello\n");
const repo = path.join(work, "repo");
await mkdir(repo);
await run("dpkg-deb", ["--build", pkg, path.join(repo, `${PACKAGE}_1.2-1_all.deb`)]);
await writeFile(path.join(repo, "Packages"), (await run("dpkg-scanpackages", ["."], { cwd: repo })).stdout);

// The custom scripts and one built-in step that needs no cluster packages (004, the PATH
// drop-in, which a corpus script patches); the other built-in steps are proven elsewhere.
const inputs: RenderInputs = { ...structuredClone(example), configurations: corpus };
inputs.context.proxy = { httpProxy: "http://proxy.example.com:3128", noProxy: ["127.0.0.1", ".cluster.local"] };
const { makeBundle } = await import("../../scripts/lib/bundle.ts");
const bundleOf = (i: RenderInputs) => {
  const rendered = renderGroup(i.nodeGroups[0]!, i, Date.now()).bundle;
  return makeBundle(
    rendered.steps.filter((s) => s.kind === "Script" || s.kind === "DeckhousePath"),
    { context: rendered.context },
  );
};
const bundle = bundleOf(inputs);

/** Every regular file, link and directory under the node's upper layer, by content (not mtime). */
async function snapshot(dir: string, skip: RegExp): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  const walk = async (rel: string) => {
    for (const name of await readdir(path.join(dir, rel))) {
      const r = path.join(rel, name);
      if (skip.test(r)) continue;
      const st = await lstat(path.join(dir, r));
      if (st.isDirectory()) {
        out.set(r, `dir ${(st.mode & 0o7777).toString(8)}`);
        await walk(r);
      } else if (st.isSymbolicLink()) out.set(r, `link ${await readlink(path.join(dir, r))}`);
      else if (st.isFile()) {
        const h = createHash("sha256")
          .update(await readFile(path.join(dir, r)))
          .digest("hex");
        out.set(r, `file ${(st.mode & 0o7777).toString(8)} ${h}`);
      } else out.set(r, `special ${st.mode}`);
    }
  };
  await walk("");
  return out;
}

t.test("Deckhouse-style NGC scripts, rendered by the server, applied by the agent on a booted node", async (t) => {
  const node: NspawnNode = await nodeForTest(t, {
    root: lower,
    name: "worker-1",
    nspawnArgs: [`--bind-ro=${dist}:/mnt`, `--bind-ro=${repo}:/srv/repo`],
    // The corpus asks for a reboot, and a first run reboots (as Deckhouse's does).
    restartOnReboot: true,
    beforeBoot: async (rootfs) => {
      await writeFile(path.join(rootfs, "etc/apt/sources.list"), "deb [trusted=yes] file:/srv/repo ./\n");
      await rm(path.join(rootfs, "etc/apt/sources.list.d"), { recursive: true, force: true });
      await mkdir(path.join(rootfs, "etc/apt/sources.list.d"));
      await mkdir(path.join(rootfs, "etc/motd.d"), { recursive: true });
      await writeFile(path.join(rootfs, "etc/motd.d/99-stale"), "left from before\n");
      // As bootstrap.sh leaves it: the first converge needs no approval, not even to reboot.
      await mkdir(path.join(rootfs, "var/lib/bashible"), { recursive: true });
      await writeFile(path.join(rootfs, "var/lib/bashible/first_run"), "");
    },
  });
  await node.writeFile("/root/bundle.json", JSON.stringify(bundle));
  const once = async (label: string) => {
    const r = await node.exec(["/mnt/bashible", "once", "--bundle", "/root/bundle.json", "--node-name", "worker-1"], {
      timeoutMs: 300_000,
    });
    t.equal(r.exitCode, 0, `${label}: ${r.stdout.slice(-3000)}${r.stderr.slice(-1000)}`);
    return r;
  };
  // The machine goes down under the run it rebooted: its exit status is not the point.
  await node.exec(["/mnt/bashible", "once", "--bundle", "/root/bundle.json", "--node-name", "worker-1"], {
    timeoutMs: 300_000,
  });
  await node.waitBoot(2, 180_000);
  t.equal(node.boots, 2, "the corpus asked for a reboot (a kernel module, a package): the first run rebooted");
  const status = JSON.parse((await node.mustExec(["/mnt/bashible", "status", "--json"])).stdout);
  const ran = status.steps
    .filter((s: { outcome: string }) => s.outcome === "changed")
    .map((s: { name: string }) => s.name);
  t.notOk(ran.includes("060_ubuntu-only.sh"), "bundles: [ubuntu-lts] does not run on Debian");
  t.ok(ran.includes("031_add-custom-ca.sh"), "bundles: [ubuntu-lts, debian] does");
  t.equal(status.lastRun.outcome, "applied", "after the whole converge was recorded");

  const file = async (p: string) => (await node.mustExec(["cat", p])).stdout;
  const exists = async (p: string) => (await node.exec(["test", "-e", p])).exitCode === 0;
  const events = async () => (await node.exec(["cat", "/var/lib/bashible/corpus-events"])).stdout;
  t.equal(await file("/etc/sysctl.d/90-bashible-corpus.conf"), "vm.max_map_count = 262144\n");
  t.equal(await events(), "ca updated\nsysctl applied\n", "each delayed handler ran once, after its step");
  t.match(await file("/usr/local/share/ca-certificates/example_ca.crt"), /BEGIN CERTIFICATE/);
  t.equal(
    (await node.mustExec(["readlink", "/etc/ssl/certs/example_ca.pem"])).stdout.trim(),
    "/usr/local/share/ca-certificates/example_ca.crt",
    "update-ca-certificates put it in the store",
  );
  t.match(await file("/etc/containerd/conf.d/mirror.toml"), /registry\.example\.com/);
  t.equal(await file("/etc/modules-load.d/br_netfilter.conf"), "br_netfilter\n");
  t.ok(await exists(`/usr/share/${PACKAGE}/hello`), "the package is installed with apt");
  t.notOk(await exists("/etc/ubuntu-only-ran"));
  t.equal(await file("/etc/node-role"), "static worker worker\n");
  t.match(await file("/etc/profile.d/profile-proxy.sh"), /^export HTTP_PROXY=http:\/\/proxy\.example\.com:3128\n/);
  t.same(
    (await node.mustExec(["ls", "/etc/motd.d"])).stdout.trim().split("\n").sort(),
    ["10-managed", "20-version"],
    "the stale file is gone",
  );
  t.ok(await exists("/etc/once-done"));
  t.notOk(await exists("/etc/once-never"), "nothing after exit 0 / return 0 ran");
  t.equal(await file("/etc/after-stdin"), "the rest of the script ran\n");
  const DROP_IN = "/etc/profile.d/02-deckhouse-path.sh";
  t.match(await file(DROP_IN), /\nexport CORPUS_PATCHED=1\n$/, "the script patched the built-in step's file");

  // A forced full run: every script runs again and changes nothing.
  const ignore =
    /^(var\/lib\/bashible|var\/log|var\/cache|var\/lib\/apt|var\/lib\/systemd|tmp|run|root|opt\/deckhouse\/tmp)(\/|$)/;
  const before = await snapshot(node.upper, ignore);
  await node.mustExec(["rm", "/var/lib/bashible/configuration_checksum"]);
  const second = await once("second converge");
  t.match(second.stdout, /full run forced/, "the scripts ran again");
  t.equal(await events(), "ca updated\nsysctl applied\n", "no handler ran again");
  t.notOk(await exists("/var/lib/bashible/.bb-workspace/flag/reboot"), "nothing asks for a reboot again");
  const after = await snapshot(node.upper, ignore);
  const changed = [...new Set([...before.keys(), ...after.keys()])].filter((k) => before.get(k) !== after.get(k));
  t.same(changed, [], "the second converge changed no file");

  // A new configuration that changes nothing any of these scripts reads: the built-in step
  // rewrites its drop-in (the patch is drift to it), and the patching script, unchanged, runs in
  // the same converge, as Deckhouse runs every step of every converge, so the patch is back at
  // once, not at the next 4-hour epoch.
  const next = structuredClone(inputs);
  next.configurations.push({
    metadata: { name: "unrelated.sh" },
    spec: { content: "true\n", weight: 200, nodeGroups: ["*"], bundles: ["*"] },
  });
  await node.writeFile("/root/bundle.json", JSON.stringify(bundleOf(next)));
  const third = await once("a converge to a new configuration");
  t.match(third.stdout, /004_add_deckhouse_paths: changed/, "the built-in step rewrote its file");
  t.match(third.stdout, /005_patch-path-dropin\.sh: changed/, "the unchanged script ran again");
  t.match(await file(DROP_IN), /\nexport CORPUS_PATCHED=1\n$/, "and the patch is there after the converge");
  const plan = await node.exec(["/mnt/bashible", "plan", "--bundle", "/root/bundle.json", "--node-name", "worker-1"]);
  // In sync: no converge is due, so no script is. (The built-in step's own plan still shows the
  // patch as drift: a converge would rewrite the file, and the script patch it again.)
  t.match(plan.stdout, /gate: in sync/, "no converge due afterwards");
  t.notMatch(plan.stdout, /\(Script\): (?!in sync)/, "no script due");
});
