// NodeGroup between the versions Deckhouse serves (deckhouse.io/v1alpha1, v1alpha2, v1), with
// the rules of Deckhouse's conversion hook (modules/040-node-manager/hooks, the
// kubernetesCustomResourceConversion bindings on nodegroups.deckhouse.io), so objects and
// manifests written against any of the three keep working here. v1alpha2 is the hub:
//
//   v1alpha1 → v1alpha2  spec.docker moves to spec.cri.docker; spec.kubernetesVersion and
//                        spec.static are dropped (neither exists later: the version follows the
//                        cluster's, static.internalNetworkCIDRs moved to the cluster config)
//   v1alpha2 → v1alpha1  spec.cri.docker moves back to spec.docker
//   v1alpha2 → v1        nodeType Cloud → CloudEphemeral; Hybrid → CloudPermanent when the group
//                        is master or is listed in the provider cluster configuration's
//                        nodeGroups, else CloudStatic; Static stays
//   v1 → v1alpha2        nodeType CloudEphemeral → Cloud; CloudPermanent, CloudStatic → Hybrid
//
// Every other field passes as written; the API server then prunes what the target version's
// schema does not name (v1-only fields read as v1alpha2 disappear from that view, as in
// Deckhouse, and stay stored). Pure: the caller supplies the permanent groups.

export const NODEGROUP_VERSIONS = ["deckhouse.io/v1alpha1", "deckhouse.io/v1alpha2", "deckhouse.io/v1"] as const;
export type NodeGroupApiVersion = (typeof NODEGROUP_VERSIONS)[number];

export const isNodeGroupApiVersion = (v: unknown): v is NodeGroupApiVersion =>
  typeof v === "string" && (NODEGROUP_VERSIONS as readonly string[]).includes(v);

type Obj = Record<string, unknown>;
export interface NodeGroupDocument extends Obj {
  apiVersion: string;
  kind?: string;
  metadata?: Obj & { name?: string };
  spec?: Obj;
}

/** What a v1alpha2 → v1 conversion of a Hybrid group needs to know. */
export interface ConversionContext {
  /** Groups the provider cluster configuration lists in nodeGroups (CloudPermanent). */
  permanentGroups: ReadonlySet<string>;
}

export class ConversionError extends Error {
  override name = "ConversionError";
}

const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);
/** A deep copy: conversions never change what they were given. */
const copy = <T>(v: T): T => structuredClone(v);
const specOf = (o: NodeGroupDocument): Obj => (isObj(o.spec) ? o.spec : {});

export function alpha1ToAlpha2(o: NodeGroupDocument): NodeGroupDocument {
  const out = copy(o);
  const spec = specOf(out);
  if ("docker" in spec) {
    const cri = isObj(spec.cri) ? spec.cri : {};
    cri.docker = spec.docker;
    spec.cri = cri;
    delete spec.docker;
  }
  delete spec.kubernetesVersion;
  delete spec.static;
  if (isObj(out.spec)) out.spec = spec;
  out.apiVersion = "deckhouse.io/v1alpha2";
  return out;
}

export function alpha2ToAlpha1(o: NodeGroupDocument): NodeGroupDocument {
  const out = copy(o);
  const spec = specOf(out);
  if (isObj(spec.cri) && "docker" in spec.cri) {
    spec.docker = spec.cri.docker;
    delete spec.cri.docker;
    // cri held only docker: v1alpha1 had no cri for it, so nothing is left to say.
    if (Object.keys(spec.cri).length === 0) delete spec.cri;
  }
  out.apiVersion = "deckhouse.io/v1alpha1";
  return out;
}

export function alpha2ToV1(o: NodeGroupDocument, ctx: ConversionContext): NodeGroupDocument {
  const out = copy(o);
  const spec = specOf(out);
  const name = out.metadata?.name ?? "";
  if (spec.nodeType === "Cloud") spec.nodeType = "CloudEphemeral";
  else if (spec.nodeType === "Hybrid") {
    spec.nodeType = name === "master" || ctx.permanentGroups.has(name) ? "CloudPermanent" : "CloudStatic";
  }
  out.apiVersion = "deckhouse.io/v1";
  return out;
}

