// npm run push: publish what `npm run package` (registry packages) or `npm run image` (the
// server's image) wrote, to an OCI registry, with the user's own credentials.
//
//   npm run push -- REGISTRY/PATH                 every package in dist-packages/, into the one
//                                                 repository REGISTRY/PATH, tagged <name>-<version>
//   npm run push -- --image REGISTRY/PATH         the image in dist-image/, tagged with its version
//
//   --from DIR              another layout directory (dist-packages/ or dist-image/ by default)
//   --username USER --password-stdin   credentials (the password read from stdin); otherwise
//                           the registry's entry in $DOCKER_CONFIG/config.json or
//                           ~/.docker/config.json (`docker login`, `podman login --authfile`),
//                           including credential helpers (credsStore, credHelpers)
//   --plain-http            the registry speaks HTTP, not HTTPS (a local test registry)
//
// Nothing but Node's fetch: no Docker, no skopeo. The registry's challenge decides the scheme
// (Basic, or a Bearer token from its token service, as Harbor, GitLab and Docker Hub do).
// Blobs the registry already has are not sent again. Credentials never reach the output.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { readImageLayout } from "./lib/oci-layout.ts";

const REPO = path.resolve(import.meta.dirname, "..");

export interface Credentials {
  username: string;
  password: string;
  /** Where they came from, for messages ("--username", "~/.docker/config.json (auths.host)"). */
  source: string;
}

export interface Target {
  /** host[:port] */
  registry: string;
  /** The repository path under it. */
  repository: string;
  plainHttp: boolean;
}

/** REGISTRY/PATH → registry host and repository (lowercase path components, as OCI requires). */
export function parseTarget(ref: string, plainHttp = false): Target {
  const m = /^([a-z0-9.-]+(?::\d+)?)\/([a-z0-9]+(?:[._-][a-z0-9]+)*(?:\/[a-z0-9]+(?:[._-][a-z0-9]+)*)*)$/.exec(ref);
  if (!m?.[1] || !m[2]) {
    throw new Error(
      `'${ref}' is not REGISTRY/PATH (a registry host, then a repository path of lowercase letters, digits and . _ -; e.g. registry.example.com/deckhouse/packages)`,
    );
  }
  return { registry: m[1], repository: m[2], plainHttp };
}

/** The user's credentials for a registry from a docker config.json, or undefined when it has none. */
export async function dockerConfigCredentials(
  registry: string,
  file = path.join(process.env.DOCKER_CONFIG ?? path.join(os.homedir(), ".docker"), "config.json"),
): Promise<Credentials | undefined> {
  let text: string;
  try {
    text = await readFile(file, "utf8");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw new Error(`cannot read ${file}: ${(err as Error).message}`);
  }
  let config: {
    auths?: Record<string, { auth?: string; username?: string; password?: string; identitytoken?: string }>;
    credsStore?: string;
    credHelpers?: Record<string, string>;
  };
  try {
    config = JSON.parse(text);
  } catch (err) {
    throw new Error(`${file} is not JSON: ${(err as Error).message}`);
  }
  const helper = config.credHelpers?.[registry] ?? config.credsStore;
  // docker login writes the host, older clients a URL; Docker Hub's is its own.
  const keys = [
    registry,
    `https://${registry}`,
    `http://${registry}`,
    `https://${registry}/v1/`,
    `https://${registry}/v2/`,
  ];
  const key = keys.find((k) => config.auths?.[k]);
  const entry = key ? config.auths?.[key] : undefined;
  if (entry?.identitytoken) {
    throw new Error(
      `${file} holds an identity token for ${registry} (an OAuth login); push takes a username and password: --username USER --password-stdin`,
    );
  }
  if (entry?.auth) {
    const plain = Buffer.from(entry.auth, "base64").toString("utf8");
    const i = plain.indexOf(":");
    if (i < 0) throw new Error(`${file}: auths.${key}.auth is not base64 of user:password`);
    return { username: plain.slice(0, i), password: plain.slice(i + 1), source: `${file} (auths.${key})` };
  }
  if (entry?.username && entry.password) {
    return { username: entry.username, password: entry.password, source: `${file} (auths.${key})` };
  }
  if (helper) {
    // The credential helper protocol: the server URL on stdin, {Username, Secret} on stdout.
    const program = `docker-credential-${helper}`;
    const r = spawnSync(program, ["get"], { input: registry, encoding: "utf8" });
    if (r.error) throw new Error(`${file} names credential helper ${program}, which cannot run: ${r.error.message}`);
    if (r.status !== 0) {
      if (/credentials not found/i.test(r.stdout + r.stderr)) return undefined;
      throw new Error(`${program} get ${registry} failed (exit ${r.status}): ${(r.stderr || r.stdout).trim()}`);
    }
    const got = JSON.parse(r.stdout) as { Username?: string; Secret?: string };
    if (!got.Username || !got.Secret) throw new Error(`${program} get ${registry} returned no Username and Secret`);
    return { username: got.Username, password: got.Secret, source: `${program} (${file})` };
  }
  return undefined;
}

