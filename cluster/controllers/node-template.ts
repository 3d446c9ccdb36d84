// A NodeGroup's nodeTemplate on one Node, as Deckhouse's handle_node_templates hook keeps it: the
// template's labels, annotations and taints are set; keys the template dropped since it was
// last applied are removed; keys anyone else set are left alone. What was applied is recorded
// on the Node in Deckhouse's annotation node-manager.deckhouse.io/last-applied-node-template,
// in Deckhouse's JSON, so a Node moved between Deckhouse and this controller keeps its history.
// Beside the template: node-role.kubernetes.io/<group> and node.deckhouse.io/type labels, the
// control-plane role labels on group master, the autoscaler's scale-down-disabled annotation
// on nodes that are not ephemeral, Deckhouse's node.deckhouse.io/uninitialized taint removed,
// and providerID static:// on nodes no cloud provider names (set_provider_id_on_static_nodes).
// Pure: the controller (node-template-controller.ts) writes what this returns.
import { NODE_KEYS } from "../../bundles/names.ts";

export interface Taint {
  key: string;
  value?: string;
  effect: string;
  /** Set by the API server on NoExecute taints; kept as it is on taints this controller does not own. */
  timeAdded?: string;
}

export interface NodeTemplate {
  labels: Record<string, string>;
  annotations: Record<string, string>;
  taints: Taint[];
}

export interface TemplateGroup {
  name: string;
  nodeType: string;
  template: NodeTemplate;
}

export interface TemplateNode {
  name: string;
  resourceVersion: string | undefined;
  labels: Record<string, string>;
  annotations: Record<string, string>;
  taints: Taint[];
  providerID: string | undefined;
}

export interface TemplatePatch {
  /** The JSON merge patch (null removes a key; the taints list is replaced whole). */
  body: {
    metadata: {
      resourceVersion?: string;
      labels?: Record<string, string | null>;
      annotations?: Record<string, string | null>;
    };
    spec?: { taints?: Taint[] | null; providerID?: string };
  };
  /** What changes, for the log line: `label +a`, `taint -b:NoSchedule`, … */
  changes: string[];
}

const MASTER_ROLES = ["node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master"];
const SCALE_DOWN_DISABLED = "cluster-autoscaler.kubernetes.io/scale-down-disabled";
const CLOUD_UNINITIALIZED = "node.cloudprovider.kubernetes.io/uninitialized";
const STATIC_PROVIDER_ID = "static://";
const NOT_EPHEMERAL = new Set(["CloudPermanent", "CloudStatic", "Static"]);

/** A taint's identity on a Node: the API server allows one taint per key and effect. */
const taintId = (t: Taint) => `${t.key}:${t.effect}`;
const sameTaint = (a: Taint, b: Taint) => taintId(a) === taintId(b) && (a.value ?? "") === (b.value ?? "");

/** spec.nodeTemplate as written (absent parts are empty). */
export function templateOf(spec: unknown): NodeTemplate {
  const t = ((spec ?? {}) as { nodeTemplate?: Partial<NodeTemplate> }).nodeTemplate ?? {};
  return {
    labels: { ...(t.labels ?? {}) },
    annotations: { ...(t.annotations ?? {}) },
    taints: (t.taints ?? []).map((x) => ({ key: x.key, ...(x.value ? { value: x.value } : {}), effect: x.effect })),
  };
}

/** Go's encoding/json escapes these in strings; so must we, for the annotation to match Deckhouse's byte for byte. */
const goEscape = (json: string) =>
  json.replace(/[<>&\u2028\u2029]/g, (c) => `\\u${(c.codePointAt(0) ?? 0).toString(16).padStart(4, "0")}`);

const sorted = (m: Record<string, string>) =>
  Object.fromEntries(
    Object.keys(m)
      .sort()
      .map((k) => [k, m[k]]),
  );

/** The annotation's value, as Deckhouse writes it (sorted keys, Taint's field order, empty value left out). */
export function lastAppliedValue(t: NodeTemplate): string {
  return goEscape(
    JSON.stringify({
      annotations: sorted(t.annotations),
      labels: sorted(t.labels),
      taints: t.taints.map((x) => ({ key: x.key, ...(x.value ? { value: x.value } : {}), effect: x.effect })),
    }),
  );
}

export class LastAppliedError extends Error {
  override name = "LastAppliedError";
}

/** The template recorded on a Node; undefined when none. Throws LastAppliedError when it does not parse. */
export function parseLastApplied(value: string | undefined): NodeTemplate | undefined {
  if (value === undefined || value === "") return undefined;
  let v: unknown;
  try {
    v = JSON.parse(value);
  } catch (err) {
    throw new LastAppliedError(`${NODE_KEYS.lastAppliedNodeTemplate} is not JSON: ${(err as Error).message}`);
  }
  if (!v || typeof v !== "object" || Array.isArray(v))
    throw new LastAppliedError(`${NODE_KEYS.lastAppliedNodeTemplate} is not a JSON object`);
  const o = v as Record<string, unknown>;
  const map = (x: unknown) =>
    x && typeof x === "object" && !Array.isArray(x)
      ? (Object.fromEntries(Object.entries(x).filter(([, s]) => typeof s === "string")) as Record<string, string>)
      : {};
  const taints = Array.isArray(o.taints)
    ? o.taints
        .filter((t): t is Taint => !!t && typeof t === "object" && typeof (t as Taint).key === "string")
        .map((t) => ({ key: t.key, ...(t.value ? { value: t.value } : {}), effect: String(t.effect ?? "") }))
    : [];
  return { labels: map(o.labels), annotations: map(o.annotations), taints };
}

