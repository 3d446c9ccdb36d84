// Unit files shipped to nodes pass `systemd-analyze verify`, with ExecStart pointing at a
// real built agent. (The units steps render, containerd's, the kubelet's and the API proxy's, are
// verified by the steps themselves before they are written: see the steps-* tests.)
import t from "tap";
import { spawnSync } from "node:child_process";
import { mkdtemp, readFile, readdir, writeFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { buildDist } from "../../scripts/build.ts";

const UNITS = path.resolve(import.meta.dirname, "../../systemd");
const have = spawnSync("systemd-analyze", ["--version"]).status === 0;

t.test("every unit verifies", { skip: have ? false : "systemd-analyze not installed" }, async (t) => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "units-"));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const dist = path.join(dir, "dist");
  await buildDist(dist);
  for (const name of (await readdir(UNITS)).filter((f) => /\.(service|timer)$/.test(f))) {
    const text = await readFile(path.join(UNITS, name), "utf8");
    if (name === "bashible.service") {
      t.match(text, /ExecStart=\/opt\/deckhouse\/lib\/bashible\/bashible /, `${name} runs the installed agent`);
    }
    const local = path.join(dir, name);
    await writeFile(local, text.replaceAll("/opt/deckhouse/lib/bashible/bashible", path.join(dist, "bashible")));
    const r = spawnSync("systemd-analyze", ["verify", local], { encoding: "utf8" });
    t.equal(r.status, 0, `${name}: ${r.stderr}`);
    t.notMatch(r.stderr, /\bbashible\.service\b.*(error|unknown|invalid)/i);
  }
  const broken = path.join(dir, "broken.service");
  await writeFile(broken, "[Service]\nExecStart=relative/path\n");
  t.not(spawnSync("systemd-analyze", ["verify", broken]).status, 0, "a broken unit is caught");
});
