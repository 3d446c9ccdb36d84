// HTTP routing of the aggregated API: discovery, get, list and watch of the three resources,
// health and metrics. Errors are Kubernetes Status objects, so kubectl prints them well.
import type { IncomingMessage, ServerResponse } from "node:http";
import { API_GROUP, API_VERSION } from "../../bundles/types.ts";
import type { Logger } from "../../lib/log/log.ts";
import { AuthError, authenticate, inScope, scopeOf, type AuthConfig, type Identity, type Scope } from "./auth.ts";
import type { Metrics } from "./metrics.ts";
import type { Verdict } from "../../lib/metrics-auth.ts";
import { apiGroup, apiGroupList, apiResourceList, isResource, RESOURCES, type ResourceName } from "./resources.ts";
import type { BundleStore } from "./store.ts";
import { table, wantsTable } from "./table.ts";
import type { WatchHub } from "./watch.ts";
import type { FreshnessCheck } from "./freshness.ts";

export interface HandlerDeps {
  store: BundleStore;
  hub: WatchHub;
  metrics: Metrics;
  auth: AuthConfig;
  log: Logger;
  nodeGroupOf: (node: string) => Promise<string | undefined>;
  /** The node group a bootstrap token (by id) was made for, when the source can tell. */
  tokenGroupOf?: (tokenId: string) => Promise<string | undefined>;
  /** Readiness: the first render pass is done. */
  ready: () => boolean;
  /**
   * With replicas: whether this one serves what resourceVersion `rv` (handed out by any
   * replica) showed, waiting briefly for it to catch up. Without: any rv is served as is.
   */
  fresh?: FreshnessCheck | undefined;
  /**
   * Who may read /metrics: a bearer token reviewed with the API server (lib/metrics-auth.ts).
   * Absent (the standalone server, which has no API server to ask): /metrics is open.
   */
  metricsAuth?: { check(authorization: string | undefined): Promise<Verdict>; lastError: string | undefined };
}

const PREFIX = `/apis/${API_GROUP}/v1alpha1`;
const MAX_WATCH_SECONDS = 3600;

/** A JSON answer (a string body is sent as it is). */
export function send(res: ServerResponse, code: number, body: unknown, headers: Record<string, string> = {}): void {
  const text = typeof body === "string" ? body : JSON.stringify(body);
  res.writeHead(code, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(text), ...headers });
  res.end(text);
}

/** A failure as a Kubernetes Status object, the way kubectl prints it. */
export const statusBody = (code: number, reason: string, message: string, details?: object) => ({
  kind: "Status",
  apiVersion: "v1",
  metadata: {},
  status: "Failure",
  message,
  reason,
  ...(details ? { details } : {}),
  code,
});

function status(res: ServerResponse, code: number, reason: string, message: string, details?: object): void {
  send(res, code, statusBody(code, reason, message, details));
}

/** `metadata.name=x` or `metadata.name==x`; anything else is refused, as the API server does. */
function nameFromFieldSelector(sel: string | null): { name?: string; error?: string } {
  if (!sel) return {};
  const m = sel.match(/^metadata\.name==?([a-z0-9.-]+)$/);
  if (!m) return { error: `field selector '${sel}' is not supported; only metadata.name=<group> is` };
  return { name: m[1] };
}