/** A registry's error body, as the distribution spec has it: {errors: [{code, message}]}. */
async function registryError(res: Response): Promise<string> {
  const text = await res.text().catch(() => "");
  try {
    const body = JSON.parse(text) as { errors?: { code?: string; message?: string }[] };
    const e = body.errors?.map((x) => [x.code, x.message].filter(Boolean).join(": ")).join("; ");
    if (e) return `HTTP ${res.status} ${e}`;
  } catch {
    // not JSON
  }
  return `HTTP ${res.status}${text ? ` ${text.slice(0, 300).trim()}` : ""}`;
}

/** One authenticated session with one repository of a registry. */
export class RegistryClient {
  private authorization: string | undefined;
  readonly base: string;
  readonly target: Target;
  private readonly creds: Credentials | undefined;

  constructor(target: Target, creds: Credentials | undefined) {
    this.target = target;
    this.creds = creds;
    this.base = `${target.plainHttp ? "http" : "https"}://${target.registry}`;
  }

  get name(): string {
    return `${this.target.registry}/${this.target.repository}`;
  }

  private async send(method: string, url: string, init: RequestInit = {}): Promise<Response> {
    const headers = {
      ...(init.headers as Record<string, string>),
      ...(this.authorization ? { authorization: this.authorization } : {}),
    };
    try {
      return await fetch(url, { ...init, method, headers, redirect: "follow" });
    } catch (err) {
      const cause = (err as { cause?: { code?: string; message?: string } }).cause;
      const why = cause?.code ?? cause?.message ?? (err as Error).message;
      const hint = this.target.plainHttp
        ? ""
        : /EPROTO|wrong version number|ECONNRESET/i.test(String(why))
          ? " (a registry speaking plain HTTP? add --plain-http)"
          : /CERT|self.signed|UNABLE_TO_VERIFY|unable to get local issuer/i.test(String(why))
            ? " (a private CA? NODE_EXTRA_CA_CERTS=ca.crt npm run push …)"
            : "";
      throw new Error(`cannot reach ${url}: ${why}${hint}`);
    }
  }

  /** Answers the registry's challenge: Basic with the credentials, or a Bearer token from its token service. */
  private async authorize(challenge: string): Promise<void> {
    const [scheme = "", ...rest] = challenge.trim().split(/\s+/);
    const params = Object.fromEntries(
      [...rest.join(" ").matchAll(/([a-z_]+)="([^"]*)"/gi)].map((m) => [m[1]?.toLowerCase(), m[2]]),
    ) as Record<string, string>;
    const where = `${this.target.registry}`;
    if (!this.creds) {
      throw new Error(
        `${where} asks for credentials (${scheme}): docker login ${where}, or --username USER --password-stdin`,
      );
    }
    const basic = `Basic ${Buffer.from(`${this.creds.username}:${this.creds.password}`).toString("base64")}`;
    if (/^basic$/i.test(scheme)) {
      this.authorization = basic;
      return;
    }
    if (!/^bearer$/i.test(scheme) || !params.realm)
      throw new Error(`${where}: unsupported authentication challenge '${challenge}'`);
    const u = new URL(params.realm);
    if (params.service) u.searchParams.set("service", params.service);
    u.searchParams.set("scope", `repository:${this.target.repository}:pull,push`);
    const res = await fetch(u, { headers: { authorization: basic } }).catch((err: Error) => {
      throw new Error(`cannot reach ${where}'s token service ${u.origin}${u.pathname}: ${err.message}`);
    });
    if (res.status === 401 || res.status === 403) {
      throw new Error(
        `${where}'s token service refused the credentials from ${this.creds.source} (HTTP ${res.status}): docker login ${where}, or --username USER --password-stdin`,
      );
    }
    if (!res.ok) throw new Error(`${where}'s token service ${u.origin}${u.pathname}: ${await registryError(res)}`);
    const body = (await res.json()) as { token?: string; access_token?: string };
    const token = body.token ?? body.access_token;
    if (!token) throw new Error(`${where}'s token service answered without a token`);
    this.authorization = `Bearer ${token}`;
  }

