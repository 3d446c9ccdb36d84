// containerd in a sandbox tree with Debian's containerd binary: the configuration is checked by
// containerd before it is installed, a real containerd started on what was written serves CRI
// (crictl info shows the bundle's settings; crictl pull goes through hosts.toml, mirrors and
// registry credentials to real registries), the engine restarts containerd only when what it
// reads changed, credentials never show in plans, and a major-version change is disruptive.
import t, { type Test } from "tap";
import { createHash } from "node:crypto";
import { copyFile, mkdir, mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import { existsSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { gunzipSync } from "node:zlib";
import { stepEnv, type StepEnv } from "../fixtures/steps.ts";
import { buildLayer, startRegistry, type Registry } from "../../scripts/lib/registry.ts";
import { CRICTL, startContainerd } from "../fixtures/containerd.ts";
import { containerd2 } from "../lib/containerd2.ts";
import { PATHS } from "../../bundles/paths.ts";
import type { BundleStep, ContainerdSpec } from "../../bundles/types.ts";
import { PROXY_DROP_IN } from "../../steps/containerd.ts";

const DEBIAN_CONTAINERD = "/usr/bin/containerd";
const missing = [DEBIAN_CONTAINERD, CRICTL, "/usr/bin/systemd-analyze", "/etc/containerd"].filter(
  (p) => !existsSync(p),
);
const skip =
  process.getuid?.() !== 0
    ? "needs root (files are written root-owned; containerd runs in a mount namespace)"
    : missing.length
      ? `needs ${missing.join(", ")} (apt-get install containerd systemd; crictl: npm run package crictl)`
      : false;

const STEP = "032_configure_containerd";
const bundleStep = (spec: ContainerdSpec): BundleStep => ({ name: STEP, kind: "Containerd", spec });
const baseSpec = (over: Partial<ContainerdSpec> = {}): ContainerdSpec => ({
  cgroupDriver: "systemd",
  sandboxImage: "registry.example.test/pause:3.10",
  snapshotter: "overlayfs",
  maxConcurrentDownloads: 3,
  registries: [],
  package: "containerd",
  ...over,
});

async function tree(t: Test, bin = DEBIAN_CONTAINERD): Promise<StepEnv> {
  const env = await stepEnv(t);
  await mkdir(path.join(env.root, "opt/deckhouse/bin"), { recursive: true });
  await copyFile(bin, path.join(env.root, PATHS.binDir, "containerd"));
  await mkdir(path.join(env.root, PATHS.packageStore, "containerd"), { recursive: true });
  await writeFile(path.join(env.root, PATHS.packageStore, "containerd/digest"), `sha256:${"a".repeat(64)}\n`);
  return env;
}

const actions = async (env: StepEnv) =>
  (await readFile(path.join(env.root, PATHS.sandboxActions), "utf8").catch(() => ""))
    .split("\n")
    .filter(Boolean)
    .map((l) => l.replace(/^\S+ /, ""));

/** An OCI image (one layer with one file) pushed to the registry; returns its reference. */
async function pushImage(registry: Registry, dir: string, repository: string, tag: string): Promise<string> {
  const work = await mkdtemp(path.join(dir, "image-"));
  const layer = await buildLayer({
    install: "#!/bin/bash\n",
    uninstall: "#!/bin/bash\n",
    payload: { "hello.txt": "hi\n" },
  });
  const hex = (b: Buffer) => createHash("sha256").update(b).digest("hex");
  const config = Buffer.from(
    JSON.stringify({
      architecture: "amd64",
      os: "linux",
      config: {},
      rootfs: { type: "layers", diff_ids: [`sha256:${hex(gunzipSync(layer))}`] },
    }),
  );
  const manifest = Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: "application/vnd.oci.image.manifest.v1+json",
      config: {
        mediaType: "application/vnd.oci.image.config.v1+json",
        digest: `sha256:${hex(config)}`,
        size: config.length,
      },
      layers: [
        {
          mediaType: "application/vnd.oci.image.layer.v1.tar+gzip",
          digest: `sha256:${hex(layer)}`,
          size: layer.length,
        },
      ],
    }),
  );
  await mkdir(path.join(work, "blobs/sha256"), { recursive: true });
  for (const b of [layer, config, manifest]) await writeFile(path.join(work, "blobs/sha256", hex(b)), b);
  await writeFile(path.join(work, "oci-layout"), JSON.stringify({ imageLayoutVersion: "1.0.0" }));
  await writeFile(
    path.join(work, "index.json"),
    JSON.stringify({
      schemaVersion: 2,
      manifests: [
        {
          mediaType: "application/vnd.oci.image.manifest.v1+json",
          digest: `sha256:${hex(manifest)}`,
          size: manifest.length,
          annotations: { "org.opencontainers.image.ref.name": tag },
        },
      ],
    }),
  );
  await registry.pushOciLayout(repository, work);
  return `${repository}:${tag}`;
}

