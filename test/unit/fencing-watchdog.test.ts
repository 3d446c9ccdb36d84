import t from "tap";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { readWatchdogInfo, sysfsDirFor, Watchdog } from "../../agent/fencing/watchdog.ts";
import { setupSoftdog, SOFTDOG } from "../../agent/fencing/softdog.ts";
import { fakeWatchdog } from "../../scripts/lib/watchdog.ts";

// Removed when the file's tests are done.
const tmp = async () => {
  const d = await mkdtemp(path.join(os.tmpdir(), "bashible-wd-"));
  t.teardown(() => rm(d, { recursive: true, force: true }));
  return d;
};

t.test("pets are bytes, disarm is 'V' then close, and a second disarm writes nothing", async (t) => {
  const root = await tmp();
  const fifo = await fakeWatchdog(root);
  t.teardown(() => fifo.close());
  const wd = new Watchdog(fifo.path);
  await wd.arm();
  const pets = fifo.nextPets(3);
  wd.pet();
  wd.pet();
  wd.pet();
  await pets;
  const v = fifo.nextMagicClose();
  wd.disarm();
  await v;
  wd.disarm();
  t.equal(wd.isOpen, false);
  t.throws(() => wd.pet(), /not armed/);
  t.same(
    fifo.bytes.map((b) => b.b),
    ["1", "1", "1", "V"],
  );
});

t.test("release closes without 'V' (the timer keeps running)", async (t) => {
  const root = await tmp();
  const fifo = await fakeWatchdog(root);
  t.teardown(() => fifo.close());
  const wd = new Watchdog(fifo.path);
  await wd.arm();
  const pet = fifo.nextPets(1);
  wd.pet();
  await pet;
  wd.release();
  // a second agent opening the same device afterwards (a restart) pets it again
  const again = new Watchdog(fifo.path);
  await again.arm();
  const next = fifo.nextPets(1);
  again.pet();
  await next;
  again.disarm();
  await fifo.nextMagicClose();
  t.same(
    fifo.bytes.map((b) => b.b),
    ["1", "1", "V"],
  );
});

t.test("a missing device is an error and is never created", async (t) => {
  const root = await tmp();
  const wd = new Watchdog(path.join(root, "dev/watchdog"));
  await t.rejects(wd.arm(), /watchdog device .*ENOENT/);
  await t.rejects(readFile(path.join(root, "dev/watchdog")), { code: "ENOENT" });
  await mkdir(path.join(root, "dir"));
  await t.rejects(new Watchdog(path.join(root, "dir")).arm(), /not a character device/);
});

t.test("timeout and identity come from sysfs where the kernel exposes them", async (t) => {
  const root = await tmp();
  t.equal(sysfsDirFor("/dev/watchdog"), "/sys/class/watchdog/watchdog0");
  t.equal(sysfsDirFor("/dev/watchdog1"), "/sys/class/watchdog/watchdog1");
  t.match((await readWatchdogInfo(root, "/dev/watchdog")).source, /not readable/);
  const dir = path.join(root, "sys/class/watchdog/watchdog0");
  await mkdir(dir, { recursive: true });
  await writeFile(path.join(dir, "identity"), "Software Watchdog\n");
  await writeFile(path.join(dir, "timeout"), "60\n");
  t.same(await readWatchdogInfo(root, "/dev/watchdog"), {
    identity: "Software Watchdog",
    timeoutSeconds: 60,
    timeLeftSeconds: undefined,
    source: dir,
  });
});

const real = await readWatchdogInfo("/", "/dev/watchdog");
t.test(
  "the real device, where this kernel has one readable in sysfs",
  {
    skip:
      real.timeoutSeconds === undefined
        ? `no watchdog in this kernel's sysfs (${real.source}); the device protocol is exercised with a FIFO`
        : false,
  },
  async (t) => {
    t.ok((real.timeoutSeconds ?? 0) > 0, `${real.identity}: timeout ${real.timeoutSeconds} s`);
  },
);

t.test("softdog: options and boot-time load under the root; modprobe only recorded in a sandbox", async (t) => {
  const root = await tmp();
  const first = await setupSoftdog(root, "/dev/watchdog", 60);
  t.same(first.changed, [SOFTDOG.modprobeConf, SOFTDOG.modulesLoad]);
  t.match(
    await readFile(path.join(root, SOFTDOG.modprobeConf), "utf8"),
    /^options softdog soft_margin=60 soft_panic=1$/m,
  );
  t.match(await readFile(path.join(root, SOFTDOG.modulesLoad), "utf8"), /^softdog$/m);
  t.match(first.load, /sandbox root/);
  t.match(
    await readFile(path.join(root, "var/lib/bashible/sandbox-actions.log"), "utf8"),
    /modprobe softdog soft_margin=60 soft_panic=1/,
  );
  const fifo = await fakeWatchdog(root);
  t.teardown(() => fifo.close());
  const second = await setupSoftdog(root, "/dev/watchdog", 60);
  t.same(second.changed, [], "a second setup changes nothing");
  t.match(second.load, /present/);
  t.equal(fifo.bytes.length, 0, "setting up never opens the device (an open would arm it)");
});

t.test(
  "the stand-in counts what a real watchdog counts: time armed without a pet, not pauses after a magic close",
  async (t) => {
    const fifo = await fakeWatchdog(await tmp());
    t.teardown(() => fifo.close());
    // Pets at 0, 1; a clean stop at 2 ('V'); 40 s disarmed; re-armed at 42; pets on to 50.
    for (const [b, at] of [
      ["1", 0],
      ["1", 1000],
      ["V", 2000],
      ["1", 42_000],
      ["1", 50_000],
    ] as const)
      fifo.bytes.push({ b, t: at });
    t.equal(fifo.longestPetGap(0, 50_000), 41_000, "the pause between two pets spans the disarmed time");
    t.same(fifo.longestArmedGap(0, 50_000), { gapMs: 8000, disarms: 1 }, "armed: at most 8 s without a pet");
    t.same(
      fifo.longestArmedGap(0, 70_000),
      { gapMs: 20_000, disarms: 1 },
      "still armed after the last pet: it counts to `to`",
    );
    fifo.bytes.push({ b: "V", t: 51_000 });
    t.same(fifo.longestArmedGap(0, 70_000), { gapMs: 8000, disarms: 2 }, "disarmed at the end: nothing counts");
  },
);
