// The daemon's scheduling with a fake converge child: one converge at a time, requests during a
// converge folded into one more, and a stop that waits for the child.
import t, { type Test } from "tap";
import { EventEmitter } from "node:events";
import type { ChildProcess } from "node:child_process";
import { mkdir, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { Daemon } from "../../agent/daemon/daemon.ts";
import { createLogger } from "../../lib/log/log.ts";
import { makeBundle, sandbox, script } from "../../scripts/lib/bundle.ts";

class FakeChild extends EventEmitter {
  exitCode: number | null = null;
  readonly argv: string[];
  constructor(argv: string[]) {
    super();
    this.argv = argv;
  }
  kill(): boolean {
    this.finish(143);
    return true;
  }
  finish(code = 0): void {
    if (this.exitCode !== null) return;
    this.exitCode = code;
    this.emit("exit", code, null);
  }
}

async function setup(t: Test) {
  const root = await sandbox();
  t.teardown(() => rm(root, { recursive: true, force: true }));
  const file = path.join(root, "bundle.json");
  await writeFile(file, JSON.stringify(makeBundle([script("050_a", "true")])));
  const children: FakeChild[] = [];
  let running = 0;
  let maxRunning = 0;
  const spawned = new EventEmitter();
  const d = new Daemon({
    root,
    log: createLogger({ level: "silent" }),
    childArgs: ["--root", root],
    tickMs: 3_600_000,
    nodeName: "node-1",
    bundleFile: file,
    clients: [],
    spawnChild: (argv) => {
      const c = new FakeChild(argv);
      running++;
      maxRunning = Math.max(maxRunning, running);
      c.once("exit", () => running--);
      children.push(c);
      spawned.emit("child", c);
      return c as unknown as ChildProcess;
    },
  });
  const next = () => new Promise<FakeChild>((r) => spawned.once("child", r));
  return { root, file, d, children, next, max: () => maxRunning };
}

t.test("a due converge starts one child; requests while it runs fold into one more run after it", async (t) => {
  const s = await setup(t);
  const first = s.next();
  await s.d.start();
  const c1 = await first;
  t.match(c1.argv.join(" "), /once --root/);
  // Three changes while the child runs: still one child.
  for (const v of ["b", "c", "d"]) {
    await writeFile(s.file, JSON.stringify(makeBundle([script("050_a", `echo ${v}`)])));
    (s.d as unknown as { check(r: string, f: boolean): void }).check("bundle file changed", true);
  }
  t.equal(s.children.length, 1, "no second child while one runs");
  const second = s.next();
  c1.finish(0); // the run did not record a checksum (fake), so the gate still says "due"
  const c2 = await second;
  t.ok(c2, "exactly one more run after it");
  t.equal(s.max(), 1, "never two at once");
  const stopped = s.d.done;
  s.d.stop();
  await stopped;
  t.equal(c2.exitCode, 143, "stop terminates the running child and waits for it");
});

t.test("nothing due: no child", async (t) => {
  const s = await setup(t);
  const b = makeBundle([script("050_a", "true")]);
  await writeFile(s.file, JSON.stringify(b));
  await mkdir(path.join(s.root, "var/lib/bashible"), { recursive: true });
  await writeFile(path.join(s.root, "var/lib/bashible/configuration_checksum"), `${b.checksum}\n`);
  const { readBootId } = await import("../../agent/facts.ts");
  await writeFile(
    path.join(s.root, "var/lib/bashible/status.json"),
    JSON.stringify({ appliedBootId: await readBootId() }),
  );
  await s.d.start();
  t.equal(s.children.length, 0);
  s.d.stop();
  await s.d.done;
});

t.test("an unreadable configuration_checksum is an error, not 'absent' (no run on a guess)", async (t) => {
  if (process.getuid?.() === 0) {
    t.comment("skipped as root: root reads a mode-000 file");
    return;
  }
  const s = await setup(t);
  await mkdir(path.join(s.root, "var/lib/bashible"), { recursive: true });
  await writeFile(path.join(s.root, "var/lib/bashible/configuration_checksum"), "x\n", { mode: 0 });
  await s.d.start();
  t.equal(s.children.length, 0);
  s.d.stop();
  await s.d.done;
});