/** Merges `template` into `actual`, removing keys `last` had and `template` no longer has. */
function applyMap(
  actual: Record<string, string>,
  template: Record<string, string>,
  last: Record<string, string> | undefined,
  kind: string,
  patch: Record<string, string | null>,
  changes: string[],
): void {
  for (const k of Object.keys(last ?? {})) {
    if (k in template || !(k in actual)) continue;
    patch[k] = null;
    changes.push(`${kind} -${k}`);
  }
  for (const [k, v] of Object.entries(template)) {
    if (actual[k] === v) continue;
    patch[k] = v;
    changes.push(`${kind} ${k in actual ? "~" : "+"}${k}`);
  }
}

/**
 * The patch that brings `node` to `group`'s template, or undefined when it carries it already.
 * Throws LastAppliedError when the Node's record of the last template does not parse (nothing is
 * removed on a guess; the controller reports it).
 */
export function nodeTemplatePatch(node: TemplateNode, group: TemplateGroup): TemplatePatch | undefined {
  const last = parseLastApplied(node.annotations[NODE_KEYS.lastAppliedNodeTemplate]);
  const { template } = group;
  const changes: string[] = [];

  const labels: Record<string, string | null> = {};
  applyMap(node.labels, template.labels, last?.labels, "label", labels, changes);
  const fixed: Record<string, string> = {
    [`${NODE_KEYS.nodeRolePrefix}${group.name}`]: "",
    [NODE_KEYS.nodeType]: group.nodeType,
  };
  // Deckhouse keeps both role labels on its master group (control-plane, and master for old software).
  if (group.name === "master") for (const k of MASTER_ROLES) fixed[k] = "";
  for (const [k, v] of Object.entries(fixed)) {
    if (node.labels[k] === v || labels[k] === v) continue;
    labels[k] = v;
    changes.push(`label ${k in node.labels ? "~" : "+"}${k}`);
  }

  const annotations: Record<string, string | null> = {};
  applyMap(node.annotations, template.annotations, last?.annotations, "annotation", annotations, changes);
  const record = lastAppliedValue(template);
  if (node.annotations[NODE_KEYS.lastAppliedNodeTemplate] !== record)
    annotations[NODE_KEYS.lastAppliedNodeTemplate] = record;
  // Static machines must not be scaled down by a cluster autoscaler.
  if (NOT_EPHEMERAL.has(group.nodeType) && node.annotations[SCALE_DOWN_DISABLED] !== "true") {
    annotations[SCALE_DOWN_DISABLED] = "true";
    changes.push(`annotation +${SCALE_DOWN_DISABLED}`);
  }

  // Taints: the template's by key and effect; those the last template had and this one lacks go.
  const dropped = new Set(
    (last?.taints ?? []).map(taintId).filter((id) => !template.taints.some((t) => taintId(t) === id)),
  );
  let taints = node.taints.filter((t) => {
    const gone = dropped.has(taintId(t)) || t.key === NODE_KEYS.deckhouseUninitializedTaint;
    if (gone) changes.push(`taint -${taintId(t)}`);
    return !gone;
  });
  for (const want of template.taints) {
    const i = taints.findIndex((t) => taintId(t) === taintId(want));
    if (i >= 0 && sameTaint(taints[i]!, want)) continue;
    changes.push(`taint ${i >= 0 ? "~" : "+"}${taintId(want)}`);
    if (i >= 0) taints = taints.map((t, j) => (j === i ? want : t));
    else taints = [...taints, want];
  }
  const taintsChanged = changes.some((c) => c.startsWith("taint "));

  const providerID =
    !node.providerID && group.nodeType !== "CloudEphemeral" && !node.taints.some((t) => t.key === CLOUD_UNINITIALIZED)
      ? STATIC_PROVIDER_ID
      : undefined;
  if (providerID) changes.push(`providerID ${STATIC_PROVIDER_ID}`);

  const onlyRecord = changes.length === 0 && annotations[NODE_KEYS.lastAppliedNodeTemplate] !== undefined;
  if (changes.length === 0 && !onlyRecord) return undefined;
  if (onlyRecord) changes.push(`annotation ${NODE_KEYS.lastAppliedNodeTemplate}`);
  const body: TemplatePatch["body"] = { metadata: { resourceVersion: node.resourceVersion } };
  if (Object.keys(labels).length) body.metadata.labels = labels;
  if (Object.keys(annotations).length) body.metadata.annotations = annotations;
  if (taintsChanged || providerID) {
    body.spec = {};
    if (taintsChanged) body.spec.taints = taints.length ? taints : null;
    if (providerID) body.spec.providerID = providerID;
  }
  return { body, changes };
}
