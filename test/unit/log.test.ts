import t from "tap";
import { spawnSync } from "node:child_process";
import { prettyLine } from "../../lib/log/log.ts";

const script = (format: string) => `
import { createLogger } from "${new URL("../../lib/log/log.ts", import.meta.url).pathname}";
const log = createLogger({ format: "${format}" });
log.info({ token: "s3cr3t-token", headers: { authorization: "Bearer s3cr3t" }, user: { passwordHash: "$6$hash" }, step: "kubelet" }, "step done");
`;

t.test("JSON logs on stdout never carry secrets", async (t) => {
  const r = spawnSync(process.execPath, ["--input-type=module", "-e", script("json")], { encoding: "utf8" });
  t.equal(r.status, 0, r.stderr);
  const rec = JSON.parse(r.stdout.trim());
  t.equal(rec.msg, "step done");
  t.equal(rec.level, "info");
  t.equal(rec.step, "kubelet");
  t.notMatch(r.stdout, /s3cr3t|\$6\$hash/);
});

t.test("pretty logs are one readable line, also redacted", async (t) => {
  const r = spawnSync(process.execPath, ["--input-type=module", "-e", script("pretty")], { encoding: "utf8" });
  t.match(r.stdout, /^\d\d:\d\d:\d\d INFO {2}step done {2}.*step=kubelet/);
  t.notMatch(r.stdout, /s3cr3t|\$6\$hash/);
});

t.test("prettyLine passes non-JSON through", async (t) => {
  t.equal(prettyLine("plain text"), "plain text");
});

t.test("both loggers redact the same fields at any depth", async (t) => {
  const fields = `{ a: { b: { c: { token: "deep-s3cr3t" } } }, list: [{ password: "p4ss" }], err: new Error("boom") }`;
  for (const [name, make] of [
    [
      "pino",
      `import { createLogger as mk } from "${new URL("../../lib/log/log.ts", import.meta.url).pathname}"; const log = mk({ format: "json" });`,
    ],
    [
      "light",
      `import { createLightLogger as mk } from "${new URL("../../lib/log/light.ts", import.meta.url).pathname}"; const log = mk({ format: "json", level: "info" });`,
    ],
  ] as const) {
    const code = `${make}\nlog.child({ bootstrapToken: "bound-s3cr3t" }).info(${fields}, "m");`;
    const r = spawnSync(process.execPath, ["--input-type=module", "-e", code], { encoding: "utf8" });
    t.equal(r.status, 0, `${name}: ${r.stderr}`);
    t.notMatch(r.stdout, /s3cr3t|p4ss/, `${name}: nothing secret`);
    const rec = JSON.parse(r.stdout.trim());
    t.equal(rec.a.b.c.token, "[redacted]", `${name}: nested`);
    t.equal(rec.list[0].password, "[redacted]", `${name}: in arrays`);
    t.equal(rec.err.message, "boom", `${name}: errors keep their message`);
  }
});

t.test("pretty lines show control characters instead of sending them to the terminal", async (t) => {
  const line = JSON.stringify({
    level: "info",
    time: 0,
    msg: "script said \u001b[2J\u001b[31mroot pwned\rfake line\nsecond",
    stream: "\u001b]0;title\u0007",
  });
  const out = prettyLine(line);
  const controls = [...out.slice(0, -1)].filter((c) => c.charCodeAt(0) < 0x20 && c !== "\t");
  t.same(controls, [], "no control character but the final newline");
  t.match(out, "script said \\x1b[2J\\x1b[31mroot pwned\\x0dfake line\\nsecond");
  t.ok(out.endsWith("\n") && out.indexOf("\n") === out.length - 1, "one line");
});