export function createHandler(deps: HandlerDeps) {
  const { store, hub, metrics, log } = deps;

  return async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    // Split by hand: a WHATWG URL per request is measurable garbage at 10,000 polling nodes.
    const raw = req.url ?? "/";
    const q = raw.indexOf("?");
    const path = (q >= 0 ? raw.slice(0, q) : raw).replace(/\/+$/, "") || "/";
    const url = { searchParams: new URLSearchParams(q >= 0 ? raw.slice(q + 1) : "") };
    if (path === "/healthz" || path === "/livez") return send(res, 200, "ok", { "Content-Type": "text/plain" });
    if (path === "/readyz") {
      return deps.ready()
        ? send(res, 200, "ok", { "Content-Type": "text/plain" })
        : send(res, 503, "not ready: first render not done", { "Content-Type": "text/plain" });
    }
    if (path === "/metrics") {
      const verdict = deps.metricsAuth ? await deps.metricsAuth.check(req.headers.authorization) : 200;
      if (verdict === 200) return send(res, 200, metrics.text(), { "Content-Type": "text/plain; version=0.0.4" });
      if (verdict === 503)
        log.warn(`a scrape's token could not be reviewed (answered 503): ${deps.metricsAuth?.lastError}`);
      // As kube-rbac-proxy answers: no detail beyond the code.
      return send(res, verdict, "", {
        "Content-Type": "text/plain",
        ...(verdict === 401 ? { "WWW-Authenticate": 'Bearer realm="bashible-server"' } : {}),
      });
    }

    let id: Identity | undefined;
    try {
      id = authenticate(req, deps.auth);
    } catch (err) {
      if (!(err instanceof AuthError)) throw err;
      return status(res, 401, "Unauthorized", err.message);
    }
    if (!id) return status(res, 401, "Unauthorized", "a client certificate is required");
    if (req.method !== "GET" && req.method !== "HEAD") {
      return status(res, 405, "MethodNotAllowed", `${req.method} is not supported; these resources are read-only`);
    }

    // Discovery is not secret and the aggregator probes it without a user.
    if (path === "/apis") return send(res, 200, apiGroupList);
    if (path === `/apis/${API_GROUP}`) return send(res, 200, apiGroup);
    if (path === PREFIX) return send(res, 200, apiResourceList);
    if (!path.startsWith(`${PREFIX}/`)) return status(res, 404, "NotFound", `${path} is not served here`);
    if (!id.user) return status(res, 401, "Unauthorized", "no user in the request (X-Remote-User)");

    let parts = path.slice(PREFIX.length + 1).split("/");
    let watch = url.searchParams.get("watch") === "1" || url.searchParams.get("watch") === "true";
    if (parts[0] === "watch") {
      watch = true;
      parts = parts.slice(1);
    }
    const [resource, name, ...extra] = parts;
    if (!resource || !isResource(resource) || extra.length) {
      return status(res, 404, "NotFound", `the server could not find the requested resource (${path})`);
    }

    const scope = await scopeOf(id, deps.nodeGroupOf, deps.tokenGroupOf);
    const verb = watch ? "watch" : name ? "get" : "list";
    const done = (code: number) =>
      metrics.requests.inc({ resource, verb, code: String(code), http: req.httpVersion === "2.0" ? "2" : "1.1" });
    const forbidden = (what: string) => {
      done(403);
      log.info({ user: id.user, groups: id.groups, resource, name: what }, "access refused");
      return status(
        res,
        403,
        "Forbidden",
        `${resource}.${API_GROUP} "${what}" is forbidden: user "${id.user}" may read only ${describe(scope)}`,
        { name: what, group: API_GROUP, kind: resource },
      );
    };

    const field = nameFromFieldSelector(url.searchParams.get("fieldSelector"));
    if (field.error) return status(res, 400, "BadRequest", field.error);
    const only = name ?? field.name;
    if (only && !inScope(scope, only)) return forbidden(only);
    if (!only && scope !== "all" && scope.size === 0) return forbidden("*");

    const asTable = wantsTable(req.headers.accept);
    const rvParam = Number(url.searchParams.get("resourceVersion") ?? "");
    if (
      deps.fresh &&
      Number.isFinite(rvParam) &&
      rvParam > 0 &&
      !(await deps.fresh(rvParam, only, watch ? "watch" : "get"))
    ) {
      done(watch ? 410 : 504);
      // A watch from a resourceVersion this replica cannot reach relists; a GET is retried.
      return watch
        ? status(res, 410, "Expired", `resourceVersion ${rvParam} is newer than this server knows; relist`)
        : status(res, 504, "Timeout", `Too large resource version: ${rvParam}; this replica is catching up, retry`);
    }
    if (watch) {
      const t = Number(url.searchParams.get("timeoutSeconds") ?? "");
      const timeoutSeconds =
        Number.isFinite(t) && t > 0 ? Math.min(t, MAX_WATCH_SECONDS) : 1800 + Math.floor(Math.random() * 1800);
      done(200);
      hub.open(
        {
          resource,
          name: only,
          resourceVersion: url.searchParams.get("resourceVersion") ?? undefined,
          timeoutSeconds,
          bookmarks: url.searchParams.get("allowWatchBookmarks") === "true",
          asTable,
          allowed: (g) => inScope(scope, g),
        },
        res,
      );
      return;
    }

    if (name) return get(resource, name, req, res, asTable, done);
    const entries = store.list(resource).filter((e) => inScope(scope, e.group) && (!only || e.group === only));
    const rv = String(store.resourceVersion);
    done(200);
    if (asTable)
      return send(res, 200, table(resource, entries, rv), {
        "Content-Type": "application/json;as=Table;v=v1;g=meta.k8s.io",
      });
    const items = entries.map((e) => e.json).join(",");
    const kind = `${RESOURCES[resource].kind}List`;
    return send(
      res,
      200,
      `{"apiVersion":"${API_VERSION}","items":[${items}],"kind":"${kind}","metadata":{"resourceVersion":"${rv}"}}`,
    );
  };

  function get(
    resource: ResourceName,
    name: string,
    req: IncomingMessage,
    res: ServerResponse,
    asTable: boolean,
    done: (code: number) => void,
  ) {
    const entry = store.get(resource, name);
    if (!entry) {
      done(404);
      return status(res, 404, "NotFound", `${resource}.${API_GROUP} "${name}" not found`, {
        name,
        group: API_GROUP,
        kind: resource,
      });
    }
    if (asTable) {
      done(200);
      return send(res, 200, table(resource, [entry], String(entry.rv)), {
        "Content-Type": "application/json;as=Table;v=v1;g=meta.k8s.io",
      });
    }
    const accept = req.headers.accept ?? "";
    if (resource === "bootstrap" && accept.startsWith("text/plain")) {
      // bootstrap.sh asks for the bare script: it has no JSON parser on a fresh machine.
      done(200);
      return send(res, 200, String(entry.object.bootstrap), { "Content-Type": "text/plain; charset=utf-8" });
    }
    const inm = req.headers["if-none-match"];
    if (inm?.split(",").some((t) => t.trim() === entry.etag)) {
      done(304);
      res.writeHead(304, { ETag: entry.etag });
      return void res.end();
    }
    done(200);
    send(res, 200, entry.json, { ETag: entry.etag });
  }
}

function describe(scope: Scope): string {
  if (scope === "all") return "every node group";
  if (scope.size === 0) return "nothing (not a node, a group bootstrap token or an admin)";
  return `node group ${[...scope].join(", ")}`;
}
