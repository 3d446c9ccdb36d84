// DeckhousePath in sandbox trees: the bin directory and a profile drop-in that puts it first on
// PATH exactly once, whichever shell reads it and however often.
import t from "tap";
import { execFile } from "node:child_process";
import { readFile, stat } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { OS_RELEASE, stepEnv } from "../fixtures/steps.ts";
import { treeHash } from "../../scripts/lib/bundle.ts";
import { PROFILE_CONTENT } from "../../steps/deckhouse-path.ts";
import type { BundleStep } from "../../bundles/types.ts";
import { requireRoot } from "../fixtures/root.ts";

await requireRoot("the agent sets root ownership on what it writes");

const execFileP = promisify(execFile);
const bundleStep: BundleStep = { name: "004_add_deckhouse_paths", kind: "DeckhousePath", spec: {} };

const cases = [
  ["debian", ["etc/profile.d/02-deckhouse-path.sh"]],
  ["rocky", ["etc/profile.d/02-deckhouse-path.sh"]],
  // ALT Linux login shells read /etc/profile.d, interactive bash /etc/bashrc.d: both get it.
  ["altlinux", ["etc/profile.d/02-deckhouse-path.sh", "etc/bashrc.d/02-deckhouse-path.sh"]],
] as const;

for (const [osName, dropIns] of cases) {
  t.test(`${osName}: creates /opt/deckhouse/bin and ${dropIns.join(", ")}; a second run plans nothing`, async (t) => {
    const env = await stepEnv(t, OS_RELEASE[osName]);
    const before = await treeHash(env.root);
    const { changes } = await env.plan(bundleStep);
    t.equal(await treeHash(env.root), before, "plan changes nothing");
    t.same(
      changes.map((c) => `${c.kind} ${"path" in c ? c.path : ""}`),
      ["dir /opt/deckhouse", "dir /opt/deckhouse/bin", ...dropIns.map((d) => `file /${d}`)],
    );
    t.equal((await env.apply(bundleStep)).outcome, "changed");
    t.equal((await stat(path.join(env.root, "opt/deckhouse/bin"))).mode & 0o7777, 0o755);
    for (const d of dropIns) {
      t.equal(await readFile(path.join(env.root, d), "utf8"), PROFILE_CONTENT);
      t.equal((await stat(path.join(env.root, d))).mode & 0o7777, 0o755, "executable, as Deckhouse ships it");
    }
    t.same((await env.plan(bundleStep)).changes, [], "a second run plans nothing");
  });
}

t.test("the drop-in puts the directory first, once, however many times it is sourced, in sh and bash", async (t) => {
  const env = await stepEnv(t);
  await env.apply(bundleStep);
  const file = path.join(env.root, "etc/profile.d/02-deckhouse-path.sh");
  for (const shell of ["sh", "bash"]) {
    // --norc: bash sources ~/.bashrc when its stdin is a socket, as node's pipes are.
    const opts = shell === "bash" ? ["--norc", "--noprofile"] : [];
    const { stdout } = await execFileP(shell, [...opts, "-c", `. ${file}; . ${file}; . ${file}; echo "$PATH"`], {
      env: { PATH: "/usr/bin:/bin" },
    });
    t.equal(stdout.trim(), "/opt/deckhouse/bin:/usr/bin:/bin", shell);
    const again = await execFileP(shell, [...opts, "-c", `. ${file}; echo "$PATH"`], {
      env: { PATH: "/usr/bin:/opt/deckhouse/bin" },
    });
    t.equal(again.stdout.trim(), "/usr/bin:/opt/deckhouse/bin", `${shell}: already there, untouched`);
  }
});

t.test("a drifted drop-in or directory mode is put back", async (t) => {
  const env = await stepEnv(t);
  await env.apply(bundleStep);
  await env.host.writeFile("/etc/profile.d/02-deckhouse-path.sh", "export PATH=/evil:$PATH\n", { mode: 0o666 });
  await env.host.mkdir("/opt/deckhouse/bin", { mode: 0o777 });
  const { changes } = await env.plan(bundleStep);
  t.same(
    changes.map((c) => c.summary),
    [
      "set /opt/deckhouse/bin to 0755 0:0 (was 0777 0:0)",
      "update /etc/profile.d/02-deckhouse-path.sh: content, mode 0666 → 0755",
    ],
  );
  t.match((changes[1] as { diff: string }).diff, /-export PATH=\/evil/);
  await env.apply(bundleStep);
  t.same((await env.plan(bundleStep)).changes, []);
});
