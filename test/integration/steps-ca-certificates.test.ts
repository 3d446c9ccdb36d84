// CACertificates in sandbox trees with the real update-ca-certificates (Debian, Ubuntu) and a
// RHEL-family layout (refresh recorded: update-ca-trust cannot target a tree).
import t from "tap";
import { mkdtemp, readFile, readlink, readdir, writeFile, mkdir, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { createCA } from "../../scripts/lib/pki.ts";
import { OS_RELEASE, stepEnv, type StepEnv } from "../fixtures/steps.ts";
import { treeHash } from "../../scripts/lib/bundle.ts";
import { PREFIX } from "../../steps/ca-certificates.ts";
import { makeBundle } from "../../scripts/lib/bundle.ts";
import { acceptBundle } from "../../bundles/verify.ts";
import type { BundleStep, CACertificatesSpec } from "../../bundles/types.ts";
import { PATHS } from "../../bundles/paths.ts";
import { requireRoot } from "../fixtures/root.ts";

await requireRoot("the agent sets root ownership on what it writes");

const SANDBOX_ACTIONS_LOG = PATHS.sandboxActions;

const pkiDir = await mkdtemp(path.join(os.tmpdir(), "bashible-ca-test-"));
t.teardown(() => rm(pkiDir, { recursive: true, force: true }));
const [caA, caB] = await Promise.all([createCA(pkiDir, "a", "Test CA A"), createCA(pkiDir, "b", "Test CA B")]);
const pemA = await readFile(caA.cert, "utf8");
const pemB = await readFile(caB.cert, "utf8");

const bundleStep = (spec: CACertificatesSpec): BundleStep => ({
  name: "003_install_ca_certificates",
  kind: "CACertificates",
  spec,
});

async function converge(env: StepEnv, spec: CACertificatesSpec) {
  const before = await treeHash(env.root);
  const { changes } = await env.plan(bundleStep(spec));
  if ((await treeHash(env.root)) !== before) throw new Error("plan changed the tree");
  const status = await env.apply(bundleStep(spec));
  if (status.outcome === "failed") throw new Error(status.error);
  return changes;
}

const planOf = async (env: StepEnv, spec: CACertificatesSpec) => (await env.plan(bundleStep(spec))).changes;

for (const osName of ["debian", "ubuntu"] as const) {
  t.test(
    `${osName}: installs CAs with update-ca-certificates, removes its own stale ones, re-run does nothing`,
    async (t) => {
      const env = await stepEnv(t, OS_RELEASE[osName]);
      // Someone else's anchor: never touched.
      await mkdir(path.join(env.root, "usr/local/share/ca-certificates"), { recursive: true });
      await writeFile(path.join(env.root, "usr/local/share/ca-certificates/corp.crt"), pemB);

      const changes = await converge(env, {
        certificates: [
          { name: "registry", pem: pemA },
          { name: "cluster", pem: pemB },
        ],
      });
      t.same(
        changes.map((c) => c.summary.split(" (")[0]),
        [
          `create /usr/local/share/ca-certificates/${PREFIX}registry.crt`,
          `create /usr/local/share/ca-certificates/${PREFIX}cluster.crt`,
          "create /etc/ssl/certs",
          "refresh the trust store: update-ca-certificates",
        ],
      );
      const certs = path.join(env.root, "etc/ssl/certs");
      t.match(await readlink(path.join(certs, `${PREFIX}registry.pem`)), /bashible-registry\.crt$/);
      const bundle = await readFile(path.join(certs, "ca-certificates.crt"), "utf8");
      t.ok(bundle.includes(pemA.trim().split("\n")[1] as string), "CA A is in the bundle file");

      t.same(
        await planOf(env, {
          certificates: [
            { name: "registry", pem: pemA },
            { name: "cluster", pem: pemB },
          ],
        }),
        [],
        "a second run plans nothing",
      );

      const second = await converge(env, { certificates: [{ name: "registry", pem: pemA }] });
      t.same(
        second.map((c) => c.kind),
        ["file", "command"],
      );
      t.match(second[0]?.summary, /remove CA certificate bashible-cluster\.crt/);
      const anchors = await readdir(path.join(env.root, "usr/local/share/ca-certificates"));
      t.same(anchors.sort(), ["bashible-registry.crt", "corp.crt"], "only the agent's stale anchor is removed");
      t.notOk((await readdir(certs)).includes(`${PREFIX}cluster.pem`), "the store forgot it");
      t.same(await planOf(env, { certificates: [{ name: "registry", pem: pemA }] }), []);
    },
  );
}

t.test("an interrupted refresh is noticed and redone", async (t) => {
  const env = await stepEnv(t);
  const spec = { certificates: [{ name: "registry", pem: pemA }] };
  await converge(env, spec);
  await rm(path.join(env.root, "etc/ssl/certs", `${PREFIX}registry.pem`));
  const changes = await planOf(env, spec);
  t.same(
    changes.map((c) => c.kind),
    ["command"],
  );
  t.match(changes[0]?.summary, /an earlier refresh did not finish/);
});

t.test("rhel layout: anchors under /etc/pki/ca-trust/source/anchors, refresh recorded in the sandbox", async (t) => {
  const env = await stepEnv(t, OS_RELEASE.rocky);
  const changes = await converge(env, { certificates: [{ name: "registry", pem: pemA }] });
  t.same(
    changes.map((c) => c.kind),
    ["file", "command"],
  );
  t.equal((changes[0] as { path: string }).path, `/etc/pki/ca-trust/source/anchors/${PREFIX}registry.crt`);
  t.equal(
    await readFile(path.join(env.root, "etc/pki/ca-trust/source/anchors/bashible-registry.crt"), "utf8"),
    `${pemA.trim()}\n`,
  );
  t.match(await readFile(path.join(env.root, SANDBOX_ACTIONS_LOG), "utf8"), /update-ca-trust extract/);
  t.same(await planOf(env, { certificates: [{ name: "registry", pem: pemA }] }), []);
});

t.test("altlinux layout: update-ca-trust (recorded in the sandbox)", async (t) => {
  const env = await stepEnv(t, OS_RELEASE.altlinux);
  const changes = await converge(env, { certificates: [{ name: "registry", pem: pemA }] });
  t.equal(changes[1]?.kind === "command" && changes[1].argv.join(" "), "update-ca-trust");
});

t.test("a file that is not a certificate is a problem; the good ones are still installed", async (t) => {
  const env = await stepEnv(t);
  const spec = {
    certificates: [
      { name: "junk", pem: "-----BEGIN CERTIFICATE-----\nhello\n-----END CERTIFICATE-----\n" },
      { name: "good", pem: pemA },
      { name: "broken", pem: pemA.replace(/[A-Za-z]{12}/, "AAAAAAAAAAAA") },
    ],
  };
  const plan = await env.plan(bundleStep(spec));
  t.match(
    plan.problems.map((p) => `${p.subject}: ${p.message}`),
    [
      /certificate junk: .*'junk' is not a valid X.509 certificate/,
      /certificate broken: .*'broken' is not a valid X.509 certificate/,
    ],
  );
  await env.apply(bundleStep(spec));
  t.same(await readdir(path.join(env.root, "usr/local/share/ca-certificates")), [`${PREFIX}good.crt`]);
});

t.test("names that would be paths and CA entries carrying a private key are refused with the bundle", async (t) => {
  const bad = (certificates: CACertificatesSpec["certificates"]) =>
    JSON.stringify(makeBundle([bundleStep({ certificates })]));
  t.throws(() => acceptBundle(bad([{ name: "../etc/passwd", pem: pemA }]), "test"), /spec\.certificates\[0\]\.name/);
  const withKey = `${pemA}-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n`;
  t.throws(() => acceptBundle(bad([{ name: "ca", pem: withKey }]), "test"), /carries a PRIVATE KEY block; refused/);
});

t.test("plans name certificates by subject, expiry and fingerprint rather than a base64 diff", async (t) => {
  const env = await stepEnv(t);
  const first = await converge(env, { certificates: [{ name: "registry", pem: pemA }] });
  t.match((first[0] as { diff: string }).diff, /^\+ CN=Test CA A \(expires \d{4}-\d\d-\d\d, sha256 [0-9a-f]{16}…\)$/);
  const changes = await planOf(env, { certificates: [{ name: "registry", pem: pemB }] });
  t.equal(changes[0]?.summary, `update /usr/local/share/ca-certificates/${PREFIX}registry.crt: content`);
  t.match((changes[0] as { diff: string }).diff, /^- CN=Test CA A .*\n\+ CN=Test CA B /);
  t.notMatch((changes[0] as { diff: string }).diff, /BEGIN CERTIFICATE/);
});
