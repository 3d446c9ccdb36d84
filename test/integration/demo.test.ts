// The README's main job keeps working: `npm run demo` converges a sandbox through the real
// registry, proxy and bundle server, and ends with nothing left to do.
import t from "tap";
import { spawnSync } from "node:child_process";
import path from "node:path";

t.test(
  "npm run demo converges the sandbox and plans nothing afterwards",
  { skip: process.getuid?.() !== 0 ? "needs root (creates users in the sandbox)" : false },
  async (t) => {
    const r = spawnSync(process.execPath, [path.resolve(import.meta.dirname, "../../scripts/demo.ts")], {
      encoding: "utf8",
      timeout: 120_000,
    });
    t.equal(r.status, 0, r.stderr.slice(-2000));
    t.match(r.stdout, /demo finished: plan exit 2, once exit 0, second plan exit 0/);
    t.match(r.stdout, /\/opt\/deckhouse\/bin: bashible, hello/, "packages installed through the proxy");
    t.notMatch(r.stdout + r.stderr, /demo-token-/, "the proxy token never shows");
  },
);
