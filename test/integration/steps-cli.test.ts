// The four built-in steps of part 1 through the agent's CLI (`plan`, `once`) on a sandbox tree:
// a bundle with NodeUsers, CACertificates, DeckhousePath and RegistryPackages plans, applies,
// then plans nothing, and neither the proxy token nor a password hash reaches any output.
import t from "tap";
import { mkdir, readFile, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { bashible } from "../../scripts/lib/cli.ts";
import { makeBundle, sandbox, treeHash, writeBundle } from "../../scripts/lib/bundle.ts";
import { withProxy } from "../../scripts/lib/packages-proxy.ts";
import { binaryPackage, buildLayer } from "../../scripts/lib/registry.ts";
import type { BundleStep } from "../../bundles/types.ts";
import { requireRoot } from "../fixtures/root.ts";

await requireRoot("NodeUsers and chown");

const HASH = "$6$clisalt$R6bM3wQ0o0cliHashNotForOutputR6bM3wQ0o0cliHashNotForOutputR6bM3wQ0o0cliHash";

t.test("plan, once, plan: the part-1 steps converge a Debian tree through the CLI", async (t) => {
  const f = await withProxy(t);
  const layer = await buildLayer(binaryPackage("jq", "1.7"));
  const { digest } = await f.registry.pushPackage("deckhouse/packages/jq", "1.7", layer);
  const root = await sandbox();
  await writeFile(path.join(root, "etc/passwd"), "root:x:0:0:root:/root:/bin/bash\n");
  await writeFile(path.join(root, "etc/group"), "root:x:0:\nusers:x:100:\n");
  await writeFile(path.join(root, "etc/shadow"), "root:*:19000:0:99999:7:::\n", { mode: 0o640 });
  await writeFile(path.join(root, "etc/gshadow"), "root:*::\nusers:*::\n", { mode: 0o640 });
  await mkdir(path.join(root, "home"));
  const steps: BundleStep[] = [
    {
      name: "000_add_node_users",
      kind: "NodeUsers",
      spec: {
        users: [
          {
            name: "ops",
            uid: 1500,
            sshPublicKeys: ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOps ops@x"],
            passwordHash: HASH,
            isSudoer: true,
            extraGroups: [],
          },
        ],
      },
    },
    {
      name: "003_install_ca_certificates",
      kind: "CACertificates",
      spec: { certificates: [{ name: "cluster", pem: f.clusterCA }] },
    },
    { name: "004_add_deckhouse_paths", kind: "DeckhousePath", spec: {} },
    {
      name: "007_fetch_registry_packages",
      kind: "RegistryPackages",
      spec: { packages: [{ name: "jq", digest, repository: "deckhouse/packages/jq" }] },
    },
  ];
  const bundle = makeBundle(steps, {
    context: { clusterCA: f.clusterCA, packagesProxy: { endpoints: [f.endpoint], token: f.token } },
  });
  const file = await writeBundle(path.dirname(root), bundle, `b-${path.basename(root)}.json`);
  const secretsAbsent = (what: string, s: string) => {
    t.notOk(s.includes(f.token), `${what}: no token`);
    t.notOk(s.includes(HASH), `${what}: no password hash`);
  };

  const before = await treeHash(root);
  const p1 = await bashible(["plan", "--root", root, "--bundle", file]);
  t.equal(p1.status, 2, p1.stderr);
  t.match(p1.stdout, /install package jq sha256:/);
  t.match(p1.stdout, /create user ops/);
  secretsAbsent("plan", p1.stdout + p1.stderr);
  t.equal(await treeHash(root), before, "plan wrote nothing");

  const once = await bashible(["once", "--root", root, "--bundle", file, "--log-format", "json"]);
  t.equal(once.status, 0, once.stdout + once.stderr);
  secretsAbsent("once", once.stdout + once.stderr);
  t.match(await readFile(path.join(root, "etc/passwd"), "utf8"), /^ops:x:1500:100:created by deckhouse:/m);
  t.ok(await readFile(path.join(root, "opt/deckhouse/bin/jq")));
  t.ok(await readFile(path.join(root, "etc/ssl/certs/bashible-cluster.pem")));
  t.ok(await readFile(path.join(root, "etc/profile.d/02-deckhouse-path.sh")));
  for (const log of ["000_add_node_users", "007_fetch_registry_packages"]) {
    const text = await readFile(path.join(root, `var/log/d8/bashible/step.${log}.log`), "utf8").catch(() => "");
    secretsAbsent(`step log ${log}`, text);
  }

  // Force the gate open: the steps themselves must find nothing to do.
  await writeFile(path.join(root, "var/lib/bashible/configuration_checksum"), "stale\n");
  const p2 = await bashible(["plan", "--root", root, "--bundle", file]);
  t.match(p2.stdout, /0 of 4 steps would change the node/, p2.stdout);
});

t.test(
  "a custom script installs a registry package with bb-package-install (verified through the proxy)",
  async (t) => {
    const f = await withProxy(t);
    const layer = await buildLayer(binaryPackage("yq", "4.4"));
    const { digest } = await f.registry.pushPackage("deckhouse/packages/yq", "4.4", layer);
    const root = await sandbox();
    const steps: BundleStep[] = [
      {
        name: "050_tools",
        kind: "Script",
        spec: {
          script: [
            `bb-event-on 'bb-package-installed' '_installed'`,
            `_installed() { echo "installed $1" >> "$BASHIBLE_ROOT/events"; }`,
            `bb-package-install "yq:${digest}@deckhouse/packages/yq"`,
          ].join("\n"),
          weight: 50,
          source: "NodeGroupConfiguration/tools",
          bundles: [],
        },
      },
    ];
    const bundle = makeBundle(steps, {
      context: { clusterCA: f.clusterCA, packagesProxy: { endpoints: [f.endpoint], token: f.token } },
    });
    const file = await writeBundle(path.dirname(root), bundle, `b-${path.basename(root)}.json`);
    const r = await bashible(["once", "--root", root, "--bundle", file, "--log-format", "json"]);
    t.equal(r.status, 0, r.stdout + r.stderr);
    t.notOk((r.stdout + r.stderr).includes(f.token), "no token in any output");
    t.ok(await readFile(path.join(root, "opt/deckhouse/bin/yq")), "installed by the package's install");
    t.equal((await readFile(path.join(root, "var/cache/registrypackages/yq/digest"), "utf8")).trim(), digest);
    t.equal(await readFile(path.join(root, "events"), "utf8"), "installed yq\n", "bb-package-installed fired");
    // A forced run runs the script again: the package is at that digest, nothing is fetched, no event.
    await rm(path.join(root, "var/lib/bashible/configuration_checksum"));
    await writeFile(path.join(root, "events"), "");
    const served = f.proxy.stats.served;
    const again = await bashible(["once", "--root", root, "--bundle", file, "--log-format", "json"]);
    t.equal(again.status, 0);
    t.match(again.stdout, /NodeGroupConfiguration\/tools/, "the script ran again");
    t.equal(f.proxy.stats.served, served, "nothing downloaded");
    t.equal(await readFile(path.join(root, "events"), "utf8"), "", "skipped: no event");
  },
);
