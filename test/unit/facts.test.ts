import t from "tap";
import { mkdtemp, mkdir, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { familyOf, parseOsRelease, UnknownOsError } from "../../bundles/os-families.ts";
import { cgroupVersion, gatherFacts } from "../../agent/facts.ts";

t.test("os-release IDs map to bundle families", async (t) => {
  for (const id of ["debian", "ubuntu", "astra"]) t.equal(familyOf(id).family, "debian", id);
  for (const id of ["centos", "rocky", "almalinux", "rhel", "redos"]) t.equal(familyOf(id).family, "rhel", id);
  t.equal(familyOf("altlinux").packageManager, "apt-rpm");
  t.throws(() => familyOf("gentoo"), UnknownOsError);
  t.throws(() => familyOf("gentoo"), /'gentoo' is not supported; supported IDs: debian/);
});

t.test("os-release parsing handles quotes, comments and escapes", async (t) => {
  const r = parseOsRelease(
    '# comment\nID=rocky\nVERSION_ID="9.4"\nPRETTY_NAME="Rocky \\"Blue\\" Onyx"\nNAME=\'Rocky Linux\'\n',
  );
  t.same(r, { ID: "rocky", VERSION_ID: "9.4", PRETTY_NAME: 'Rocky "Blue" Onyx', NAME: "Rocky Linux" });
});

async function tree(files: Record<string, string>): Promise<string> {
  const root = await mkdtemp(path.join(os.tmpdir(), "facts-"));
  t.teardown(() => rm(root, { recursive: true, force: true }));
  for (const [p, content] of Object.entries(files)) {
    await mkdir(path.dirname(path.join(root, p)), { recursive: true });
    await writeFile(path.join(root, p), content);
  }
  return root;
}

t.test("facts under --root read the tree's OS and hostname", async (t) => {
  const root = await tree({ "etc/os-release": "ID=almalinux\nVERSION_ID=9.3\n", "etc/hostname": "node-a\n" });
  const f = await gatherFacts(root);
  t.equal(f.os.family, "rhel");
  t.equal(f.hostname, "node-a");
  t.equal(f.os.versionId, "9.3");
});

t.test("an unsupported OS is reported, not guessed", async (t) => {
  const root = await tree({ "usr/lib/os-release": "ID=gentoo\n" });
  const f = await gatherFacts(root);
  t.equal(f.os.family, null);
  t.match(f.os.error, /gentoo/);
});

t.test("cgroup version from the mount layout", async (t) => {
  t.same(await cgroupVersion(await tree({ "cgroup.controllers": "cpu memory\n" })), { version: 2, hybrid: false });
  t.same(await cgroupVersion(await tree({ "unified/cgroup.controllers": "" })), { version: 1, hybrid: true });
  t.same(await cgroupVersion(await tree({ "memory/memory.limit_in_bytes": "1" })), { version: 1, hybrid: false });
});
