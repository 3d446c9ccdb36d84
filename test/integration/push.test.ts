// `npm run push -- REGISTRY/PATH`: a user publishes the registry packages (and `--image` the
// server's image) to a registry with their own credentials, against a real docker-registry
// behind htpasswd (Basic) and behind a token service (Bearer), as the README documents it.
import t from "tap";
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { chmod, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { writePackage } from "../../scripts/package.ts";
import { writeImageLayout } from "../../scripts/lib/oci-layout.ts";
import { type Registry, startRegistry } from "../../scripts/lib/registry.ts";

const PUSH = path.resolve(import.meta.dirname, "../../scripts/push.ts");
const USER = "publisher";
const PASSWORD = `pw-${Math.random().toString(36).slice(2)}`;
const work = await mkdtemp(path.join(os.tmpdir(), "bashible-push-"));
t.teardown(() => rm(work, { recursive: true, force: true }));

// What `npm run package` writes: layouts and packages.json (two small packages).
const packages = path.join(work, "dist-packages");
const index: Record<string, unknown> = {};
for (const [name, version] of [
  ["hello", "1.0.0"],
  ["world", "1.0.0"],
] as const) {
  const b = await writePackage(
    {
      name,
      version,
      description: `${name} for the push test`,
      generated: [{ content: `#!/bin/sh\necho ${name}\n`, dest: `/opt/deckhouse/bin/${name}`, mode: 0o755 }],
    },
    packages,
  );
  index[name] = { version: b.version, tag: b.tag, digest: b.digest, layer: b.layer, size: b.size, paths: b.paths };
}
await writeFile(path.join(packages, "packages.json"), JSON.stringify(index));
const built = index as Record<string, { digest: string; layer: string }>;

function push(args: string[], o: { env?: Record<string, string>; stdin?: string } = {}) {
  return new Promise<{ code: number; out: string }>((resolve) => {
    const child = spawn(process.execPath, [PUSH, "--plain-http", ...args], {
      env: { PATH: process.env.PATH ?? "", HOME: work, DOCKER_CONFIG: path.join(work, "no-docker"), ...o.env },
      stdio: ["pipe", "pipe", "pipe"],
    });
    let out = "";
    child.stdout.on("data", (d) => (out += d));
    child.stderr.on("data", (d) => (out += d));
    child.stdin.end(o.stdin ?? "");
    child.on("close", (code) => resolve({ code: code ?? 1, out }));
  });
}

async function dockerConfig(name: string, config: unknown): Promise<string> {
  const dir = path.join(work, name);
  await mkdir(dir, { recursive: true });
  await writeFile(path.join(dir, "config.json"), JSON.stringify(config), { mode: 0o600 });
  return dir;
}

const basic = `Basic ${Buffer.from(`${USER}:${PASSWORD}`).toString("base64")}`;
const ACCEPT = "application/vnd.oci.image.manifest.v1+json";
/** The manifest the registry serves for repository:tag (Basic auth), and its digest. */
async function pulled(reg: Registry, repository: string, tag: string) {
  const r = await fetch(`${reg.url}/v2/${repository}/manifests/${tag}`, {
    headers: { authorization: basic, accept: ACCEPT },
  });
  return { status: r.status, digest: r.headers.get("docker-content-digest") };
}

t.test("Basic auth (htpasswd)", async (t) => {
  const reg = await startRegistry({ parentDir: work, htpasswd: { username: USER, password: PASSWORD } });
  t.teardown(() => reg.stop());
  const target = `${reg.host}/deckhouse/ce/packages`;

  await t.test("the registry (the demo's too) listens on loopback only", async (t) => {
    const port = Number(reg.host.split(":")[1]).toString(16).toUpperCase().padStart(4, "0");
    const listening = ["/proc/net/tcp", "/proc/net/tcp6"]
      .flatMap((f) => readFileSync(f, "utf8").split("\n").slice(1))
      .map((l) => l.trim().split(/\s+/))
      .filter((f) => f[1]?.endsWith(`:${port}`) && f[3] === "0A")
      .map((f) => f[1]);
    t.same(listening, [`0100007F:${port}`], "127.0.0.1, not 0.0.0.0 or ::");
  });

  await t.test("without credentials it says the registry wants them and how to give them", async (t) => {
    const r = await push(["--from", packages, target]);
    t.equal(r.code, 1);
    t.match(
      r.out,
      `push: ${reg.host} asks for credentials (Basic): docker login ${reg.host}, or --username USER --password-stdin`,
    );
    t.equal((await pulled(reg, "deckhouse/ce/packages", "hello-1.0.0")).status, 404, "nothing was pushed");
  });

  await t.test("a wrong password is refused, named by where it came from, and never shown", async (t) => {
    const r = await push(["--from", packages, "--username", USER, "--password-stdin", target], {
      stdin: "wrong-password\n",
    });
    t.equal(r.code, 1);
    t.match(r.out, `${reg.host} refused the credentials from --username/--password-stdin`);
    t.notMatch(r.out, "wrong-password");
  });

  await t.test("with ~/.docker/config.json's auth it pushes every package, tagged <name>-<version>", async (t) => {
    const dir = await dockerConfig("docker-basic", {
      auths: { [reg.host]: { auth: Buffer.from(`${USER}:${PASSWORD}`).toString("base64") } },
    });
    const r = await push(["--from", packages, target], { env: { DOCKER_CONFIG: dir } });
    t.equal(r.code, 0, r.out);
    for (const name of ["hello", "world"]) {
      const entry = built[name] as { digest: string; layer: string };
      t.match(r.out, `pushed ${name} 1.0.0 as ${target}:${name}-1.0.0 ${entry.digest} (2 blobs sent)`); // its config and layer
      const m = await pulled(reg, "deckhouse/ce/packages", `${name}-1.0.0`);
      t.same(m, { status: 200, digest: entry.digest }, `${name}: the registry serves the manifest packages.json names`);
      const layer = await fetch(`${reg.url}/v2/deckhouse/ce/packages/blobs/${entry.layer}`, {
        headers: { authorization: basic },
      });
      t.equal(layer.status, 200, `${name}: and its layer`);
      await layer.arrayBuffer();
      t.match(r.out, `  ${name}: {digest: "${entry.digest}", repository: deckhouse/ce/packages}`, "the context lines");
    }
    t.notMatch(r.out, PASSWORD, "the password never shows");
  });

  await t.test("--username/--password-stdin works too, and blobs already there are not sent again", async (t) => {
    const r = await push(["--from", packages, "--username", USER, "--password-stdin", target], {
      stdin: `${PASSWORD}\n`,
    });
    t.equal(r.code, 0, r.out);
    t.match(
      r.out,
      `pushed hello 1.0.0 as ${target}:hello-1.0.0 ${built.hello?.digest} (every blob already there, none sent)`,
    );
    t.notMatch(r.out, / blobs? sent\)/);
  });

  await t.test("a credential helper named by config.json is asked", async (t) => {
    const bin = path.join(work, "helper-bin");
    await mkdir(bin, { recursive: true });
    const helper = path.join(bin, "docker-credential-bbtest");
    // The protocol: `get`, the server on stdin, {Username, Secret} on stdout.
    await writeFile(
      helper,
      `#!/bin/sh\nread server\n[ "$server" = "${reg.host}" ] || { echo "credentials not found in native keychain"; exit 1; }\necho '{"ServerURL":"'"$server"'","Username":"${USER}","Secret":"${PASSWORD}"}'\n`,
    );
    await chmod(helper, 0o755);
    const dir = await dockerConfig("docker-helper", { credsStore: "bbtest" });
    const r = await push(["--from", packages, `${reg.host}/helper/packages`], {
      env: { DOCKER_CONFIG: dir, PATH: `${bin}:${process.env.PATH}` },
    });
    t.equal(r.code, 0, r.out);
    t.equal((await pulled(reg, "helper/packages", "world-1.0.0")).status, 200);
  });

  await t.test("--image pushes an image layout under its own tag and prints the digest reference", async (t) => {
    const tree = path.join(work, "image-tree");
    await mkdir(path.join(tree, "etc"), { recursive: true });
    await writeFile(path.join(tree, "etc/hello"), "hello\n");
    const img = await writeImageLayout({
      tree,
      dir: path.join(work, "dist-image"),
      tag: "0.1.0",
      config: { architecture: "amd64", os: "linux", config: { Entrypoint: ["/bin/true"] } },
    });
    const r = await push(
      ["--image", "--from", img.dir, "--username", USER, "--password-stdin", `${reg.host}/deckhouse/bashible-server`],
      {
        stdin: PASSWORD,
      },
    );
    t.equal(r.code, 0, r.out);
    t.match(r.out, `image: ${reg.host}/deckhouse/bashible-server@${img.digest}`);
    t.same(await pulled(reg, "deckhouse/bashible-server", "0.1.0"), { status: 200, digest: img.digest });
  });
});

t.test("a registry behind a token service (Bearer), credentials from config.json", async (t) => {
  const reg = await startRegistry({ parentDir: work, tokenAuth: { username: USER, password: PASSWORD } });
  t.teardown(() => reg.stop());
  const dir = await dockerConfig("docker-token", {
    auths: { [`https://${reg.host}`]: { username: USER, password: PASSWORD } },
  });
  const r = await push(["--from", packages, `${reg.host}/deckhouse/packages`], { env: { DOCKER_CONFIG: dir } });
  t.equal(r.code, 0, r.out);
  t.ok((reg.auth?.tokensIssued() ?? 0) > 0, "tokens were issued to the push");
  t.match(r.out, `pushed hello 1.0.0 as ${reg.host}/deckhouse/packages:hello-1.0.0`);
});

t.test("what it refuses before talking to anyone", async (t) => {
  const bad = await push(["--from", packages, "Registry.Example.com"]);
  t.equal(bad.code, 1);
  t.match(bad.out, "is not REGISTRY/PATH");
  const pw = await push(["--password", "x", "127.0.0.1:1/a"]);
  t.match(pw.out, "--password would put the password on the command line");
});
