// The deckhouse.io CRDs on a real API server: they install, their validation refuses the
// objects a user most often gets wrong, and Deckhouse's own manifests apply unchanged.
import t from "tap";
import { withControlPlane } from "../../scripts/lib/control-plane-fixture.ts";
import { ForeignCrdError, installCrds } from "../../cluster/crds/install.ts";
import { bashible } from "../../scripts/lib/cli.ts";
import { KubeStatusError } from "../../lib/kube/errors.ts";
import { readFile } from "node:fs/promises";
import { createCA } from "../../scripts/lib/pki.ts";

const cp = await withControlPlane(t);
await installCrds(cp.admin);

const create = (path: string, body: unknown) => cp.admin.request("POST", path, { body });
const NU = "/apis/deckhouse.io/v1/nodeusers";
const NG = "/apis/deckhouse.io/v1/nodegroups";
const NGC = "/apis/deckhouse.io/v1alpha1/nodegroupconfigurations";
const user = (name: string, spec: Record<string, unknown>) => ({
  apiVersion: "deckhouse.io/v1",
  kind: "NodeUser",
  metadata: { name },
  spec: { uid: 1100, sshPublicKeys: ["ssh-ed25519 AAAA test"], ...spec },
});

t.test("installing twice is harmless", async (t) => {
  await installCrds(cp.admin);
  t.pass();
});

t.test("a NodeUser with uid 1000 or less is refused", async (t) => {
  const err = await create(NU, user("low", { uid: 1000 })).catch((e) => e);
  t.type(err, KubeStatusError);
  t.equal(err.status, 422);
  t.match(err.message, /uid/);
  await create(NU, user("ok", { uid: 1001 }));
});

t.test("a NodeUser's status.errors can be patched per node and defaults apply", async (t) => {
  await create(NU, user("alice", { isSudoer: true }));
  const patched = await cp.admin.request<{
    status: { errors: Record<string, string> };
    spec: { nodeGroups: string[] };
  }>("PATCH", `${NU}/alice/status`, { body: { status: { errors: { "worker-1": "useradd failed" } } } });
  t.same(patched.status.errors, { "worker-1": "useradd failed" });
  t.same(patched.spec.nodeGroups, ["*"], "nodeGroups defaults to every group");
});

t.test("a NodeGroup needs a known nodeType and minPerZone <= maxPerZone", async (t) => {
  const bad = await create(NG, {
    apiVersion: "deckhouse.io/v1",
    kind: "NodeGroup",
    metadata: { name: "bad" },
    spec: { nodeType: "Bare" },
  }).catch((e) => e);
  t.equal(bad.status, 422);
  const scale = await create(NG, {
    apiVersion: "deckhouse.io/v1",
    kind: "NodeGroup",
    metadata: { name: "cloud" },
    spec: { nodeType: "CloudEphemeral", cloudInstances: { minPerZone: 3, maxPerZone: 1 } },
  }).catch((e) => e);
  t.equal(scale.status, 422);
  t.match(scale.message, /minPerZone/);
  const ok = await create(NG, {
    apiVersion: "deckhouse.io/v1",
    kind: "NodeGroup",
    metadata: { name: "worker" },
    spec: { nodeType: "Static", update: { maxConcurrent: "25%" } },
  });
  t.same((ok as { spec: { disruptions: unknown } }).spec.disruptions, undefined);
});

t.test("a NodeGroupConfiguration gets weight 100 and all groups by default", async (t) => {
  const ngc = await create(NGC, {
    apiVersion: "deckhouse.io/v1alpha1",
    kind: "NodeGroupConfiguration",
    metadata: { name: "sysctl" },
    spec: { content: "sysctl -w vm.swappiness=1\n" },
  });
  t.same((ngc as { spec: Record<string, unknown> }).spec, {
    content: "sysctl -w vm.swappiness=1\n",
    weight: 100,
    nodeGroups: ["*"],
    bundles: ["*"],
  });
});

// Deckhouse's manifests apply unchanged.

const NU_ALPHA = "/apis/deckhouse.io/v1alpha1/nodeusers";
type Obj = { metadata: { labels?: Record<string, string>; resourceVersion?: string }; spec: Record<string, unknown> };

t.test("a NodeUser with Deckhouse's deprecated sshPublicKey and key options is accepted", async (t) => {
  const created = await create(NU, {
    apiVersion: "deckhouse.io/v1",
    kind: "NodeUser",
    metadata: { name: "legacy" },
    spec: {
      uid: 1101,
      sshPublicKey: "ssh-rsa AAAAB3Nza legacy@example",
      sshPublicKeys: [
        'cert-authority,principals="ops" ssh-rsa AAAAB3Nza ca',
        'command="uptime" ssh-ed25519 AAAAC3Nz x',
      ],
      passwordHash: "$2a$10$F9ey7zW.sVliT224RFxpWeMsgzO.D9YRG54a8T36/K2MCiT41nzmC",
      isSudoer: true,
    },
  });
  t.equal((created as Obj).spec.sshPublicKey, "ssh-rsa AAAAB3Nza legacy@example");
  const missing = await create(NU, user("nokeys", { sshPublicKeys: undefined })).catch((e) => e);
  t.equal(missing.status, 422);
  t.match(missing.message, /sshPublicKeys/);
  const garbage = await create(NU, user("garbage", { sshPublicKeys: ["not a key"] })).catch((e) => e);
  t.equal(garbage.status, 422, "a line without a key type is refused");
});

