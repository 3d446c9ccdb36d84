// NodeGroup conversion between Deckhouse's v1alpha1, v1alpha2 and v1, both ways and round trip,
// with the rules of Deckhouse's conversion hook; and the ConversionReview the webhook answers.
import t from "tap";
import {
  conversionResponse,
  convertNodeGroup,
  type NodeGroupDocument,
  parseConversionReview,
  ConversionError,
} from "../../cluster/crds/nodegroup-conversion.ts";

const none = { permanentGroups: new Set<string>() };
const ng = (apiVersion: string, name: string, spec: Record<string, unknown>): NodeGroupDocument => ({
  apiVersion,
  kind: "NodeGroup",
  metadata: { name, uid: "u-1", resourceVersion: "7", labels: { team: "a" } },
  spec,
  status: { ready: 2, nodes: 3 },
});

t.test(
  "a v1alpha1 group reads as v1: docker under cri, kubernetesVersion and static gone, the rest as written",
  async (t) => {
    const alpha1 = ng("deckhouse.io/v1alpha1", "worker", {
      nodeType: "Static",
      kubernetesVersion: "1.30",
      static: { internalNetworkCIDRs: ["10.0.0.0/24"] },
      docker: { maxConcurrentDownloads: 5, manage: false },
      kubelet: { maxPods: 150, rootDir: "/data/kubelet" },
      disruptions: { approvalMode: "Manual" },
    });
    const v1 = convertNodeGroup(alpha1, "deckhouse.io/v1", none);
    t.same(v1, {
      apiVersion: "deckhouse.io/v1",
      kind: "NodeGroup",
      metadata: alpha1.metadata,
      spec: {
        nodeType: "Static",
        cri: { docker: { maxConcurrentDownloads: 5, manage: false } },
        kubelet: { maxPods: 150, rootDir: "/data/kubelet" },
        disruptions: { approvalMode: "Manual" },
      },
      status: { ready: 2, nodes: 3 },
    });
    t.equal((alpha1.spec as { kubernetesVersion?: string }).kubernetesVersion, "1.30", "the input is not changed");
  },
);

t.test(
  "nodeType: Cloud ↔ CloudEphemeral; Hybrid → CloudPermanent when master or listed, else CloudStatic",
  async (t) => {
    const to1 = (name: string, nodeType: string, permanent: string[] = []) =>
      (
        convertNodeGroup(ng("deckhouse.io/v1alpha2", name, { nodeType }), "deckhouse.io/v1", {
          permanentGroups: new Set(permanent),
        }).spec as { nodeType: string }
      ).nodeType;
    t.equal(to1("w", "Cloud"), "CloudEphemeral");
    t.equal(to1("w", "Static"), "Static");
    t.equal(to1("w", "Hybrid"), "CloudStatic");
    t.equal(to1("front", "Hybrid", ["front"]), "CloudPermanent");
    t.equal(to1("master", "Hybrid"), "CloudPermanent");
    const toAlpha2 = (nodeType: string) =>
      (
        convertNodeGroup(ng("deckhouse.io/v1", "w", { nodeType }), "deckhouse.io/v1alpha2", none).spec as {
          nodeType: string;
        }
      ).nodeType;
    t.same(["CloudEphemeral", "CloudPermanent", "CloudStatic", "Static"].map(toAlpha2), [
      "Cloud",
      "Hybrid",
      "Hybrid",
      "Static",
    ]);
  },
);

t.test("v1 → v1alpha1: cri.docker back to docker; an emptied cri disappears, one with more stays", async (t) => {
  const only = convertNodeGroup(
    ng("deckhouse.io/v1", "w", { nodeType: "CloudEphemeral", cri: { docker: { manage: true } } }),
    "deckhouse.io/v1alpha1",
    none,
  );
  t.same(only.spec, { nodeType: "Cloud", docker: { manage: true } });
  t.equal(only.apiVersion, "deckhouse.io/v1alpha1");
  const more = convertNodeGroup(
    ng("deckhouse.io/v1", "w", { nodeType: "Static", cri: { type: "Docker", docker: { manage: true } } }),
    "deckhouse.io/v1alpha1",
    none,
  );
  t.same(more.spec, { nodeType: "Static", cri: { type: "Docker" }, docker: { manage: true } });
});