t.test(
  "containerd: from scratch, checked, loads and serves CRI, pulls through hosts.toml with credentials and mirrors",
  { skip },
  async (t) => {
    const dir = await mkdtemp(path.join(os.tmpdir(), "containerd-test-"));
    t.teardown(() => rm(dir, { recursive: true, force: true }));
    const creds = { username: "puller", password: "pull-secret-0123" };
    const registry = await startRegistry({ parentDir: dir, tokenAuth: creds });
    t.teardown(() => registry.stop());
    const mirror = await startRegistry({ parentDir: dir });
    t.teardown(() => mirror.stop());
    const host = new URL(registry.url).host;
    const privateImage = await pushImage(registry, dir, "team/private", "v1");
    const mirroredImage = await pushImage(mirror, dir, "library/mirrored", "v1");
    const auth = Buffer.from(`${creds.username}:${creds.password}`).toString("base64");

    const env = await tree(t);
    const spec = baseSpec({
      registries: [
        { host, scheme: "http", auth, mirrors: [] },
        // Nothing answers for registry.example.test: pulls can only succeed through its mirror.
        { host: "registry.example.test", scheme: "https", mirrors: [mirror.url] },
      ],
    });
    const step = bundleStep(spec);
    const run = (await env.planRun([step]))[0]!;
    const config = run.changes.find((c) => c.kind === "file" && c.path === PATHS.containerdConfig);
    t.ok(config, "config.toml is planned");
    const shown = JSON.stringify(run.changes);
    for (const secret of [auth, creds.password])
      t.notOk(
        shown.includes(`"diff":"${secret}`) || (config?.kind === "file" && config.diff.includes(secret)),
        "no credential in the plan's diffs",
      );
    t.match(
      config?.kind === "file" && config.diff,
      /auth = "<registry credentials>"/,
      "the diff says where the credentials go",
    );
    t.match(run.changes.map((c) => c.summary).join("\n"), /start containerd-deckhouse.service: it is not running/);

    t.equal((await env.apply(step)).outcome, "changed");
    t.same(
      await actions(env),
      ["systemctl daemon-reload", "systemctl restart containerd-deckhouse.service"],
      "started once, by one restart",
    );
    t.equal((await stat(path.join(env.root, PATHS.containerdConfig))).mode & 0o777, 0o600, "credentials: root only");
    const text = await readFile(path.join(env.root, PATHS.containerdConfig), "utf8");
    t.match(text, /^version = 2$/m, "containerd 1.x: configuration version 2");
    t.match(text, /SystemdCgroup = true/);
    t.match(text, /device_ownership_from_security_context = true/, "Deckhouse's CRI settings");
    t.notMatch(text, /^imports/m, "fragments are merged in, not imported");
    t.equal(
      await readFile(path.join(env.root, "etc/crictl.yaml"), "utf8"),
      "# Managed by bashible (032_configure_containerd).\nruntime-endpoint: unix:///run/containerd/containerd.sock\nimage-endpoint: unix:///run/containerd/containerd.sock\ntimeout: 2\ndebug: false\npull-image-on-create: false\n",
      "crictl finds containerd without flags",
    );
    t.match(
      await readFile(path.join(env.root, PATHS.containerdRegistryDir, "registry.example.test/hosts.toml"), "utf8"),
      `[host."${mirror.url}"]`,
    );
    t.same((await env.plan(step)).changes, [], "a second run plans nothing");
    t.equal((await env.apply(step)).outcome, "unchanged");
    t.equal((await actions(env)).length, 2, "and restarts nothing");

    // The real containerd on what was written.
    const ctd = await startContainerd(path.join(env.root, PATHS.binDir, "containerd"), env.root);
    t.teardown(() => ctd.stop());
    const info = JSON.parse(await ctd.crictl(["info"])) as { config: Record<string, unknown> };
    const cfg = info.config as {
      sandboxImage: string;
      registry: { configPath: string };
      containerd: { snapshotter: string; runtimes: { runc: { options: { SystemdCgroup: boolean } } } };
    };
    t.equal(cfg.sandboxImage, spec.sandboxImage, "CRI runs with the bundle's sandbox image");
    t.equal(cfg.registry.configPath, PATHS.containerdRegistryDir);
    t.equal(cfg.containerd.snapshotter, "overlayfs");
    t.equal(cfg.containerd.runtimes.runc.options.SystemdCgroup, true, "the kubelet's cgroup driver");
    t.equal(
      (info.config as { device_ownership_from_security_context?: boolean }).device_ownership_from_security_context,
      true,
      "devices get the pod's runAsUser/runAsGroup",
    );
    await ctd.crictl(["pull", `${host}/${privateImage}`]);
    t.ok(registry.auth!.tokensIssued() > 0, "pulled with the bundle's credentials (token flow)");
    await ctd.crictl(["pull", `registry.example.test/${mirroredImage}`]);
    t.match(await ctd.crictl(["images", "-q"]), /sha256:/, "both images are there");
  },
);

