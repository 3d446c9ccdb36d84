// The gate: when a converge runs, and why (pure).
import t from "tap";
import { decide } from "../../agent/converge/gate.ts";

const base = {
  bundleChecksum: "b",
  bootId: "boot-1",
  appliedChecksum: "b",
  appliedBootId: "boot-1",
  rebootRequested: false,
};

t.test("in sync: nothing runs", async (t) => {
  t.same(decide(base), { run: false, reason: "configuration is in sync" });
});

t.test("every reason to run, each with a reason a person reads", async (t) => {
  t.match(decide({ ...base, appliedChecksum: undefined }), { run: true, reason: /configuration_checksum absent/ });
  t.match(decide({ ...base, bundleChecksum: "c" }), { run: true, reason: /checksum b → c/ });
  t.match(decide({ ...base, bootId: "boot-2" }), { run: true, reason: /rebooted since the last run/ });
  t.match(decide({ ...base, rebootRequested: true }), { run: true, reason: /update\.node\.deckhouse\.io\/reboot/ });
  t.match(decide({ ...base, rebootPending: true }), { run: true, reason: /a reboot is pending/ });
});

t.test("a forced run wins over everything else", async (t) => {
  t.match(decide({ ...base, appliedChecksum: undefined, rebootRequested: true, bundleChecksum: "c" }), {
    reason: /configuration_checksum absent/,
  });
});
