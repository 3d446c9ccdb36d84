// steps/checks/deny-service-starts.sh, the wrapper the package step runs Debian's install under:
// in a mount namespace of its own with a tmpfs over /usr/sbin (so the host's policy-rc.d is never
// touched), the policy it writes answers invoke-rc.d's questions (Debian's policy-rc.d interface:
// exit 101 forbids), and it is gone after the install however the install ends: success, failure,
// a TERM. A policy-rc.d the machine has of its own is neither replaced nor removed. The real
// install under it (Debian's nginx never started) is in node-host-prep.test.ts.
import t from "tap";
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { promisify } from "node:util";
import { asset } from "../../lib/assets.ts";
import { DENY_STARTS_MARKER, POLICY_RC_D } from "../../bundles/os-families.ts";

const run = promisify(execFile);
const skip =
  process.getuid?.() !== 0
    ? "needs root (a mount namespace with its own /usr/sbin)"
    : !existsSync("/usr/bin/unshare") && "needs unshare (util-linux)";
const script = asset("steps/checks/deny-service-starts.sh");

/** Runs `body` (sh) in a private mount namespace whose /usr/sbin is an empty tmpfs. */
async function inNamespace(body: string): Promise<{ code: number; out: string }> {
  const setup = `mount --make-rprivate / && mount -t tmpfs tmpfs /usr/sbin && ${body}`;
  try {
    const r = await run("unshare", ["-m", "sh", "-c", setup], { timeout: 30_000 });
    return { code: 0, out: r.stdout };
  } catch (err) {
    const e = err as { code?: number; stdout?: string };
    return { code: typeof e.code === "number" ? e.code : -1, out: e.stdout ?? "" };
  }
}

t.test(
  "during the install invoke-rc.d may not start the named services, and may start the rest",
  { skip },
  async (t) => {
    const asked = (svc: string) => `${POLICY_RC_D} --quiet ${svc} start; echo "${svc}=$?"`;
    const r = await inNamespace(
      `sh ${script} nginx.service sh -c '${["nginx", "nginx.service", "logrotate", "ssh"].map(asked).join("; ")}; head -2 ${POLICY_RC_D} | tail -1'`,
    );
    t.equal(r.code, 0);
    t.match(r.out, /^nginx=101$/m, "nginx (invoke-rc.d's name) forbidden");
    t.match(r.out, /^nginx\.service=101$/m, "nginx.service (deb-systemd-invoke's name) forbidden");
    t.match(r.out, /^logrotate=0$/m, "what the step does not disable starts as it would");
    t.match(r.out, /^ssh=0$/m);
    t.match(r.out, DENY_STARTS_MARKER, "the one it writes carries the marker the step's plan looks for");
  },
);

t.test("it goes when the install ends: success, failure (its exit code kept), TERM", { skip }, async (t) => {
  const after = `; echo "rc=$?"; test -e ${POLICY_RC_D} && echo left || echo gone; ls /usr/sbin`;
  const ok = await inNamespace(`sh ${script} nginx.service true${after}`);
  t.match(ok.out, /^rc=0$/m);
  t.match(ok.out, /^gone$/m);
  const failed = await inNamespace(`sh ${script} nginx.service sh -c 'exit 100'${after}`);
  t.match(failed.out, /^rc=100$/m, "apt's exit code is the step's");
  t.match(failed.out, /^gone$/m);
  t.notMatch(failed.out, /bashible\./, "no temporary file left");
  const termed = await inNamespace(
    `sh ${script} nginx.service sh -c 'test -e ${POLICY_RC_D} && echo present; kill -TERM $PPID; exit 0'${after}`,
  );
  t.match(termed.out, /^present$/m);
  t.match(termed.out, /^rc=143$/m, "a TERM ends it");
  t.match(termed.out, /^gone$/m, "and takes the policy with it");
});

t.test("a stale one of its own is replaced; the machine's own is never touched", { skip }, async (t) => {
  const stale = await inNamespace(
    `printf '#!/bin/sh\\n${DENY_STARTS_MARKER}\\nexit 101\\n' >${POLICY_RC_D} && chmod 755 ${POLICY_RC_D} && sh ${script} nginx.service sh -c '${POLICY_RC_D} logrotate start; echo "logrotate=$?"'; test -e ${POLICY_RC_D} && echo left || echo gone`,
  );
  t.match(stale.out, /^logrotate=0$/m, "the stale blanket deny was replaced by this install's");
  t.match(stale.out, /^gone$/m);
  const own = await inNamespace(
    `printf '#!/bin/sh\\nexit 101\\n' >${POLICY_RC_D} && chmod 755 ${POLICY_RC_D} && sh ${script} nginx.service sh -c '${POLICY_RC_D} logrotate start; echo "logrotate=$?"'; cat ${POLICY_RC_D}`,
  );
  t.match(own.out, /^logrotate=101$/m, "the install runs under the machine's own policy");
  t.match(own.out, /^exit 101$/m, "which is still there, unchanged");
  t.notMatch(own.out, DENY_STARTS_MARKER);
});