t.test("NodeUser v1alpha1 is still served, with the same schema", async (t) => {
  await create(NU_ALPHA, {
    apiVersion: "deckhouse.io/v1alpha1",
    kind: "NodeUser",
    metadata: { name: "old-api" },
    spec: { uid: 1102, sshPublicKeys: ["ssh-ed25519 AAAA old"] },
  });
  const v1 = await cp.admin.request<Obj>("GET", `${NU}/old-api`);
  t.same(v1.spec, { uid: 1102, sshPublicKeys: ["ssh-ed25519 AAAA old"], isSudoer: false, nodeGroups: ["*"] });
});

t.test("a NodeGroup gets Deckhouse's defaults and keeps the fields not acted on yet", async (t) => {
  const spec = {
    nodeType: "CloudEphemeral",
    chaos: { mode: "DrainAndDelete", period: "24h" },
    operatingSystem: { manageKernel: false },
    gpu: { sharing: "TimeSlicing", timeSlicing: { partitionCount: 4 } },
    nodeDrainTimeoutSecond: 600,
    cloudInstances: {
      minPerZone: 1,
      maxPerZone: 3,
      priority: 10,
      standby: "10%",
      standbyHolder: { overprovisioningRate: 50 },
      classReference: { kind: "OpenStackInstanceClass", name: "m1" },
      zones: ["a"],
    },
    kubelet: { topologyManager: { enabled: true, policy: "SingleNumaNode" }, maxPods: 150 },
    disruptions: { approvalMode: "Automatic", automatic: { windows: [{ from: "06:00", to: "08:00", days: ["Tue"] }] } },
    fencing: { mode: "Watchdog" },
  };
  const got = (await create(NG, {
    apiVersion: "deckhouse.io/v1",
    kind: "NodeGroup",
    metadata: { name: "deckhouse-like" },
    spec,
  })) as Obj;
  t.same(got.spec.chaos, spec.chaos);
  t.same(got.spec.operatingSystem, spec.operatingSystem);
  t.same(got.spec.gpu, spec.gpu);
  t.equal(got.spec.nodeDrainTimeoutSecond, 600);
  t.same(got.spec.cloudInstances, spec.cloudInstances);
  t.same(got.spec.kubelet, {
    maxPods: 150,
    containerLogMaxSize: "50Mi",
    containerLogMaxFiles: 4,
    resourceReservation: { mode: "Auto" },
    topologyManager: { enabled: true, policy: "SingleNumaNode", scope: "Container" },
  });
  t.same(got.spec.update, { maxConcurrent: 1 });
  t.same((got.spec.fencing as Record<string, unknown>).watchdog, undefined, "no watchdog block unless given");

  const plain = (await create(NG, {
    apiVersion: "deckhouse.io/v1",
    kind: "NodeGroup",
    metadata: { name: "plain" },
    spec: { nodeType: "Static" },
  })) as Obj;
  t.same(plain.spec.kubelet, {
    containerLogMaxSize: "50Mi",
    containerLogMaxFiles: 4,
    resourceReservation: { mode: "Auto" },
  });
  t.same(plain.spec.update, { maxConcurrent: 1 });
});

t.test("update.maxConcurrent takes a count or a percentage, nothing else", async (t) => {
  const ng = (name: string, maxConcurrent: unknown) =>
    create(NG, {
      apiVersion: "deckhouse.io/v1",
      kind: "NodeGroup",
      metadata: { name },
      spec: { nodeType: "Static", update: { maxConcurrent } },
    });
  await ng("mc-count", 3);
  await ng("mc-percent", "25%");
  for (const [name, bad] of [
    ["mc-zero", 0],
    ["mc-word", "all"],
  ] as const) {
    const err = await ng(name, bad).catch((e) => e);
    t.equal(err.status, 422, `${JSON.stringify(bad)} refused`);
  }
});

t.test("a NodeGroupConfiguration takes any weight, Deckhouse's names, and a status", async (t) => {
  for (const [name, weight] of [
    ["heavy.sh", 5000],
    ["early.sh", -5],
    ["add-custom-ca.sh", 31],
  ] as const) {
    const got = (await create(NGC, {
      apiVersion: "deckhouse.io/v1alpha1",
      kind: "NodeGroupConfiguration",
      metadata: { name },
      spec: { content: "true\n", weight, nodeGroups: ["*"], bundles: ["centos-7"] },
    })) as Obj;
    t.equal(got.spec.weight, weight, name);
  }
  const patched = await cp.admin.request<{ status: { error: string } }>("PATCH", `${NGC}/heavy.sh/status`, {
    body: { status: { error: "boom", failedNodeGroups: ["worker"] } },
  });
  t.equal(patched.status.error, "boom");
});

