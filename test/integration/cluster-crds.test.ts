// The deckhouse.io CRDs on a real API server: they install, and their validation refuses
// the objects a user most often gets wrong.
import t from "tap";
import { withControlPlane } from "../fixtures/control-plane.ts";
import { installCrds } from "../../cluster/crds/install.ts";
import { KubeStatusError } from "../../lib/kube/errors.ts";

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
