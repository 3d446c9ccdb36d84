// npm run package (scripts/package.ts): the agent, containerd, runc, kubelet, the CNI plugins
// and crictl as registry packages. Built as OCI layouts, pushed to a real registry, pulled back
// by digest, and installed on a booted Debian node exactly as the RegistryPackages step runs them
// (cwd = the unpacked layer; uninstall from the store directory holding only install, uninstall
// and digest): the files land with their bytes and modes, the programs run, a second install
// changes nothing, and uninstall leaves the node as it was.
import t from "tap";
import { createHash } from "node:crypto";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { buildDist } from "../../scripts/build.ts";
import { type BuiltPackage, buildPackages, type PackageSource, writePackage } from "../../scripts/package.ts";
import { startRegistry } from "../../scripts/lib/registry.ts";
import { debianRoot } from "../../scripts/lib/debian-root.ts";
import { type NspawnNode, nodeForTest } from "../../scripts/lib/nspawn-node.ts";

const sha256 = (b: Buffer) => `sha256:${createHash("sha256").update(b).digest("hex")}`;

/** What proves each package's programs run on the node. */
const SMOKE: Record<string, { argv: string[]; env?: Record<string, string>; expect: RegExp }[]> = {
  bashible: [{ argv: ["/opt/deckhouse/bin/bashible", "version"], expect: /^bashible \d+\.\d+\.\d+ \(node v24\./ }],
  containerd: [
    { argv: ["/opt/deckhouse/bin/containerd", "--version"], expect: /containerd .*1\.6\./ },
    { argv: ["/opt/deckhouse/bin/ctr", "--version"], expect: /ctr .*1\.6\./ },
    { argv: ["/opt/deckhouse/bin/containerd-shim-runc-v2", "-v"], expect: /containerd-shim-runc-v2/ },
  ],
  runc: [{ argv: ["/opt/deckhouse/bin/runc", "--version"], expect: /runc version 1\./ }],
  kubelet: [{ argv: ["/opt/deckhouse/bin/kubelet", "--version"], expect: /^Kubernetes v1\.34\./ }],
  "cni-plugins": ["bridge", "host-local", "loopback"].map((p) => ({
    argv: [`/opt/cni/bin/${p}`],
    env: { CNI_COMMAND: "VERSION" },
    expect: /"supportedVersions"/,
  })),
  crictl: [{ argv: ["/opt/deckhouse/bin/crictl", "--version"], expect: /crictl version v1\.34\./ }],
};

/** Every path under the package's paths with inode, mode, size and mtime: any rewrite shows. */
async function snapshot(node: NspawnNode, paths: string[]): Promise<string> {
  const script = 'for p in "$@"; do [ -e "$p" ] && find "$p" -printf "%i %m %s %T@ %p\\n"; done | sort';
  return (await node.mustExec(["sh", "-c", script, "sh", ...paths.map((p) => p.replace(/\/$/, ""))])).stdout;
}

/** The node's changes as a set of paths, minus the journal (which grows on its own). */
async function changes(node: NspawnNode): Promise<string[]> {
  return (await node.diff()).entries.map((e) => `${e.kind} ${e.path}`).filter((e) => !e.includes("/var/log/journal/"));
}

/** Runs a package script as the step does: env, cwd and `bash ./<script>`. */
async function runScript(node: NspawnNode, pkg: { name: string; digest: string }, dir: string, script: string) {
  return node.exec(["bash", `./${script}`], {
    cwd: dir,
    env: { PACKAGE_NAME: pkg.name, PACKAGE_DIGEST: pkg.digest, PACKAGE_DIR: dir },
    timeoutMs: 120_000,
  });
}

/** Unpacks a layer in the node's /tmp (a tmpfs: not in the upper dir) and runs its install. */
async function install(node: NspawnNode, pkg: { name: string; digest: string }, layer: Buffer, host: string) {
  const hex = pkg.digest.slice("sha256:".length, "sha256:".length + 12);
  const file = path.join(host, `${pkg.name}-${hex}.tar.gz`);
  await writeFile(file, layer);
  const work = `/tmp/pkg/${pkg.name}-${hex}`;
  await node.copyIn(file, `${work}.tar.gz`);
  await node.mustExec([
    "sh",
    "-c",
    `rm -rf ${work} && mkdir -p ${work} && tar -xzf ${work}.tar.gz -C ${work} --no-same-owner`,
  ]);
  const r = await runScript(node, pkg, work, "install");
  // The store directory the step keeps: the scripts and the digest, nothing of the payload.
  const store = `/tmp/store/${pkg.name}`;
  await node.mustExec([
    "sh",
    "-c",
    `rm -rf ${store} && mkdir -p ${store} && cp ${work}/install ${work}/uninstall ${store}/`,
  ]);
  await node.writeFile(`${store}/digest`, `${pkg.digest}\n`);
  return { r, work, store };
}

if (process.getuid?.() !== 0) {
  t.plan(0, "needs root (nspawn node, registry, package builds)");
} else {
  const tmp = await mkdtemp(path.join(os.tmpdir(), "bashible-packages-"));
  t.teardown(() => rm(tmp, { recursive: true, force: true }));
  const dist = path.join(tmp, "dist");
  await buildDist(dist);
  const out = path.join(tmp, "out");
  const built = await buildPackages({ out, dist, log: (s) => t.comment(s) });
  const names = built.map((b) => b.name);
  const lower = (await debianRoot({ log: (l) => t.comment(l) })).dir;

  t.test("every package is built, crictl when Go is at hand", async (t) => {
    for (const n of ["bashible", "containerd", "runc", "kubelet", "cni-plugins"]) t.ok(names.includes(n), n);
    if (!names.includes("crictl")) t.comment("crictl skipped: no Go toolchain and no cached build");
    const index = JSON.parse(await readFile(path.join(out, "packages.json"), "utf8"));
    for (const b of built) t.equal(index[b.name].digest, b.digest, `packages.json names ${b.name}'s manifest`);
  });

  t.test("layers are reproducible: the same inputs give the same digests", async (t) => {
    const again = await buildPackages({ out: path.join(tmp, "again"), names: ["runc", "cni-plugins"] });
    for (const b of again) t.equal(b.digest, built.find((x) => x.name === b.name)?.digest, b.name);
  });

  const registry = await startRegistry({ parentDir: tmp });
  t.teardown(() => registry.stop());
  const pulled = new Map<string, Buffer>();

  t.test("each layout pushes to a real registry and pulls back by tag and digest", async (t) => {
    for (const b of built) {
      const repo = `deckhouse/packages/${b.name}`;
      const pushed = await registry.pushOciLayout(repo, b.dir);
      t.same(pushed, { digest: b.digest, layer: b.layer, tag: b.tag });
      const m = await fetch(`${registry.url}/v2/${repo}/manifests/${b.tag}`, {
        headers: { accept: "application/vnd.oci.image.manifest.v1+json" },
      });
      t.equal(m.status, 200);
      t.equal(sha256(Buffer.from(await m.arrayBuffer())), b.digest, `${b.name}: manifest by tag`);
      const layer = Buffer.from(await (await fetch(`${registry.url}/v2/${repo}/blobs/${b.layer}`)).arrayBuffer());
      t.equal(sha256(layer), b.layer, `${b.name}: layer by digest`);
      pulled.set(b.name, layer);
    }
  });

  t.test(
    "on a node: install places the files and the programs run; again is a no-op; uninstall leaves no trace",
    async (t) => {
      const node = await nodeForTest(t, { root: lower });
      const host = path.join(tmp, "to-node");
      await mkdir(host, { recursive: true });
      for (const b of built) {
        t.test(b.name, async (t) => {
          const layer = pulled.get(b.name);
          if (!layer) throw new Error(`${b.name} was not pulled`);
          const before = await changes(node);
          const { r, work, store } = await install(node, b, layer, host);
          t.equal(r.exitCode, 0, r.stderr);
          t.same(
            r.stdout.trim().split("\n"),
            b.paths.map((p) => `installed ${p}`),
            "install reports each path it placed",
          );
          for (const p of b.paths.filter((p) => !p.endsWith("/"))) {
            const st = (await node.mustExec(["stat", "-c", "%a %U %F", p])).stdout.trim();
            t.equal(st, "755 root regular file", `${p} mode and owner`);
            const inLayer = await node.mustExec(["sha256sum", `${work}/payload${p}`, p]);
            const [a, c] = inLayer.stdout
              .trim()
              .split("\n")
              .map((l) => l.split(" ")[0]);
            t.equal(a, c, `${p}: the layer's bytes`);
          }
          for (const s of SMOKE[b.name] ?? []) {
            const run = await node.exec(s.argv, { ...(s.env ? { env: s.env } : {}) });
            t.match(`${run.stdout}${run.stderr}`, s.expect, `${s.argv.join(" ")} runs`);
          }

          const snap = await snapshot(node, b.paths);
          const second = await runScript(node, b, work, "install");
          t.equal(second.exitCode, 0, second.stderr);
          t.match(second.stdout, /already installed/);
          t.notMatch(second.stdout, /installed \//);
          t.equal(await snapshot(node, b.paths), snap, "a second install rewrites nothing (inodes, mtimes)");

          const un = await runScript(node, b, store, "uninstall");
          t.equal(un.exitCode, 0, un.stderr);
          t.same(await changes(node), before, "after uninstall the node is as before install");
          const twice = await runScript(node, b, store, "uninstall");
          t.equal(twice.exitCode, 0, "uninstall twice is fine");
        });
      }
    },
  );

  t.test("an upgrade replaces a tree whole and keeps what other packages put beside it", async (t) => {
    const node = await nodeForTest(t, { root: lower });
    const host = path.join(tmp, "upgrade");
    const tree = async (v: string, files: Record<string, string>) => {
      const dir = path.join(host, `src-${v}`);
      for (const [rel, content] of Object.entries(files)) {
        await mkdir(path.dirname(path.join(dir, rel)), { recursive: true });
        await writeFile(path.join(dir, rel), content, { mode: 0o644 });
      }
      const src: PackageSource = {
        name: "demo-tool",
        version: v,
        description: "a test package",
        trees: [{ src: dir, dest: "/opt/deckhouse/lib/demo-tool" }],
        generated: [{ dest: "/opt/deckhouse/bin/demo-tool", content: `#!/bin/sh\necho ${v}\n`, mode: 0o755 }],
      };
      return writePackage(src, path.join(host, `out-${v}`));
    };
    const v1 = await tree("1", { a: "a1\n", b: "b1\n", "sub/c": "c1\n" });
    const v2 = await tree("2", { a: "a2\n", "sub/d": "d2\n" });
    const layer = (b: BuiltPackage) => readFile(path.join(b.dir, "blobs/sha256", b.layer.slice(7)));
    // Something of another package's in the same bin directory.
    await node.writeFile("/opt/deckhouse/bin/other", "#!/bin/sh\n", 0o755);

    t.equal((await install(node, v1, await layer(v1), host)).r.exitCode, 0);
    const up = await install(node, v2, await layer(v2), host);
    t.equal(up.r.exitCode, 0, up.r.stderr);
    const files = (await node.mustExec(["sh", "-c", "cd /opt/deckhouse && find . | sort"])).stdout.trim().split("\n");
    t.same(
      files,
      [
        ".",
        "./bin",
        "./bin/demo-tool",
        "./bin/other",
        "./lib",
        "./lib/demo-tool",
        "./lib/demo-tool/a",
        "./lib/demo-tool/sub",
        "./lib/demo-tool/sub/d",
      ],
      "v2's tree exactly, no file of v1 left, no temp names",
    );
    t.equal((await node.mustExec(["/opt/deckhouse/bin/demo-tool"])).stdout, "2\n");
    t.equal((await runScript(node, v2, up.store, "uninstall")).exitCode, 0);
    const left = (await node.mustExec(["sh", "-c", "cd /opt/deckhouse && find . | sort"])).stdout.trim().split("\n");
    t.same(left, [".", "./bin", "./bin/other"], "uninstall keeps the directory another package still uses");
  });
}