  /** A request, authenticating once on a 401 challenge; a second 401 names the credentials. */
  async request(method: string, pathOrUrl: string, init: RequestInit = {}): Promise<Response> {
    const url = pathOrUrl.startsWith("http") ? pathOrUrl : `${this.base}${pathOrUrl}`;
    let res = await this.send(method, url, init);
    if (res.status === 401) {
      const challenge = res.headers.get("www-authenticate") ?? "";
      await res.arrayBuffer().catch(() => undefined);
      const before = this.authorization;
      await this.authorize(challenge);
      if (this.authorization !== before) res = await this.send(method, url, init);
      if (res.status === 401 || (res.status === 403 && this.creds)) {
        throw new Error(
          `${this.target.registry} refused the credentials from ${this.creds?.source ?? "nowhere"} for ${this.name} (${await registryError(res)}): docker login ${this.target.registry}, or --username USER --password-stdin`,
        );
      }
    }
    return res;
  }

  /** Uploads a blob unless the repository has it; true when it was sent. */
  async pushBlob(digest: string, data: () => Promise<Buffer>): Promise<boolean> {
    const repo = this.target.repository;
    const head = await this.request("HEAD", `/v2/${repo}/blobs/${digest}`);
    if (head.status === 200) return false;
    const start = await this.request("POST", `/v2/${repo}/blobs/uploads/`);
    if (start.status !== 202)
      throw new Error(`${this.name}: starting the upload of ${digest}: ${await registryError(start)}`);
    const loc = new URL(start.headers.get("location") ?? "", this.base);
    loc.searchParams.set("digest", digest);
    const put = await this.request("PUT", loc.toString(), {
      body: new Uint8Array(await data()),
      headers: { "content-type": "application/octet-stream" },
    });
    if (put.status !== 201) throw new Error(`${this.name}: uploading ${digest}: ${await registryError(put)}`);
    return true;
  }

  async pushManifest(tag: string, mediaType: string, bytes: Buffer, digest: string): Promise<void> {
    const res = await this.request("PUT", `/v2/${this.target.repository}/manifests/${tag}`, {
      body: new Uint8Array(bytes),
      headers: { "content-type": mediaType },
    });
    if (res.status !== 201) throw new Error(`${this.name}:${tag}: ${await registryError(res)}`);
    const got = res.headers.get("docker-content-digest");
    if (got && got !== digest)
      throw new Error(`${this.name}:${tag}: the registry stored manifest ${got}, not ${digest}`);
  }
}

export interface Pushed {
  tag: string;
  /** The manifest's digest: what a bundle's `packages` and a Deployment's image name. */
  digest: string;
  /** The last layer's digest (a registry package's payload). */
  layer: string;
  /** Blobs sent (the others were there already). */
  sent: number;
}

/** Pushes the image of an OCI layout under `tag` (default: the layout's own). */
export async function pushLayout(client: RegistryClient, dir: string, tag?: string): Promise<Pushed> {
  const image = await readImageLayout(dir);
  const ref = tag ?? image.tag;
  if (!ref) throw new Error(`${dir}: no tag given and the index has no org.opencontainers.image.ref.name`);
  let sent = 0;
  for (const b of image.blobs) if (await client.pushBlob(b.digest, () => image.blob(b.digest))) sent++;
  await client.pushManifest(ref, image.manifest.mediaType, image.manifest.bytes, image.manifest.digest);
  return { tag: ref, digest: image.manifest.digest, layer: image.layer, sent };
}

