// The NodeGroupConfiguration corpus (test/fixtures/ngc-corpus): Deckhouse-style scripts rendered
// by the bundle server's renderer and run unchanged, as the agent runs steps (in weight order,
// bash -eEo pipefail with the helper library sourced, the script sourced from a file, spec.bundles
// honoured), as root in a chroot of a debootstrapped Debian root. Each script's effect is checked,
// and a second converge changes nothing. Needs root (and debootstrap, the first time).
import t from "tap";
import { createHash } from "node:crypto";
import { lstat, mkdir, readdir, readFile, readlink, writeFile } from "node:fs/promises";
import { existsSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { loadConfigDir } from "../../cluster/sources/directory.ts";
import { renderGroup } from "../../cluster/render/render.ts";
import type { RenderInputs } from "../../cluster/render/inputs.ts";
import type { ScriptSpec } from "../../bundles/types.ts";
import { bundlesSelect } from "../../bundles/os-families.ts";
import { chrootRoot, type ChrootRoot } from "../lib/chroot-root.ts";
import { debianRoot } from "../../scripts/lib/debian-root.ts";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const CORPUS = path.resolve(HERE, "../fixtures/ngc-corpus");
const EXAMPLE = path.resolve(HERE, "../../examples/cluster");

const isRoot = process.getuid?.() === 0;
const skip = isRoot ? false : "needs root (debootstrap, chroot, overlay mount)";

const corpus = (await loadConfigDir(CORPUS)).snapshot.inputs.configurations;
const example = (await loadConfigDir(EXAMPLE)).snapshot.inputs as RenderInputs;

t.test("the corpus has at least ten scripts", async (t) => {
  t.ok(corpus.length >= 10, `${corpus.length} scripts`);
});

t.test("every corpus script renders and parses as bash", async (t) => {
  const inputs: RenderInputs = { ...structuredClone(example), configurations: corpus };
  inputs.context.proxy = { httpProxy: "http://proxy.example.com:3128", noProxy: ["127.0.0.1", ".cluster.local"] };
  const steps = renderGroup(inputs.nodeGroups[0]!, inputs, Date.now()).bundle.steps.filter((s) => s.kind === "Script");
  t.equal(steps.length, corpus.length);
});

/** Every file under the overlay's upper directory (what the steps wrote), by content. */
async function snapshot(dir: string, skipRel: RegExp): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  const walk = async (rel: string) => {
    for (const name of await readdir(path.join(dir, rel))) {
      const r = path.join(rel, name);
      if (skipRel.test(r)) continue;
      const st = await lstat(path.join(dir, r));
      if (st.isDirectory()) {
        out.set(r, `dir ${(st.mode & 0o7777).toString(8)}`);
        await walk(r);
      } else if (st.isSymbolicLink()) out.set(r, `link ${await readlink(path.join(dir, r))}`);
      else if (!st.isFile())
        out.set(r, `special ${st.mode}`); // overlay whiteouts (deleted files)
      else {
        const hash = createHash("sha256")
          .update(await readFile(path.join(dir, r)))
          .digest("hex");
        out.set(r, `file ${(st.mode & 0o7777).toString(8)} ${st.mtimeMs} ${hash}`);
      }
    }
  };
  await walk("");
  return out;
}

