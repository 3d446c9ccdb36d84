// A NodeGroup's nodeTemplate on a Node, as a pure function: what is added, what the template
// dropped is removed, what others set stays, and the last-applied record matches Deckhouse's.
import t from "tap";
import { NODE_KEYS } from "../../bundles/names.ts";
import {
  LastAppliedError,
  lastAppliedValue,
  nodeTemplatePatch,
  type NodeTemplate,
  type TemplateNode,
  templateOf,
} from "../../cluster/controllers/node-template.ts";

const K = NODE_KEYS;
const tpl = (t: Partial<NodeTemplate> = {}): NodeTemplate => ({ labels: {}, annotations: {}, taints: [], ...t });
const group = (template: NodeTemplate, nodeType = "Static") => ({ name: "worker", nodeType, template });
const node = (o: Partial<TemplateNode> = {}): TemplateNode => ({
  name: "w1",
  resourceVersion: "7",
  labels: { [K.group]: "worker" },
  annotations: {},
  taints: [],
  providerID: "static://",
  ...o,
});
/** The Node once `patch` is applied (merge patch semantics). */
function applied(n: TemplateNode, p: ReturnType<typeof nodeTemplatePatch>): TemplateNode {
  if (!p) return n;
  const merge = (a: Record<string, string>, b: Record<string, string | null> | undefined) => {
    const out = { ...a };
    for (const [k, v] of Object.entries(b ?? {})) {
      if (v === null) delete out[k];
      else out[k] = v;
    }
    return out;
  };
  return {
    ...n,
    labels: merge(n.labels, p.body.metadata.labels),
    annotations: merge(n.annotations, p.body.metadata.annotations),
    taints: p.body.spec?.taints === undefined ? n.taints : (p.body.spec.taints ?? []),
    providerID: p.body.spec?.providerID ?? n.providerID,
  };
}

t.test("a fresh node gets the template, the role and type labels and the record; then nothing more", async (t) => {
  const g = group(
    tpl({
      labels: { tier: "a", "kubernetes.io/role-x": "y" },
      annotations: { team: "x" },
      taints: [{ key: "ded", value: "gpu", effect: "NoSchedule" }],
    }),
  );
  const p = nodeTemplatePatch(node(), g);
  t.ok(p);
  t.equal(p?.body.metadata.resourceVersion, "7", "a compare-and-swap on the version it was read at");
  const n = applied(node(), p);
  t.equal(n.labels.tier, "a");
  t.equal(n.labels["kubernetes.io/role-x"], "y", "kubernetes.io labels the kubelet may not set are set here");
  t.equal(n.labels["node-role.kubernetes.io/worker"], "", "Deckhouse's role label");
  t.equal(n.labels[K.nodeType], "Static");
  t.equal(n.annotations.team, "x");
  t.equal(n.annotations["cluster-autoscaler.kubernetes.io/scale-down-disabled"], "true");
  t.same(n.taints, [{ key: "ded", value: "gpu", effect: "NoSchedule" }]);
  t.equal(n.annotations[K.lastAppliedNodeTemplate], lastAppliedValue(g.template));
  t.equal(nodeTemplatePatch(n, g), undefined, "a node that carries it is not written again");
});

t.test("keys the template drops are removed; keys others set stay", async (t) => {
  const first = group(
    tpl({ labels: { a: "1", b: "2" }, annotations: { x: "1" }, taints: [{ key: "t", effect: "NoSchedule" }] }),
  );
  let n = applied(node(), nodeTemplatePatch(node(), first));
  // Someone else adds their own label, annotation and taint.
  n = {
    ...n,
    labels: { ...n.labels, theirs: "v" },
    annotations: { ...n.annotations, their: "v" },
    taints: [...n.taints, { key: "other", effect: "NoExecute", timeAdded: "2026-01-01T00:00:00Z" }],
  };
  const second = group(tpl({ labels: { a: "1" } }));
  const p = nodeTemplatePatch(n, second);
  t.same(p?.body.metadata.labels?.b, null, "label b removed");
  t.same(p?.body.metadata.annotations?.x, null, "annotation x removed");
  const after = applied(n, p);
  t.equal(after.labels.theirs, "v", "another's label stays");
  t.equal(after.annotations.their, "v", "another's annotation stays");
  t.same(
    after.taints,
    [{ key: "other", effect: "NoExecute", timeAdded: "2026-01-01T00:00:00Z" }],
    "only the dropped taint goes, the other kept as it was",
  );
  t.equal(nodeTemplatePatch(after, second), undefined);
});