t.test("containerd: restarts only when what it reads changed; Deckhouse's flag is honoured", { skip }, async (t) => {
  const env = await tree(t);
  const first = bundleStep(baseSpec({ registries: [{ host: "registry.example.test", scheme: "https", mirrors: [] }] }));
  await env.apply(first);
  const restarts = async () => (await actions(env)).filter((a) => a.includes("restart")).length;
  t.equal(await restarts(), 1);

  const mirrors = bundleStep(
    baseSpec({
      registries: [{ host: "registry.example.test", scheme: "https", mirrors: ["https://mirror.example.test"] }],
    }),
  );
  const plan = (await env.planRun([mirrors]))[0]!;
  t.same(
    plan.changes.map((c) => c.kind),
    ["file"],
    "a new mirror is hosts.toml only",
  );
  await env.apply(mirrors);
  t.equal(await restarts(), 1, "containerd reads hosts.toml at each pull: no restart");

  const image = bundleStep(
    baseSpec({
      sandboxImage: "registry.example.test/pause:3.11",
      registries: [{ host: "registry.example.test", scheme: "https", mirrors: ["https://mirror.example.test"] }],
    }),
  );
  const svc = (await env.planRun([image]))[0]!.changes.find((c) => c.kind === "service");
  t.same(svc?.kind === "service" && [svc.action, svc.why], ["restart", [PATHS.containerdConfig]]);
  await env.apply(image);
  t.equal(await restarts(), 2, "a new sandbox image restarts it, once");

  await mkdir(path.join(env.root, PATHS.flags), { recursive: true });
  await writeFile(path.join(env.root, PATHS.flags, "containerd-need-restart"), "a script changed conf.d\n");
  await env.apply(image);
  t.equal(await restarts(), 3, "containerd-need-restart restarts it");
  t.notOk(existsSync(path.join(env.root, PATHS.flags, "containerd-need-restart")), "and is cleared");
  await env.apply(image);
  t.equal(await restarts(), 3, "once");
});