t.test("Deckhouse-style NGC scripts run unchanged on a Debian node, and converge", { skip }, async (t) => {
  // A node's root (NODE_PACKAGES: ca-certificates among them), built once and cached.
  const node: ChrootRoot = await chrootRoot((await debianRoot()).dir);
  t.teardown(() => node.cleanup());
  const inputs: RenderInputs = { ...structuredClone(example), configurations: corpus };
  inputs.context.proxy = { httpProxy: "http://proxy.example.com:3128", noProxy: ["127.0.0.1", ".cluster.local"] };
  const bundle = renderGroup(inputs.nodeGroups[0]!, inputs, Date.now()).bundle;
  const scripts = bundle.steps.filter((s) => s.kind === "Script") as { name: string; spec: ScriptSpec }[];
  const osId = /^ID=(.*)$/m.exec(await readFile(path.join(node.root, "etc/os-release"), "utf8"))![1]!.replace(/"/g, "");
  t.equal(osId, "debian");
  await mkdir(path.join(node.root, "etc/motd.d"), { recursive: true });
  await writeFile(path.join(node.root, "etc/motd.d/99-stale"), "left from before\n");

  const env = {
    NODE_GROUP: "worker",
    D8_NODE_HOSTNAME: "worker-1",
    FIRST_BASHIBLE_RUN: "no",
    BUNDLE: "debian",
    BASHIBLE_HTTP_PROXY: "http://proxy.example.com:3128",
    BASHIBLE_NO_PROXY: "127.0.0.1,.cluster.local",
  };
  /** One converge: each selected script in order, then what the agent does after a good run. */
  const converge = async (label: string) => {
    const ran: string[] = [];
    for (const s of scripts) {
      if (!bundlesSelect(s.spec.bundles, osId)) continue;
      const file = `/var/lib/bashible/bundle_steps/${s.name}`;
      await mkdir(path.dirname(path.join(node.root, file)), { recursive: true });
      await writeFile(path.join(node.root, file), s.spec.script);
      const r = await node.step(file, { ...env, BASHIBLE_STEP: s.name });
      t.equal(r.code, 0, `${label}: ${s.name} succeeds${r.code ? `: ${r.stderr.slice(-800)}` : ""}`);
      ran.push(s.name);
    }
    const flags = path.join(node.root, "var/lib/bashible/.bb-workspace/flag");
    const set = existsSync(flags) ? (await readdir(flags)).sort() : [];
    // The agent, after a successful converge: handles restart/reboot requests and clears them.
    await node.script(
      "bb-run-finished\nbb-flag-unset reboot\nbb-flag-unset containerd-need-restart\nbb-flag-unset disruption\n",
    );
    return { ran, flags: set };
  };

  const first = await converge("first converge");
  t.notOk(first.ran.includes("060_ubuntu-only.sh"), "bundles: [ubuntu-lts] does not run on Debian");
  t.ok(first.ran.includes("031_add-custom-ca.sh"), "bundles: [ubuntu-lts, debian] does");
  t.same(first.flags, ["apt-updated", "containerd-need-restart", "reboot"], "restart and reboot asked for");

  const file = (p: string) => readFile(path.join(node.root, p), "utf8");
  const events = async () => file("var/lib/bashible/corpus-events").catch(() => "");
  t.equal(await file("etc/sysctl.d/90-bashible-corpus.conf"), "vm.max_map_count = 262144\n");
  t.equal(await events(), "ca updated\nsysctl applied\n", "each delayed handler ran once, after its step");
  t.match(await file("usr/local/share/ca-certificates/example_ca.crt"), /BEGIN CERTIFICATE/);
  t.equal(
    await readlink(path.join(node.root, "etc/ssl/certs/example_ca.pem")),
    "/usr/local/share/ca-certificates/example_ca.crt",
    "update-ca-certificates put it in the store",
  );
  t.match(
    await file("etc/containerd/conf.d/mirror.toml"),
    /mirrors\."registry\.example\.com"\]\n.*"https:\/\/registry\.example\.com"\]/,
  );
  t.equal(await file("etc/modules-load.d/br_netfilter.conf"), "br_netfilter\n");
  t.ok(existsSync(path.join(node.root, "usr/share/bb-test-hello/hello")), "the package is installed");
  t.notOk(existsSync(path.join(node.root, "etc/ubuntu-only-ran")));
  t.equal(await file("etc/node-role"), "static worker worker\n");
  t.equal(await file("etc/kubernetes-apiservers"), "127.0.0.1:6443\n");
  t.match(await file("etc/profile.d/90-users.sh"), /^# 0: tuning environment for user alice \(uid 1100\)\n$/);
  t.equal(
    await file("etc/profile.d/profile-proxy.sh"),
    "export HTTP_PROXY=http://proxy.example.com:3128\nexport http_proxy=http://proxy.example.com:3128\nexport NO_PROXY=127.0.0.1,.cluster.local\nexport no_proxy=127.0.0.1,.cluster.local\n",
  );
  t.same(
    (await readdir(path.join(node.root, "etc/motd.d"))).sort(),
    ["10-managed", "20-version"],
    "the stale file is gone",
  );
  t.equal(await file("etc/motd.d/10-managed"), "Managed by WORKER node group\n");
  t.ok(existsSync(path.join(node.root, "etc/once-done")));
  t.notOk(existsSync(path.join(node.root, "etc/once-never")), "nothing after exit 0 / return 0 ran");
  t.equal(await file("etc/after-stdin"), "the rest of the script ran\n");

  const ignore = /^(var\/lib\/bashible\/(bundle_steps|\.bb-workspace)|opt\/bb|var\/log|var\/cache|tmp)(\/|$)/;
  const before = await snapshot(node.upper, ignore);
  const second = await converge("second converge");
  t.same(second.flags, [], "nothing asks for a restart or a reboot again");
  t.equal(await events(), "ca updated\nsysctl applied\n", "no handler ran again");
  const after = await snapshot(node.upper, ignore);
  const changed = [...new Set([...before.keys(), ...after.keys()])].filter((k) => before.get(k) !== after.get(k));
  t.same(changed, [], "the second converge changed no file");
});
