// Registry packages, fetched: one package's manifest and layer from the registry-packages proxy,
// verified as they arrive. The digest names the package's image manifest, as in Deckhouse. Both
// proxies answer GET /package?digest=<manifest digest>&repository=<repo> with the image's last
// layer blob. This project's also sends the manifest beside it (header X-Package-Manifest): the
// node then verifies the whole chain, the manifest's bytes hash to the digest asked for and the
// layer's bytes to the digest the manifest names (and to the bundle's `layer`, when it names
// one). Deckhouse's sends the blob alone: the node then verifies the blob against the layer
// digest the bundle names, and refuses a package whose bundle names none (nothing ties the
// bytes to the manifest digest then). Nothing unverified is ever renamed into place. Used by 007_fetch_registry_packages, 080_setup_bashible_service (the agent's own
// package) and `bashible package install`.
import { createHash } from "node:crypto";
import type { HTTPError, RequestError } from "got";
import type { RegistryPackageRef } from "../../bundles/types.ts";
import { PATHS } from "../../bundles/paths.ts";
import { PACKAGE_MANIFEST_HEADER } from "../../bundles/names.ts";
import { DIGEST } from "../../bundles/rules.ts";
import { RefusedError } from "../../lib/errors.ts";
import type { Host } from "../../host/host.ts";
import type { StepContext } from "../types.ts";

export const DOWNLOADS = PATHS.packageDownloads;
/** As Node.js names response headers: lower case. */
const MANIFEST_HEADER = PACKAGE_MANIFEST_HEADER.toLowerCase();

/** Fetch and install policy; tests and benchmarks shorten the timeouts. One pass over the endpoints per attempt. */
export const fetchPolicy = {
  /** Downloads at once. */
  concurrency: 4,
  connectTimeoutMs: 10_000,
  /** No byte for this long = a network error. */
  idleTimeoutMs: 60_000,
  installTimeoutMs: 10 * 60_000,
};

/** Bytes received do not hash to the digest expected (manifest or layer). */
export class PackageDigestError extends Error {
  override name = "PackageDigestError";
}

/** Every endpoint failed. */
export class PackageFetchError extends Error {
  override name = "PackageFetchError";
}

const hexOf = (digest: string) => digest.slice("sha256:".length);
const sha256 = (b: Buffer) => `sha256:${createHash("sha256").update(b).digest("hex")}`;

/** The digest a layer blob must hash to, and whose digest it is (named in a refusal). */
interface ExpectedLayer {
  layer: string;
  whose: "the manifest's layer" | "the bundle's layer";
}

async function* verify(
  source: AsyncIterable<Buffer>,
  digest: string,
  where: string,
  whose: ExpectedLayer["whose"],
): AsyncGenerator<Buffer> {
  const hash = createHash("sha256");
  let bytes = 0;
  for await (const chunk of source) {
    hash.update(chunk);
    bytes += chunk.length;
    yield chunk;
  }
  const got = `sha256:${hash.digest("hex")}`;
  if (got !== digest) {
    throw new PackageDigestError(
      `${where}: the ${bytes} layer bytes received hash to ${got}, not ${digest} (${whose}); refused`,
    );
  }
}

/** The layer digest a verified manifest names (its last layer). */
export function layerOf(manifestBytes: Buffer, digest: string, where: string): string {
  const actual = sha256(manifestBytes);
  if (actual !== digest) {
    throw new PackageDigestError(`${where}: the manifest received hashes to ${actual}, not ${digest}; refused`);
  }
  let layers: { digest?: unknown }[] | undefined;
  try {
    layers = (JSON.parse(manifestBytes.toString("utf8")) as { layers?: { digest?: unknown }[] }).layers;
  } catch {
    throw new PackageDigestError(`${where}: the manifest is not JSON`);
  }
  const last = layers?.[layers.length - 1]?.digest;
  if (typeof last !== "string" || !DIGEST.test(last)) {
    throw new PackageDigestError(`${where}: the manifest names no layer (an image index? packages are single images)`);
  }
  return last;
}

/**
 * The digest the blob must hash to: the manifest's layer when the proxy sent the manifest (and it
 * must agree with the bundle's `layer`, when there is one), else the bundle's `layer`.
 */
function expectedLayer(header: string | string[] | undefined, ref: RegistryPackageRef, where: string): ExpectedLayer {
  if (typeof header === "string") {
    const layer = layerOf(Buffer.from(header, "base64"), ref.digest, where);
    if (ref.layer && ref.layer !== layer) {
      throw new PackageDigestError(
        `${where}: the manifest names layer ${layer}, the bundle ${ref.layer}; refused (fix packages.${ref.name}.layer in the context Secret)`,
      );
    }
    return { layer, whose: "the manifest's layer" };
  }
  if (ref.layer) return { layer: ref.layer, whose: "the bundle's layer" };
  throw new PackageDigestError(
    `${where}: the proxy sent no ${MANIFEST_HEADER} header (Deckhouse's registry-packages-proxy sends the blob alone) ` +
      `and the bundle names no layer digest for the package, so the download cannot be verified; refused. ` +
      `Set packages.${ref.name}.layer in the context Secret to the layer digest its manifest names, or serve packages with \`bashible packages-proxy\``,
  );
}