export function v1ToAlpha2(o: NodeGroupDocument): NodeGroupDocument {
  const out = copy(o);
  const spec = specOf(out);
  if (spec.nodeType === "CloudEphemeral") spec.nodeType = "Cloud";
  else if (spec.nodeType === "CloudPermanent" || spec.nodeType === "CloudStatic") spec.nodeType = "Hybrid";
  out.apiVersion = "deckhouse.io/v1alpha2";
  return out;
}

/** Whether converting `o` to `to` has to know the permanent groups (a Hybrid group going to v1). */
export function needsPermanentGroups(o: NodeGroupDocument, to: NodeGroupApiVersion): boolean {
  return to === "deckhouse.io/v1" && o.apiVersion !== "deckhouse.io/v1" && specOf(o).nodeType === "Hybrid";
}

/** One NodeGroup to `to`, through v1alpha2. Throws ConversionError for what is not a NodeGroup version. */
export function convertNodeGroup(
  o: NodeGroupDocument,
  to: NodeGroupApiVersion,
  ctx: ConversionContext,
): NodeGroupDocument {
  if (!isNodeGroupApiVersion(o.apiVersion)) {
    throw new ConversionError(
      `NodeGroup ${o.metadata?.name ?? "<no name>"}: apiVersion ${String(o.apiVersion)} is not one of ${NODEGROUP_VERSIONS.join(", ")}`,
    );
  }
  if (o.apiVersion === to) return copy(o);
  const hub =
    o.apiVersion === "deckhouse.io/v1alpha1"
      ? alpha1ToAlpha2(o)
      : o.apiVersion === "deckhouse.io/v1"
        ? v1ToAlpha2(o)
        : copy(o);
  if (to === "deckhouse.io/v1alpha2") return hub;
  return to === "deckhouse.io/v1alpha1" ? alpha2ToAlpha1(hub) : alpha2ToV1(hub, ctx);
}

/** The parts of an apiextensions.k8s.io/v1 ConversionReview this webhook reads. */
export interface ConversionRequest {
  uid: string;
  desiredAPIVersion: NodeGroupApiVersion;
  objects: NodeGroupDocument[];
}

/** Reads a ConversionReview's request; throws ConversionError naming what is wrong with it. */
export function parseConversionReview(body: unknown): ConversionRequest {
  if (!isObj(body) || body.kind !== "ConversionReview") throw new ConversionError("the body is not a ConversionReview");
  if (body.apiVersion !== "apiextensions.k8s.io/v1") {
    throw new ConversionError(
      `ConversionReview ${String(body.apiVersion)} is not served; conversionReviewVersions must be [v1]`,
    );
  }
  const req = body.request;
  if (!isObj(req) || typeof req.uid !== "string" || !req.uid) {
    throw new ConversionError("the ConversionReview has no request.uid");
  }
  if (!isNodeGroupApiVersion(req.desiredAPIVersion)) {
    throw new ConversionError(`desiredAPIVersion ${String(req.desiredAPIVersion)} is not a NodeGroup version`);
  }
  if (!Array.isArray(req.objects) || !req.objects.every(isObj)) {
    throw new ConversionError("request.objects is not a list of objects");
  }
  return { uid: req.uid, desiredAPIVersion: req.desiredAPIVersion, objects: req.objects as NodeGroupDocument[] };
}

const review = (response: Obj): Obj => ({ apiVersion: "apiextensions.k8s.io/v1", kind: "ConversionReview", response });

/** The ConversionReview answer that converts nothing: the API server shows `message` to the writer. */
export const conversionFailure = (uid: string, message: string): Obj =>
  review({ uid, convertedObjects: [], result: { status: "Failure", message } });

/** The ConversionReview answer: every object converted, or a Failure naming the first that was not. */
export function conversionResponse(req: ConversionRequest, ctx: ConversionContext): Obj {
  let convertedObjects: NodeGroupDocument[];
  try {
    convertedObjects = req.objects.map((o) => convertNodeGroup(o, req.desiredAPIVersion, ctx));
  } catch (err) {
    if (!(err instanceof ConversionError)) throw err;
    return conversionFailure(req.uid, err.message);
  }
  return review({ uid: req.uid, convertedObjects, result: { status: "Success" } });
}
