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
    // Piped, as here: plain text for people and files, no terminal escape codes.
    // biome-ignore lint/suspicious/noControlCharactersInRegex: the escape character is what is looked for
    t.notMatch(r.stdout + r.stderr, /\x1b\[/, "no ANSI escape codes when piped");
    const lines = r.stdout.split("\n").filter((l) => l.startsWith("$ bashible "));
    t.ok(lines.length >= 4, "the demo shows each command it runs");
    for (const l of lines) t.ok((l.match(/--log-level/g)?.length ?? 0) <= 1, `one --log-level at most: ${l}`);
    t.match(
      r.stdout,
      /registry on http:\/\/127\.0\.0\.1:\d+ \(loopback only\)/,
      "the demo's registry listens on loopback",
    );
  },
);

t.test(
  "npm run demo as another user says at once that it needs root",
  { skip: process.getuid?.() !== 0 ? "needs root (to become another user)" : false },
  async (t) => {
    const demo = path.resolve(import.meta.dirname, "../../scripts/demo.ts");
    // env -u: the test runner's spawn hook adds NODE_OPTIONS that write under the checkout.
    const argv = ["--reuid=65534", "--regid=65534", "--clear-groups", "env", "-u", "NODE_OPTIONS"];
    const r = spawnSync("setpriv", [...argv, process.execPath, demo], { encoding: "utf8", timeout: 60_000, cwd: "/" });
    t.equal(r.status, 1, r.stderr);
    t.match(r.stderr, /npm run demo needs root .*; this is uid 65534: run it with sudo/);
    t.notMatch(r.stdout + r.stderr, /EACCES|shadow'/, "not a raw error from halfway through");
  },
);