t.test("--install-crds refuses to replace a CRD it did not install, unless forced", async (t) => {
  const path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/nodegroupconfigurations.deckhouse.io";
  const mine = await cp.admin.request<Obj & { metadata: Record<string, unknown> }>("GET", path);
  // Make it look like Deckhouse's own: another heritage and no status subresource.
  const foreign = structuredClone(mine) as unknown as {
    metadata: { labels: Record<string, string> };
    spec: { versions: { subresources?: unknown }[] };
  };
  foreign.metadata.labels = { heritage: "deckhouse", module: "node-manager" };
  delete foreign.spec.versions[0]!.subresources;
  await cp.admin.request("PUT", path, { body: foreign });

  const err = await installCrds(cp.admin).catch((e) => e);
  t.type(err, ForeignCrdError);
  t.match(err.message, /nodegroupconfigurations\.deckhouse\.io \(heritage=deckhouse\).*--force-crds/);
  const after = await cp.admin.request<{ metadata: { labels: Record<string, string> } }>("GET", path);
  t.equal(after.metadata.labels.heritage, "deckhouse", "left as it was");

  const cli = await bashible(["server", "--kubeconfig", cp.adminKubeconfig, "--install-crds", "--no-manage-secrets"]);
  t.equal(cli.status, 1, "the server does not start");
  t.match(cli.stdout + cli.stderr, /not replacing CRDs this server did not install/);

  await installCrds(cp.admin, { force: true });
  const forced = await cp.admin.request<{ metadata: { labels: Record<string, string> } }>("GET", path);
  t.equal(forced.metadata.labels.heritage, "bashible", "replaced when forced");
});

t.test(
  "taking over Deckhouse's NodeGroup CRD: every stored version stays served, conversion points here",
  async (t) => {
    const path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/nodegroups.deckhouse.io";
    const deckhouseCA = await createCA(cp.dir, "deckhouse-webhook-ca", "deckhouse-webhook-handler");
    const mine = await cp.admin.request<Obj & { metadata: Record<string, unknown> }>("GET", path);
    const foreign = structuredClone(mine) as unknown as {
      metadata: { labels: Record<string, string> };
      spec: { conversion: { webhook: { clientConfig: Record<string, unknown> } } };
    };
    // As Deckhouse has it: its label, and conversion by its webhook-handler with that one's CA.
    foreign.metadata.labels = { heritage: "deckhouse", module: "node-manager" };
    foreign.spec.conversion.webhook.clientConfig = {
      service: { namespace: "d8-system", name: "conversion-webhook-handler", path: "/", port: 443 },
      caBundle: Buffer.from(await readFile(deckhouseCA.cert)).toString("base64"),
    };
    await cp.admin.request("PUT", path, { body: foreign });
    // Objects were written in the old versions once: the API server keeps them in storedVersions.
    const withStatus = await cp.admin.request<{ status: { storedVersions: string[] } }>("GET", path);
    withStatus.status.storedVersions = ["v1alpha1", "v1alpha2", "v1"];
    await cp.admin.request("PUT", `${path}/status`, { body: withStatus });

    await installCrds(cp.admin, { force: true });
    const taken = await cp.admin.request<{
      metadata: { labels: Record<string, string> };
      spec: {
        versions: { name: string; served: boolean }[];
        conversion: { webhook: { clientConfig: Record<string, unknown> } };
      };
      status: { storedVersions: string[] };
    }>("GET", path);
    t.equal(taken.metadata.labels.heritage, "bashible");
    t.same(taken.status.storedVersions.sort(), ["v1", "v1alpha1", "v1alpha2"], "accepted with every stored version");
    t.same(
      taken.spec.versions
        .filter((v) => v.served)
        .map((v) => v.name)
        .sort(),
      ["v1", "v1alpha1", "v1alpha2"],
    );
    t.same(taken.spec.conversion.webhook.clientConfig.service, {
      namespace: "d8-cloud-instance-manager",
      name: "bashible-api",
      path: "/convert",
      port: 443,
    });
    t.notOk(taken.spec.conversion.webhook.clientConfig.caBundle, "Deckhouse's webhook CA is not kept");

    const ours = await createCA(cp.dir, "bashible-conversion-ca", "bashible-server-ca");
    const pem = await readFile(ours.cert, "utf8");
    await installCrds(cp.admin, { conversion: { caBundle: pem } });
    await installCrds(cp.admin);
    const again = await cp.admin.request<{
      spec: { conversion: { webhook: { clientConfig: { caBundle?: string } } } };
    }>("GET", path);
    t.equal(
      again.spec.conversion.webhook.clientConfig.caBundle,
      Buffer.from(pem).toString("base64"),
      "ours, given once, survives a reinstall",
    );
  },
);
