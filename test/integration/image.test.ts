// `npm run image`: the server's OCI image, built without Docker, runs in a real containerd as
// the Deployment runs it (its user, a read-only root, no capabilities) and serves; the same
// build gives the same digest. The end-to-end scenario runs the bundle server from it too.
import t from "tap";
import { existsSync } from "node:fs";
import { chown, copyFile, mkdir, mkdtemp, readFile, rm } from "node:fs/promises";
import { Agent, request } from "node:https";
import os from "node:os";
import path from "node:path";
import { buildDist } from "../../scripts/build.ts";
import { buildImage, IMAGE_NAME, IMAGE_UID } from "../../scripts/image.ts";
import { createCA, issueCert } from "../../scripts/lib/pki.ts";
import { startHostContainerd } from "../../scripts/lib/containerd-host.ts";
import { readImageLayout } from "../../scripts/lib/oci-layout.ts";
import { freePort } from "../../scripts/lib/control-plane.ts";
import { until } from "../../scripts/lib/until.ts";

if (process.getuid?.() !== 0) {
  t.plan(0, "needs root (containerd)");
} else {
  const work = await mkdtemp(path.join(os.tmpdir(), "bashible-image-"));
  t.teardown(() => rm(work, { recursive: true, force: true }));
  const dist = path.join(work, "dist");
  await buildDist(dist);
  const image = await buildImage({ dist, out: path.join(work, "image") });
  const ctd = await startHostContainerd(path.join(work, "containerd"));
  t.teardown(() => ctd.stop());
  const ref = await ctd.importLayout(image.dir, IMAGE_NAME);

  /** Runs the image with args to the end; its output. */
  let n = 0;
  const runImage = async (args: string[]) => {
    const id = `image-test-${++n}`;
    const logFile = path.join(work, `${id}.log`);
    const proc = await ctd.run({ id, image: ref, args, logFile });
    const code = await new Promise<number>((r) => proc.once("close", (c) => r(c ?? 1)));
    await ctd.stopContainer(id);
    return { code, out: await readFile(logFile, "utf8") };
  };

  t.test("the layout is what the README says: a tagged OCI image with the runtime as entrypoint", async (t) => {
    const layout = await readImageLayout(image.dir);
    t.equal(layout.tag, image.version);
    t.equal(layout.manifest.digest, image.digest);
    const config = JSON.parse((await layout.blob(layout.blobs[0]?.digest ?? "")).toString()) as {
      config: { User: string; Entrypoint: string[] };
    };
    t.equal(config.config.User, "64535:64535", "the Deployment's runAsUser");
    t.same(config.config.Entrypoint, image.entrypoint);
    t.match(
      image.libraries.join(" "),
      /^libc6 \S+ libgcc-s1 \S+ libstdc\+\+6 \S+$/,
      "the C libraries come from Debian",
    );
  });

  t.test("the same build gives the same image digest", async (t) => {
    const again = await buildImage({ dist, out: path.join(work, "image-again") });
    t.equal(again.digest, image.digest);
  });

  t.test("in containerd it runs the agent's commands as uid 64535 on a read-only root", async (t) => {
    const v = await runImage(["version"]);
    t.equal(v.code, 0, v.out);
    t.match(v.out, /^bashible \d+\.\d+\.\d+ \(node v24\./);
    const probe = await runImage(["internal-image-probe-is-not-a-command"]);
    t.equal(probe.code, 1, "an unknown command exits 1, as on a node");
    t.match(probe.out, "bashible: unknown command 'internal-image-probe-is-not-a-command'");
    t.notOk(existsSync(path.join(work, "image/bin/sh")), "no shell in the layout");
  });

  t.test("bashible server serves from the image, with its certificates mounted read-only", async (t) => {
    const tls = path.join(work, "tls");
    await mkdir(tls);
    const ca = await createCA(tls, "ca", "image-test-ca");
    const serving = await issueCert(tls, "serving", ca, { cn: "bashible-api", ips: ["127.0.0.1"] });
    const client = await issueCert(tls, "client", ca, { cn: "image-test", orgs: ["system:masters"], client: true });
    const mounted = path.join(work, "mounted");
    await mkdir(mounted);
    for (const [name, src] of [
      ["ca.crt", ca.cert],
      ["tls.crt", serving.cert],
      ["tls.key", serving.key],
    ] as const) {
      await copyFile(src, path.join(mounted, name));
      await chown(path.join(mounted, name), IMAGE_UID, IMAGE_UID);
    }
    const port = await freePort();
    const logFile = path.join(work, "server.log");
    await ctd.run({
      id: "image-server",
      image: ref,
      netHost: true,
      mounts: [{ src: mounted, dst: "/etc/bashible/tls" }],
      // The example cluster the build ships is the config dir when no cluster is given.
      args: [
        "server",
        "--standalone",
        "--address",
        "127.0.0.1",
        "--port",
        String(port),
        "--tls-cert-file",
        "/etc/bashible/tls/tls.crt",
        "--tls-private-key-file",
        "/etc/bashible/tls/tls.key",
        "--client-ca-file",
        "/etc/bashible/tls/ca.crt",
        "--log-format",
        "json",
      ],
      logFile,
    });
    t.teardown(() => ctd.stopContainer("image-server"));
    const agent = new Agent({
      ca: await readFile(ca.cert),
      cert: await readFile(client.cert),
      key: await readFile(client.key),
    });
    const get = (p: string) =>
      new Promise<{ status: number; body: string }>((resolve, reject) => {
        const req = request({ host: "127.0.0.1", port, path: p, agent }, (res) => {
          let body = "";
          res.on("data", (d) => (body += d));
          res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
        });
        req.on("error", reject);
        req.end();
      });
    const ready = await until(
      "the server in the container to answer /readyz",
      async () => {
        const r = await get("/readyz");
        return r.status === 200 ? r : undefined;
      },
      60_000,
      200,
    ).catch(async (err: Error) => {
      throw new Error(`${err.message}\n${await readFile(logFile, "utf8").catch(() => "")}`);
    });
    t.equal(ready.status, 200, ready.body);
    const bundle = await get("/apis/bashible.deckhouse.io/v1alpha1/nodegroupbundles/worker");
    t.equal(bundle.status, 200, "it renders the example cluster's group");
    t.match(JSON.parse(bundle.body), { kind: "NodeGroupBundle" });
  });
}
