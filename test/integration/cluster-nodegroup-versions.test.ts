// NodeGroup served as deckhouse.io/v1alpha1, v1alpha2 and v1 by a real kube-apiserver, converted
// by the bundle server's webhook (POST /convert), reached as in a cluster: through Service
// bashible-api (here an ExternalName to loopback) with the server's own certificate. Objects
// written in any version read back in any other, and the renderer renders them.
import t from "tap";
import https from "node:https";
import { withControlPlane } from "../../scripts/lib/control-plane-fixture.ts";
import { registerBundleServer } from "../../scripts/lib/bundle-server.ts";
import { installCrds } from "../../cluster/crds/install.ts";
import { createSecret } from "../../lib/kube/api.ts";
import { until } from "../../scripts/lib/until.ts";
import { CONVERSION_BODY_LIMITS } from "../../cluster/listener-limits.ts";

const cp = await withControlPlane(t);
const { app, caPem } = await registerBundleServer(cp);
t.teardown(() => app.stop());
// The webhook's Service port is the test server's (an ExternalName keeps the port asked for).
await installCrds(cp.admin, { conversion: { caBundle: caPem, port: app.port } });
// As a cloud cluster has it: the provider configuration lists the CloudPermanent groups.
await createSecret(cp.admin, {
  apiVersion: "v1",
  kind: "Secret",
  metadata: { name: "d8-provider-cluster-configuration", namespace: "kube-system" },
  stringData: {
    "cloud-provider-cluster-configuration.yaml": "apiVersion: deckhouse.io/v1\nnodeGroups:\n- name: front\n",
  },
});

type NG = { apiVersion: string; metadata: { name: string }; spec: Record<string, unknown> };
const path = (version: string, name = "") => `/apis/deckhouse.io/${version}/nodegroups${name ? `/${name}` : ""}`;
const create = (version: string, name: string, spec: Record<string, unknown>) =>
  cp.admin.request<NG>("POST", path(version), {
    body: { apiVersion: `deckhouse.io/${version}`, kind: "NodeGroup", metadata: { name }, spec },
  });
const read = (version: string, name: string) => cp.admin.request<NG>("GET", path(version, name));

t.test("a v1alpha1 group reads as v1: docker under cri, kubernetesVersion and static dropped", async (t) => {
  await create("v1alpha1", "legacy", {
    nodeType: "Static",
    kubernetesVersion: "1.30",
    static: { internalNetworkCIDRs: ["10.0.0.0/24"] },
    docker: { manage: false },
    kubelet: { maxPods: 150 },
  });
  const v1 = await read("v1", "legacy");
  t.equal(v1.apiVersion, "deckhouse.io/v1");
  t.equal(v1.spec.nodeType, "Static");
  t.same(v1.spec.cri, { docker: { manage: false } });
  t.equal((v1.spec.kubelet as { maxPods: number }).maxPods, 150);
  t.notOk("kubernetesVersion" in v1.spec);
  t.notOk("static" in v1.spec);
  const back = await read("v1alpha1", "legacy");
  t.same(back.spec.docker, { manage: false }, "read as v1alpha1 again, docker is where v1alpha1 has it");
  t.notOk("cri" in back.spec);
});

t.test("v1alpha2 node types read as v1's: Cloud, Hybrid listed by the provider, Hybrid not", async (t) => {
  await create("v1alpha2", "cloudy", { nodeType: "Cloud", cri: { type: "Containerd" } });
  await create("v1alpha2", "front", { nodeType: "Hybrid" });
  await create("v1alpha2", "edge", { nodeType: "Hybrid" });
  t.equal((await read("v1", "cloudy")).spec.nodeType, "CloudEphemeral");
  t.equal((await read("v1", "front")).spec.nodeType, "CloudPermanent");
  t.equal((await read("v1", "edge")).spec.nodeType, "CloudStatic");
});

t.test("a v1 group reads as v1alpha2 and v1alpha1; v1-only fields are left out of those views and kept", async (t) => {
  await create("v1", "modern", {
    nodeType: "CloudStatic",
    cri: { type: "Containerd", docker: { maxConcurrentDownloads: 2 } },
    kubelet: { maxPods: 90, resourceReservation: { mode: "Off" } },
  });
  const a2 = await read("v1alpha2", "modern");
  t.equal(a2.apiVersion, "deckhouse.io/v1alpha2");
  t.equal(a2.spec.nodeType, "Hybrid");
  t.same((a2.spec.cri as Record<string, unknown>).docker, { maxConcurrentDownloads: 2 });
  t.notOk("resourceReservation" in (a2.spec.kubelet as object), "not in v1alpha2's schema: pruned from the view");
  const a1 = await read("v1alpha1", "modern");
  t.same(a1.spec.docker, { maxConcurrentDownloads: 2 });
  t.same(a1.spec.cri, { type: "Containerd" });
  const v1 = await read("v1", "modern");
  t.same((v1.spec.kubelet as Record<string, unknown>).resourceReservation, { mode: "Off" }, "still stored");
  t.equal(v1.spec.nodeType, "CloudStatic");

  // A list in an old version goes through the webhook too (every item in one review).
  const listed = await cp.kubectl(["get", "nodegroups.v1alpha1.deckhouse.io", "-o", "jsonpath={.items[*].apiVersion}"]);
  t.match(listed, /^(deckhouse\.io\/v1alpha1 ?)+$/);
});

t.test("the renderer renders groups written in every version", async (t) => {
  for (const name of ["legacy", "cloudy", "front", "edge", "modern"]) {
    await until(`bundle for ${name}`, () => app.store.get("nodegroupbundles", name));
  }
  const kubelet = (name: string) =>
    (app.store.get("nodegroupbundles", name)!.object.steps as { kind: string; spec: { maxPods?: number } }[]).find(
      (s) => s.kind === "Kubelet",
    );
  t.equal(kubelet("legacy")?.spec.maxPods, 150, "v1alpha1's kubelet.maxPods reaches the bundle");
  t.equal(kubelet("modern")?.spec.maxPods, 90);
});

t.test("a ConversionReview over the body limit is refused without being read", async (t) => {
  const res = await new Promise<{ status: number; body: string }>((resolve, reject) => {
    const req = https.request(
      {
        host: "127.0.0.1",
        port: app.port,
        path: "/convert",
        method: "POST",
        ca: caPem,
        servername: "localhost",
        headers: { "Content-Type": "application/json", "Content-Length": CONVERSION_BODY_LIMITS.maxBytes + 1 },
      },
      (r) => {
        let body = "";
        r.on("data", (c) => (body += c));
        r.on("end", () => resolve({ status: r.statusCode ?? 0, body }));
      },
    );
    req.on("error", reject);
    req.write("{");
  });
  t.equal(res.status, 413);
  t.match(res.body, /ConversionReview: the body \(\d+ bytes\) is over 16777216 bytes/);
});