t.test("a label the node already has with the template's value is not rewritten; a changed value is", async (t) => {
  const g = group(tpl({ labels: { a: "1" } }));
  const n = applied(node(), nodeTemplatePatch(node(), g));
  const p = nodeTemplatePatch({ ...n, labels: { ...n.labels, a: "9" } }, g);
  t.same(p?.body.metadata.labels, { a: "1" });
  t.match(p?.changes, ["label ~a"]);
});

t.test("taints are one per key and effect: a value change replaces it, another effect is another taint", async (t) => {
  const g = group(tpl({ taints: [{ key: "k", value: "2", effect: "NoSchedule" }] }));
  const n = node({
    taints: [
      { key: "k", value: "1", effect: "NoSchedule" },
      { key: "k", effect: "NoExecute" },
    ],
  });
  const after = applied(n, nodeTemplatePatch(n, g));
  t.same(after.taints, [
    { key: "k", value: "2", effect: "NoSchedule" },
    { key: "k", effect: "NoExecute" },
  ]);
});

t.test("Deckhouse's uninitialized taint goes with the template; the last taint gone removes the list", async (t) => {
  const n = node({ taints: [{ key: K.deckhouseUninitializedTaint, effect: "NoSchedule" }] });
  const p = nodeTemplatePatch(n, group(tpl()));
  t.equal(p?.body.spec?.taints, null);
});

t.test("providerID static:// only where no cloud provider names the node", async (t) => {
  t.equal(nodeTemplatePatch(node({ providerID: undefined }), group(tpl()))?.body.spec?.providerID, "static://");
  const cloud = node({
    providerID: undefined,
    taints: [{ key: "node.cloudprovider.kubernetes.io/uninitialized", effect: "NoSchedule" }],
  });
  t.equal(nodeTemplatePatch(cloud, group(tpl()))?.body.spec?.providerID, undefined, "the cloud provider will set it");
  t.equal(nodeTemplatePatch(node({ providerID: "aws:///x" }), group(tpl()))?.body.spec?.providerID, undefined);
});

t.test("group master gets both control-plane role labels", async (t) => {
  const p = nodeTemplatePatch(node(), { name: "master", nodeType: "CloudPermanent", template: tpl() });
  t.equal(p?.body.metadata.labels?.["node-role.kubernetes.io/control-plane"], "");
  t.equal(p?.body.metadata.labels?.["node-role.kubernetes.io/master"], "");
  t.equal(p?.body.metadata.labels?.["node-role.kubernetes.io/master"], "");
});

t.test("the record is Deckhouse's JSON: sorted keys, taint fields in Go's order, Go's escaping", async (t) => {
  const v = lastAppliedValue(
    tpl({ labels: { z: "1", a: "<&>" }, taints: [{ effect: "NoSchedule", key: "k" } as never] }),
  );
  t.equal(
    v,
    '{"annotations":{},"labels":{"a":"\\u003c\\u0026\\u003e","z":"1"},"taints":[{"key":"k","effect":"NoSchedule"}]}',
  );
  t.same(templateOf({ nodeTemplate: { labels: { a: "1" } } }), tpl({ labels: { a: "1" } }));
});

t.test("a record that does not parse removes nothing and says so", async (t) => {
  t.throws(
    () => nodeTemplatePatch(node({ annotations: { [K.lastAppliedNodeTemplate]: "{oops" } }), group(tpl())),
    LastAppliedError,
  );
});