type Got = typeof import("got");
/** got loads only when a package is fetched: planning a converged node never pays for it. */
const loadGot = (): Promise<Got> => import("got");

function describe(err: unknown, g: Got): string {
  if (err instanceof g.HTTPError) {
    const e = err as HTTPError;
    const s = e.response.statusCode;
    const body = String(e.response.body ?? "")
      .trim()
      .slice(0, 300);
    const hint = s === 401 ? " (the packages-proxy token in the bundle was refused)" : "";
    return `HTTP ${s}${hint}${body ? `: ${body}` : ""}`;
  }
  if (err instanceof g.RequestError) {
    const e = err as RequestError;
    return `${e.code ?? "network error"}: ${e.message}`;
  }
  return (err as Error).message;
}

export interface FetchContext {
  log: StepContext["log"];
  signal?: AbortSignal;
  proxy: { endpoints: string[]; token: string; ca: string };
}

/** Downloads and verifies one package (manifest, then layer); returns the archive's node path. */
export async function fetchPackage(host: Host, ctx: FetchContext, ref: RegistryPackageRef): Promise<string> {
  const dir = `${DOWNLOADS}/${ref.name}`;
  const archive = `${dir}/${hexOf(ref.digest)}.tar.gz`;
  // Leftovers of killed or failed runs: only ever renamed into place verified, but the layer
  // digest is not kept beside them, so they are fetched again rather than trusted.
  for (const entry of await host.listDir(dir)) await host.remove(`${dir}/${entry}`, { recursive: true });
  const { endpoints, token, ca } = ctx.proxy;
  if (endpoints.length === 0) {
    throw new RefusedError(`package ${ref.name}: the bundle names no registry-packages proxy endpoints`);
  }
  if (!ca.includes("BEGIN CERTIFICATE")) {
    throw new RefusedError(
      `package ${ref.name}: the bundle carries no cluster CA to verify the registry-packages proxy with (context.clusterCA); refusing to fetch unverified`,
    );
  }
  const g = await loadGot();
  const got = g.default;
  const query = `digest=${encodeURIComponent(ref.digest)}&repository=${encodeURIComponent(ref.repository)}`;
  const errors: string[] = [];
  for (const endpoint of endpoints) {
    const url = `https://${endpoint}/package?${query}`;
    const where = `package ${ref.name} from ${endpoint}`;
    try {
      const stream = got.stream(url, {
        headers: { authorization: `Bearer ${token}` },
        https: { certificateAuthority: ca },
        retry: { limit: 0 },
        timeout: {
          connect: fetchPolicy.connectTimeoutMs,
          secureConnect: fetchPolicy.connectTimeoutMs,
          socket: fetchPolicy.idleTimeoutMs,
        },
        ...(ctx.signal ? { signal: ctx.signal } : {}),
      });
      const response = await new Promise<{ headers: Record<string, string | string[] | undefined> }>(
        (resolve, reject) => {
          stream.once("response", resolve);
          stream.once("error", reject);
        },
      );
      stream.on("error", () => undefined); // surfaced by the iteration below
      let expected: ExpectedLayer;
      try {
        expected = expectedLayer(response.headers[MANIFEST_HEADER], ref, where);
      } catch (err) {
        stream.destroy();
        throw err;
      }
      const { layer, whose } = expected;
      await host.mkdir(dir, { mode: 0o700 });
      await host.writeFileStream(archive, verify(stream, layer, where, whose), { mode: 0o600 });
      ctx.log.info({ package: ref.name, digest: ref.digest, layer, endpoint }, "package downloaded and verified");
      return archive;
    } catch (err) {
      if (ctx.signal?.aborted) throw err;
      errors.push(`${endpoint}: ${describe(err, g)}`);
      ctx.log.warn({ package: ref.name, endpoint, err: describe(err, g) }, "package download failed");
    }
  }
  throw new PackageFetchError(
    `package ${ref.name} (${ref.repository}@${ref.digest}) could not be fetched from the registry-packages proxy:\n  ${errors.join("\n  ")}`,
  );
}

export const proxyOf = (ctx: StepContext): FetchContext["proxy"] => ({
  endpoints: ctx.bundle.context.packagesProxy.endpoints,
  token: ctx.bundle.context.packagesProxy.token,
  ca: ctx.bundle.context.clusterCA,
});

/** Downloads start together (at most `concurrency`); installs run in list order as each arrives. */
export class Prefetch {
  private readonly started = new Map<string, Promise<string>>();
  private running = 0;
  private readonly queue: (() => void)[] = [];

  get(host: Host, ctx: FetchContext, ref: RegistryPackageRef): Promise<string> {
    const key = `${ref.name}@${ref.digest}`;
    let p = this.started.get(key);
    if (!p) {
      p = this.limit(() => fetchPackage(host, ctx, ref));
      p.catch(() => undefined);
      this.started.set(key, p);
    }
    return p;
  }

  private async limit<T>(fn: () => Promise<T>): Promise<T> {
    if (this.running >= fetchPolicy.concurrency) await new Promise<void>((r) => this.queue.push(r));
    this.running++;
    try {
      return await fn();
    } finally {
      this.running--;
      this.queue.shift()?.();
    }
  }

  forget(ref: RegistryPackageRef): void {
    this.started.delete(`${ref.name}@${ref.digest}`);
  }
}