t.test("round trips keep every field the versions share", async (t) => {
  const v1Cases = [
    { nodeType: "Static", cri: { type: "Containerd", containerd: { maxConcurrentDownloads: 3 } } },
    { nodeType: "CloudEphemeral", cri: { docker: { manage: false } }, kubelet: { maxPods: 200 } },
    { nodeType: "CloudStatic", nodeTemplate: { labels: { a: "b" } } },
  ];
  for (const spec of v1Cases) {
    const v1 = ng("deckhouse.io/v1", "w", spec);
    for (const via of ["deckhouse.io/v1alpha1", "deckhouse.io/v1alpha2"] as const) {
      t.same(convertNodeGroup(convertNodeGroup(v1, via, none), "deckhouse.io/v1", none), v1, `v1 → ${via} → v1`);
    }
  }
  const permanent = ng("deckhouse.io/v1", "front", { nodeType: "CloudPermanent" });
  t.same(
    convertNodeGroup(convertNodeGroup(permanent, "deckhouse.io/v1alpha2", none), "deckhouse.io/v1", {
      permanentGroups: new Set(["front"]),
    }),
    permanent,
    "CloudPermanent comes back while the provider configuration lists the group",
  );
  const alpha1 = ng("deckhouse.io/v1alpha1", "w", { nodeType: "Hybrid", docker: { manage: true } });
  t.same(
    convertNodeGroup(convertNodeGroup(alpha1, "deckhouse.io/v1", none), "deckhouse.io/v1alpha1", none),
    alpha1,
    "v1alpha1 → v1 → v1alpha1",
  );
  const alpha2 = ng("deckhouse.io/v1alpha2", "w", { nodeType: "Cloud", cri: { docker: { manage: true } } });
  t.same(
    convertNodeGroup(convertNodeGroup(alpha2, "deckhouse.io/v1alpha1", none), "deckhouse.io/v1alpha2", none),
    alpha2,
    "v1alpha2 → v1alpha1 → v1alpha2",
  );
});

t.test(
  "a ConversionReview is answered with its uid; a foreign apiVersion fails the whole review by name",
  async (t) => {
    const review = {
      apiVersion: "apiextensions.k8s.io/v1",
      kind: "ConversionReview",
      request: {
        uid: "abc",
        desiredAPIVersion: "deckhouse.io/v1",
        objects: [ng("deckhouse.io/v1alpha2", "a", { nodeType: "Cloud" })],
      },
    };
    const ok = conversionResponse(parseConversionReview(review), none) as {
      response: { uid: string; result: { status: string }; convertedObjects: NodeGroupDocument[] };
    };
    t.equal(ok.response.uid, "abc");
    t.equal(ok.response.result.status, "Success");
    t.equal(ok.response.convertedObjects[0]?.apiVersion, "deckhouse.io/v1");

    const bad = structuredClone(review);
    bad.request.objects.push(ng("deckhouse.io/v2", "b", { nodeType: "Static" }));
    const failed = conversionResponse(parseConversionReview(bad), none) as {
      response: { result: { status: string; message: string }; convertedObjects: unknown[] };
    };
    t.equal(failed.response.result.status, "Failure");
    t.match(failed.response.result.message, /NodeGroup b: apiVersion deckhouse\.io\/v2 is not one of/);
    t.same(failed.response.convertedObjects, []);

    t.throws(() => parseConversionReview({ ...review, apiVersion: "apiextensions.k8s.io/v1beta1" }), ConversionError);
    t.throws(
      () => parseConversionReview({ ...review, request: { ...review.request, desiredAPIVersion: "apps/v1" } }),
      /desiredAPIVersion apps\/v1 is not a NodeGroup version/,
    );
    t.throws(() => parseConversionReview({ kind: "Pod" }), /not a ConversionReview/);
  },
);
