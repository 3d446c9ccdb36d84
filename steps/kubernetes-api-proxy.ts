// KubernetesApiProxy (000_configure_kubernetes_api_proxy): nginx with the stream module on
// 127.0.0.1:6445, passing TCP (TLS end to end) to the API servers the bundle names. The kubelet
// and the agent talk to the API through it, so a changed set of masters reaches every client on
// the node by one reload. Deckhouse ran the same nginx configuration in a static pod and sorted
// its step before the update approval (PR #5047: nodes went NotReady when master addresses
// changed while updates waited for approval); a 000_* step runs before the approval here too.
//
// Balancing: least connections; a connect that takes longer than 1 s or fails moves on to the
// next upstream, and an upstream that failed twice is skipped for 10 s (passive marking: nginx
// has no active health checks in the stream module). Connections may live 24 h (watches).
//
// Every configuration is checked with `nginx -t` before it replaces the live one and applied by
// reload (SIGHUP: new workers take new connections; old workers finish the open ones, up to an
// hour), never by restart. nginx comes from the distribution (OS differences: NGINX below); it
// runs as a transient unprivileged user (DynamicUser) with its pid file in its runtime directory.
import { asset } from "../lib/assets.ts";
import type { BundleFamily } from "../bundles/os-families.ts";
import { PATHS } from "../bundles/paths.ts";
import { UNITS } from "../bundles/steps/index.ts";
import type { KubernetesApiProxySpec } from "../bundles/types.ts";
import { planDir, planFile } from "../host/file-plan.ts";
import { RefusedError } from "../lib/errors.ts";
import type { Primitive, Step } from "./types.ts";
import { planUnit, start } from "./lib/units.ts";

/** Where each family's nginx and its dynamic stream module live (absent module: built in). */
export const NGINX: Record<BundleFamily, { binary: string; streamModule: string; packages: string }> = {
  // nginx-light or nginx, and libnginx-mod-stream
  debian: {
    binary: "/usr/sbin/nginx",
    streamModule: "/usr/lib/nginx/modules/ngx_stream_module.so",
    packages: "nginx-light and libnginx-mod-stream",
  },
  // nginx and nginx-mod-stream
  rhel: {
    binary: "/usr/sbin/nginx",
    streamModule: "/usr/lib64/nginx/modules/ngx_stream_module.so",
    packages: "nginx and nginx-mod-stream",
  },
  altlinux: {
    binary: "/usr/sbin/nginx",
    streamModule: "/usr/lib64/nginx/modules/ngx_stream_module.so",
    packages: "nginx",
  },
};

export const CONFIG = `${PATHS.apiProxyDir}/nginx.conf`;
const UNIT = UNITS.apiProxy;
const RUNTIME_DIR = "kubernetes-api-proxy";

/** Passive failure marking: this many failed connects within FAIL_TIMEOUT skip the upstream for FAIL_TIMEOUT. */
export const BALANCING = { maxFails: 2, failTimeout: "10s", connectTimeout: "1s", proxyTimeout: "24h" } as const;

export function renderConfig(spec: KubernetesApiProxySpec, streamModule: string | undefined): string {
  const servers = spec.upstreams.map(
    (u) => `    server ${u} max_fails=${BALANCING.maxFails} fail_timeout=${BALANCING.failTimeout};`,
  );
  return [
    "# Managed by bashible (000_configure_kubernetes_api_proxy): the local Kubernetes API proxy.",
    `# The kubelet and the agent reach the API servers through ${spec.listen}. Changes are`,
    `# checked with nginx -t and applied by reloading ${UNIT}.`,
    ...(streamModule ? [`load_module ${streamModule};`] : []),
    "worker_processes 2;",
    // Old workers of a reload close what is still open after an hour (clients reconnect).
    "worker_shutdown_timeout 1h;",
    "error_log stderr warn;",
    "",
    "events {",
    "  worker_connections 16384;",
    "}",
    "",
    "stream {",
    "  upstream kubernetes {",
    "    least_conn;",
    ...servers,
    "  }",
    "",
    "  server {",
    `    listen ${spec.listen};`,
    "    proxy_pass kubernetes;",
    `    proxy_connect_timeout ${BALANCING.connectTimeout};`,
    `    proxy_timeout ${BALANCING.proxyTimeout};`,
    "    proxy_next_upstream on;",
    "  }",
    "}",
    "",
  ].join("\n");
}

export function renderUnit(nginx: string): string {
  return `# Managed by bashible (000_configure_kubernetes_api_proxy).
[Unit]
Description=Kubernetes API proxy: nginx passing the local API endpoint to the API servers
Documentation=https://nginx.org/en/docs/stream/ngx_stream_upstream_module.html
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
ExecStart=${nginx} -c ${CONFIG} -e stderr -g "daemon off; pid /run/${RUNTIME_DIR}/nginx.pid;"
# Changes are applied by reload: new connections get the new upstreams, open ones stay.
ExecReload=/bin/kill -HUP $MAINPID
DynamicUser=yes
RuntimeDirectory=${RUNTIME_DIR}
LimitNOFILE=65536
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
`;
}

/** nginx (with the stream module) is not installed; the message names the packages. */
export class NginxMissingError extends RefusedError {
  override name = "NginxMissingError";
}

const step: Step<"KubernetesApiProxy"> = {
  kind: "KubernetesApiProxy",
  async plan(spec, host) {
    if (spec.upstreams.length === 0) {
      return {
        changes: [],
        problems: [
          {
            subject: UNIT,
            message:
              "the bundle names no API server endpoints (context.apiserverEndpoints); the proxy is not configured",
          },
        ],
      };
    }
    const nginx = NGINX[host.os.family];
    if (!(await host.stat(nginx.binary))?.isFile) {
      throw new NginxMissingError(
        `kubernetes-api-proxy needs nginx with the stream module: ${nginx.binary} is not installed (install ${nginx.packages})`,
      );
    }
    const module = (await host.stat(nginx.streamModule))?.isFile ? nginx.streamModule : undefined;
    const changes: Primitive[] = [];
    for (const dir of ["/etc/kubernetes", PATHS.apiProxyDir]) {
      const c = await planDir(host, dir, { mode: 0o755 });
      if (c) changes.push(c);
    }
    const config = await planFile(host, {
      path: CONFIG,
      content: renderConfig(spec, module),
      mode: 0o644,
      check: ["sh", asset("steps/checks/nginx-config.sh"), host.path(nginx.binary), "{}"],
    });
    if (config) changes.push(config);
    const unit = await planUnit(host, UNIT, renderUnit(nginx.binary));
    changes.push(...unit.changes);
    if (!unit.state.active) changes.push(start(UNIT));
    return { changes, problems: [] };
  },
  services: () => [{ unit: UNIT, reads: [CONFIG], onChange: "reload" }],
};

export default step;