const blobs = (n: number) => (n === 0 ? "every blob already there, none sent" : `${n} blob${n > 1 ? "s" : ""} sent`);

interface PackagesIndex {
  [name: string]: { version: string; tag: string; digest: string };
}

/** The command line; returns the exit code. */
export async function main(argv: string[], io = { stdin: process.stdin, out: console.log }): Promise<number> {
  let image = false;
  let plainHttp = false;
  let from: string | undefined;
  let username: string | undefined;
  let passwordStdin = false;
  const positionals: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    if (a === "--image") image = true;
    else if (a === "--plain-http") plainHttp = true;
    else if (a === "--from") from = argv[++i];
    else if (a === "--username") username = argv[++i];
    else if (a === "--password-stdin") passwordStdin = true;
    else if (a === "--password")
      throw new Error("--password would put the password on the command line (visible in ps): use --password-stdin");
    else if (a.startsWith("-")) throw new Error(`unknown option ${a} (see the top of scripts/push.ts)`);
    else positionals.push(a);
  }
  if (positionals.length !== 1)
    throw new Error(
      "usage: npm run push -- [--image] [--from DIR] [--username USER --password-stdin] [--plain-http] REGISTRY/PATH",
    );
  if (!!username !== passwordStdin) throw new Error("--username and --password-stdin go together");
  const target = parseTarget(positionals[0] as string, plainHttp);
  let creds: Credentials | undefined;
  if (username) {
    const chunks: Buffer[] = [];
    for await (const c of io.stdin) chunks.push(c as Buffer);
    const password = Buffer.concat(chunks)
      .toString("utf8")
      .replace(/\r?\n$/, "");
    if (!password) throw new Error("--password-stdin: stdin was empty");
    creds = { username, password, source: "--username/--password-stdin" };
  } else {
    creds = await dockerConfigCredentials(target.registry);
  }
  const client = new RegistryClient(target, creds);
  const dir = path.resolve(from ?? path.join(REPO, image ? "dist-image" : "dist-packages"));
  if (!existsSync(dir))
    throw new Error(`${dir} does not exist: run ${image ? "npm run image" : "npm run package"} first`);

  if (image) {
    const p = await pushLayout(client, dir);
    io.out(`pushed ${client.name}:${p.tag} (${blobs(p.sent)})`);
    io.out(`image: ${client.name}@${p.digest}`);
    io.out(
      "set it as the image of cluster/deploy/deployment.yaml (kubectl -n d8-cloud-instance-manager set image deployment/bashible-server server=…)",
    );
    return 0;
  }
  const indexFile = path.join(dir, "packages.json");
  const index = JSON.parse(
    await readFile(indexFile, "utf8").catch(() => {
      throw new Error(
        `${indexFile} not found: ${dir} is not what npm run package writes (or pass --image for dist-image/)`,
      );
    }),
  ) as PackagesIndex;
  const lines: string[] = [];
  for (const [name, entry] of Object.entries(index).sort(([a], [b]) => a.localeCompare(b))) {
    // One repository for all packages (as Deckhouse keeps them): the name in the tag keeps two
    // packages of the same version apart.
    const p = await pushLayout(client, path.join(dir, name), `${name}-${entry.tag}`);
    if (p.digest !== entry.digest)
      throw new Error(`${name}: pushed ${p.digest}, but packages.json says ${entry.digest}`);
    io.out(`pushed ${name} ${entry.version} as ${client.name}:${p.tag} ${p.digest} (${blobs(p.sent)})`);
    lines.push(`  ${name}: {digest: "${p.digest}", repository: ${target.repository}}`);
  }
  io.out(
    `\nfor the cluster context (docs/cluster.md, "The cluster context"; the registry-packages proxy's --upstream is ${client.base}):`,
  );
  io.out(`packages:\n${lines.join("\n")}`);
  return 0;
}

if (import.meta.main) {
  try {
    process.exitCode = await main(process.argv.slice(2));
  } catch (err) {
    console.error(`push: ${(err as Error).message}`);
    process.exitCode = 1;
  }
}