t.test(
  "containerd 1: a conf.d fragment is merged key by key (Deckhouse's registry-auth recipe keeps the CRI settings)",
  { skip },
  async (t) => {
    const env = await tree(t);
    const step = bundleStep(
      baseSpec({ registries: [{ host: "registry.example.test", scheme: "https", mirrors: [] }] }),
    );
    t.equal((await env.apply(step)).outcome, "changed");
    const restarts = async () => (await actions(env)).filter((a) => a.includes("restart")).length;
    // What Deckhouse's documentation has a NodeGroupConfiguration write for another registry's
    // credentials (weight below 32, so 032 merges it in the same run).
    const auth = Buffer.from("team:fragment-secret-42").toString("base64");
    await writeFile(
      path.join(env.root, PATHS.containerdConfD, "additional_registry.toml"),
      `[plugins]\n  [plugins."io.containerd.grpc.v1.cri"]\n    max_concurrent_downloads = 7\n    [plugins."io.containerd.grpc.v1.cri".registry.configs."other.example.test".auth]\n      auth = "${auth}"\n`,
    );
    await writeFile(
      path.join(env.root, PATHS.containerdConf2D, "v2-only.toml"),
      "this is not read by containerd 1\n",
    ).catch(async () => {
      await mkdir(path.join(env.root, PATHS.containerdConf2D), { recursive: true });
      await writeFile(
        path.join(env.root, PATHS.containerdConf2D, "v2-only.toml"),
        "this is not read by containerd 1\n",
      );
    });
    const plan = (await env.planRun([step]))[0]!;
    const config = plan.changes.find((c) => c.kind === "file" && c.path === PATHS.containerdConfig);
    t.match(
      config?.kind === "file" && config.diff,
      /\+.*merged: \/etc\/containerd\/conf\.d\/additional_registry\.toml/,
    );
    t.notMatch(
      JSON.stringify(plan.changes.map((c) => ({ ...c, content: undefined }))),
      /fragment-secret|ZnJhZ21lbnQtc2VjcmV0/,
      "the fragment's credentials are in no plan",
    );
    t.match(
      plan.changes.find((c) => c.kind === "service"),
      { why: [PATHS.containerdConfig] },
    );
    t.equal((await env.apply(step)).outcome, "changed");
    t.equal(await restarts(), 2, "restarted once for the merged configuration");
    const text = await readFile(path.join(env.root, PATHS.containerdConfig), "utf8");
    t.match(text, /max_concurrent_downloads = 7/, "the fragment's value wins");
    t.match(text, /sandbox_image = "registry\.example\.test\/pause:3\.10"/, "the bundle's CRI settings stay");
    t.match(text, /config_path = "\/etc\/containerd\/registry\.d"/);
    const ctd = await startContainerd(path.join(env.root, PATHS.binDir, "containerd"), env.root);
    t.teardown(() => ctd.stop());
    const info = JSON.parse(await ctd.crictl(["info"])) as {
      config: { sandboxImage: string; maxConcurrentDownloads: number; registry: { configs?: Record<string, unknown> } };
    };
    t.equal(
      info.config.sandboxImage,
      "registry.example.test/pause:3.10",
      "containerd serves the bundle's sandbox image",
    );
    t.equal(info.config.maxConcurrentDownloads, 7, "and the fragment's setting");
    t.ok(info.config.registry.configs?.["other.example.test"], "and the fragment's registry credentials");
    await ctd.stop();
    t.same((await env.plan(step)).changes, [], "merged: a second run plans nothing");

    // A fragment with registry mirrors: containerd refuses them beside config_path.
    await writeFile(
      path.join(env.root, PATHS.containerdConfD, "mirror.toml"),
      '[plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]\n  endpoint = ["https://mirror.example.test"]\n',
    );
    const refused = await env.apply(step);
    t.equal(refused.outcome, "failed");
    t.match(refused.error, /mirror\.toml sets registry mirrors.*registry\.d\/<host>\/hosts\.toml/);
    t.equal(await readFile(path.join(env.root, PATHS.containerdConfig), "utf8"), text, "config.toml stays");
    await writeFile(path.join(env.root, PATHS.containerdConfD, "mirror.toml"), "max_concurrent_downloads = [\n");
    t.match(
      (await env.apply(step)).error,
      /mirror\.toml: line \d+: .*fix or remove the fragment/,
      "one that does not parse too",
    );
  },
);

