// `bashible packages-proxy`: runs the registry-packages proxy (server.ts) until SIGTERM/SIGINT.
import { readFile } from "node:fs/promises";
import { UsageError, EXIT, type Command } from "../../lib/cli.ts";
import { startPackagesProxy } from "./server.ts";

async function readSecret(file: string | undefined, env: string | undefined, what: string): Promise<string> {
  if (file) {
    const v = (
      await readFile(file, "utf8").catch((e: Error) => {
        throw new UsageError(`cannot read ${what} file ${file}: ${e.message}`);
      })
    ).trim();
    if (!v) throw new UsageError(`${what} file ${file} is empty`);
    return v;
  }
  if (env) return env.trim();
  return "";
}

function parseListen(s: string): { host: string; port: number } {
  const m = /^(?:\[([^\]]+)\]|([^:]*)):(\d+)$/.exec(s);
  if (!m) throw new UsageError(`--listen must be HOST:PORT, got '${s}'`);
  return { host: m[1] ?? (m[2] || "0.0.0.0"), port: Number(m[3]) };
}

const command: Command = {
  summary: "serve registry packages to nodes from an OCI registry (verified, cached by digest)",
  usage:
    "--upstream URL --tls-cert FILE --tls-key FILE --token-file FILE [--listen HOST:PORT] [--cache-dir DIR] [--upstream-ca FILE] [--upstream-username USER --upstream-password-file FILE] [--default-repository REPO]",
  help: `Answers GET /package?digest=sha256:<hex>&repository=<repo> with the blob <repo>@<digest> from
the upstream registry (GET /v2/<repo>/blobs/<digest>). Requests carry 'Authorization: Bearer
<token>'. Each blob is fetched once, verified against its digest, and cached on disk; concurrent
requests for one digest share one upstream fetch. Responses carry ETag = digest; If-None-Match
answers 304. A blob that fails verification is refused with 502 and never cached.

Options:
      --listen HOST:PORT            where to listen (default 0.0.0.0:4219)
      --tls-cert FILE               server certificate (PEM), signed by the cluster CA
      --tls-key FILE                its key
      --token-file FILE             the bearer token nodes present (or env PACKAGES_PROXY_TOKEN)
      --upstream URL                registry base URL, e.g. https://registry.example.com
      --upstream-ca FILE            CA bundle for the registry's certificate
      --upstream-username USER      registry user (Basic or token auth); anonymous without
      --upstream-password-file FILE its password (or env PACKAGES_PROXY_UPSTREAM_PASSWORD)
      --cache-dir DIR               blob cache (default /var/cache/registry-packages-proxy)
      --default-repository REPO     repository for requests that name none`,
  options: {
    listen: { type: "string" },
    "tls-cert": { type: "string" },
    "tls-key": { type: "string" },
    "token-file": { type: "string" },
    upstream: { type: "string" },
    "upstream-ca": { type: "string" },
    "upstream-username": { type: "string" },
    "upstream-password-file": { type: "string" },
    "cache-dir": { type: "string" },
    "default-repository": { type: "string" },
  },
  async run({ values, log }) {
    const str = (k: string) => values[k] as string | undefined;
    const upstream = str("upstream");
    if (!upstream || !/^https?:\/\//.test(upstream))
      throw new UsageError("--upstream URL (http:// or https://) is required");
    const certFile = str("tls-cert");
    const keyFile = str("tls-key");
    if (!certFile || !keyFile)
      throw new UsageError("--tls-cert and --tls-key are required (the proxy serves HTTPS only)");
    const token = await readSecret(str("token-file"), process.env.PACKAGES_PROXY_TOKEN, "token");
    if (!token) throw new UsageError("a token is required: --token-file FILE or env PACKAGES_PROXY_TOKEN");
    const password = await readSecret(
      str("upstream-password-file"),
      process.env.PACKAGES_PROXY_UPSTREAM_PASSWORD,
      "upstream password",
    );
    const caFile = str("upstream-ca");
    const listen = parseListen(str("listen") ?? "0.0.0.0:4219");
    const read = (f: string) =>
      readFile(f, "utf8").catch((e: Error) => {
        throw new UsageError(`cannot read ${f}: ${e.message}`);
      });
    const proxy = await startPackagesProxy(
      {
        upstream: {
          url: upstream,
          ca: caFile ? await read(caFile) : undefined,
          username: str("upstream-username"),
          password: password || undefined,
        },
        cacheDir: str("cache-dir") ?? "/var/cache/registry-packages-proxy",
        token,
        tls: { cert: await read(certFile), key: await read(keyFile) },
        defaultRepository: str("default-repository"),
        log,
      },
      listen,
    );
    log.info({ url: proxy.url, upstream }, "registry-packages proxy listening");
    await new Promise<void>((resolve) => {
      const stop = () => resolve();
      process.once("SIGTERM", stop);
      process.once("SIGINT", stop);
    });
    log.info(proxy.stats, "registry-packages proxy stopping");
    await proxy.close();
    return EXIT.ok;
  },
};

export default command;
