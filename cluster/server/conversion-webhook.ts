// POST /convert: the CRD conversion webhook of nodegroups.deckhouse.io (cluster/crds/nodegroup.yaml,
// spec.conversion), served on the bundle server's HTTPS port so the API server reaches it through
// the same Service (bashible-api.d8-cloud-instance-manager.svc) and certificate as the aggregated
// API. The API server presents no client certificate to a conversion webhook, so this route
// authenticates nobody: it answers only a pure function of the objects sent (and, for a Hybrid
// v1alpha2 group, which groups the provider configuration lists). The body is bounded in size and
// time (CONVERSION_BODY_LIMITS).
import type { IncomingMessage, ServerResponse } from "node:http";
import { parse } from "yaml";
import {
  ConversionError,
  conversionFailure,
  conversionResponse,
  needsPermanentGroups,
  parseConversionReview,
} from "../crds/nodegroup-conversion.ts";
import { BodyLimitError, type BodyLimits, readBoundedBody } from "../listener-limits.ts";
import type { KubeClient } from "../../lib/kube/client.ts";
import { isNotFound } from "../../lib/kube/errors.ts";
import type { Logger } from "../../lib/log/log.ts";
import { send, statusBody } from "./handler.ts";

export const CONVERSION_PATH = "/convert";
/** Where Deckhouse keeps the cloud provider's cluster configuration (its nodeGroups are CloudPermanent). */
export const PROVIDER_CONFIG = {
  namespace: "kube-system",
  name: "d8-provider-cluster-configuration",
  key: "cloud-provider-cluster-configuration.yaml",
} as const;

/** The node groups the provider cluster configuration lists; none when there is no such Secret (static clusters). */
export async function providerPermanentGroups(kube: KubeClient): Promise<Set<string>> {
  let secret: { data?: Record<string, string> };
  try {
    secret = await kube.request(
      "GET",
      `/api/v1/namespaces/${PROVIDER_CONFIG.namespace}/secrets/${PROVIDER_CONFIG.name}`,
    );
  } catch (err) {
    if (isNotFound(err)) return new Set();
    throw err;
  }
  const raw = secret.data?.[PROVIDER_CONFIG.key];
  if (!raw) return new Set();
  let doc: unknown;
  try {
    doc = parse(Buffer.from(raw, "base64").toString("utf8"));
  } catch (err) {
    throw new ConversionError(
      `Secret ${PROVIDER_CONFIG.namespace}/${PROVIDER_CONFIG.name} key ${PROVIDER_CONFIG.key} is not YAML: ${(err as Error).message}`,
    );
  }
  const groups = (doc as { nodeGroups?: { name?: unknown }[] } | null)?.nodeGroups ?? [];
  return new Set(groups.map((g) => g?.name).filter((n): n is string => typeof n === "string"));
}

export interface ConversionDeps {
  limits: BodyLimits;
  log: Logger;
  /** Read only when a Hybrid v1alpha2 group goes to v1; without it none is permanent but master. */
  permanentGroups?: () => Promise<Set<string>>;
}

export async function handleConversion(req: IncomingMessage, res: ServerResponse, deps: ConversionDeps): Promise<void> {
  if (req.method !== "POST") {
    return send(res, 405, statusBody(405, "MethodNotAllowed", `${CONVERSION_PATH} takes POST of a ConversionReview`));
  }
  let body: Buffer;
  try {
    body = await readBoundedBody(req, deps.limits);
  } catch (err) {
    if (!(err instanceof BodyLimitError)) throw err;
    deps.log.warn({ err: err.message }, "conversion request refused");
    res.once("finish", () => req.destroy());
    return send(
      res,
      err.code,
      statusBody(err.code, err.code === 413 ? "RequestEntityTooLarge" : "Timeout", `ConversionReview: ${err.message}`),
    );
  }
  let review: ReturnType<typeof parseConversionReview>;
  try {
    review = parseConversionReview(JSON.parse(body.toString("utf8")));
  } catch (err) {
    const message = err instanceof SyntaxError ? `the body is not JSON: ${err.message}` : (err as Error).message;
    if (!(err instanceof SyntaxError || err instanceof ConversionError)) throw err;
    return send(res, 400, statusBody(400, "BadRequest", message));
  }
  let permanentGroups = new Set<string>();
  try {
    if (deps.permanentGroups && review.objects.some((o) => needsPermanentGroups(o, review.desiredAPIVersion))) {
      permanentGroups = await deps.permanentGroups();
    }
  } catch (err) {
    // The API server shows this message to whoever wrote the object.
    const message = `cannot tell CloudPermanent from CloudStatic for a Hybrid NodeGroup: ${(err as Error).message}`;
    deps.log.error({ err: (err as Error).message }, "conversion failed");
    return send(res, 200, conversionFailure(review.uid, message));
  }
  const answer = conversionResponse(review, { permanentGroups });
  deps.log.debug(
    {
      objects: review.objects.length,
      to: review.desiredAPIVersion,
      result: (answer.response as { result: unknown }).result,
    },
    "NodeGroups converted",
  );
  send(res, 200, answer);
}