t.test("containerd: the cluster's proxy reaches containerd through Deckhouse's drop-in", { skip }, async (t) => {
  const env = await tree(t);
  const proxy = {
    httpProxy: "http://proxy.example.test:3128",
    noProxy: ["127.0.0.1", "169.254.169.254", "cluster.local", ".corp"],
  };
  const step = bundleStep(baseSpec({ proxy }));
  t.equal((await env.apply(step)).outcome, "changed");
  const dropIn = path.join(env.root, "etc/systemd/system/containerd-deckhouse.service.d/proxy-environment.conf");
  t.equal(
    await readFile(dropIn, "utf8"),
    '# Managed by bashible (032_configure_containerd): pulls go through the cluster\'s proxy.\n[Service]\nEnvironment="HTTP_PROXY=http://proxy.example.test:3128" "http_proxy=http://proxy.example.test:3128" "NO_PROXY=127.0.0.1,169.254.169.254,cluster.local,.corp" "no_proxy=127.0.0.1,169.254.169.254,cluster.local,.corp"\n',
  );
  const before = (await actions(env)).length;
  const other = bundleStep(
    baseSpec({ proxy: { ...proxy, httpProxy: "http://user:pr0xy-pass@proxy2.example.test:3128" } }),
  );
  const plan = (await env.planRun([other]))[0]!;
  t.match(
    plan.changes.find((c) => c.kind === "service"),
    { why: [PROXY_DROP_IN] },
    "a new proxy restarts containerd",
  );
  t.notMatch(
    JSON.stringify(plan.changes.map((c) => ({ ...c, content: undefined }))),
    /pr0xy-pass/,
    "its password is in no plan",
  );
  await env.apply(other);
  t.same((await actions(env)).slice(before), [
    "systemctl daemon-reload",
    "systemctl restart containerd-deckhouse.service",
  ]);
  t.equal((await stat(dropIn)).mode & 0o777, 0o600, "credentials: root only");
  await env.apply(bundleStep(baseSpec()));
  t.notOk(existsSync(dropIn), "no proxy any more: the drop-in goes");
});

const containerd2Bin = skip ? undefined : await containerd2((s) => console.error(s));
t.test(
  "containerd 2: configuration version 3 is checked and loads; a major-version change is disruptive",
  { skip: skip || (containerd2Bin ? false : "no Go toolchain to build containerd 2 from its module") },
  async (t) => {
    const bin = containerd2Bin as string;
    const env = await tree(t);
    const step = bundleStep(
      baseSpec({ registries: [{ host: "registry.example.test", scheme: "https", mirrors: [] }] }),
    );
    t.equal((await env.apply(step)).outcome, "changed");
    // The same node gets containerd 2 (a new package digest, a new binary).
    await copyFile(bin, path.join(env.root, PATHS.binDir, "containerd"));
    await writeFile(path.join(env.root, PATHS.packageStore, "containerd/digest"), `sha256:${"b".repeat(64)}\n`);
    const plan = (await env.planRun([step]))[0]!;
    const config = plan.changes.find((c) => c.kind === "file" && c.path === PATHS.containerdConfig);
    t.match(config?.disruptive, /containerd major version 1 → 2/);
    const svc = plan.changes.find((c) => c.kind === "service");
    t.same(
      svc?.kind === "service" && svc.why.sort(),
      [PATHS.containerdConfig, "/etc/systemd/system/containerd-deckhouse.service"].sort(),
      "restarted for the new config and the new binary",
    );
    t.equal((await env.apply(step)).outcome, "changed", "containerd 2 accepted the candidate (config dump)");
    const text = await readFile(path.join(env.root, PATHS.containerdConfig), "utf8");
    t.match(text, /^version = 3$/m);
    t.match(
      text,
      /\[plugins\."io\.containerd\.cri\.v1\.images"\.pinned_images\]\n {6}sandbox = "registry\.example\.test\/pause:3\.10"/,
    );
    const ctd = await startContainerd(path.join(env.root, PATHS.binDir, "containerd"), env.root);
    t.teardown(() => ctd.stop());
    const info = JSON.parse(await ctd.crictl(["info"])) as {
      config: { containerd: { runtimes: { runc: { options: { SystemdCgroup: boolean } } } } };
    };
    t.equal(info.config.containerd.runtimes.runc.options.SystemdCgroup, true, "containerd 2 serves CRI with it");
    t.same((await env.plan(step)).changes, [], "and a second run plans nothing");
  },
);
