// npm run image: the cluster side's container image (`bashible server`, the controllers, the
// registry-packages proxy: cluster/deploy/deployment.yaml runs it) as an OCI image layout,
// without Docker.
//
//   npx node scripts/image.ts [--out DIR] [--dist DIR]     default: dist-image/, from dist/
//
// The image is the agent build (dist/ from `npm run build`, built first when absent: the
// server is one of its commands) under /opt/bashible, and the C libraries its Node runtime links
// against, from Debian's own packages (libc6, libgcc-s1, libstdc++6, fetched with apt-get
// download, nothing installed). No shell, no package manager: the entrypoint is the runtime
// itself with the launcher's flags. It runs as uid 64535, as the Deployment does, and needs
// nothing writable. `npm run push -- --image REGISTRY/PATH` pushes it; the end-to-end scenario
// runs this image in containerd (scripts/lib/e2e/cluster.ts), as a cluster does.
import { existsSync } from "node:fs";
import { chmod, cp, mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { RUNTIME_FLAGS } from "./build.ts";
import { debian, tagOf } from "./package.ts";
import { type WrittenLayout, writeImageLayout } from "./lib/oci-layout.ts";

const REPO = path.resolve(import.meta.dirname, "..");
export const IMAGE_NAME = "bashible-server";
/** Where the agent build sits in the image. */
export const IMAGE_APP = "/opt/bashible";
/** The user the image runs as: the Deployment's runAsUser. */
export const IMAGE_UID = 64535;
/** What the runtime links against (readelf -d dist/bashible.d/node: libc, libm, libdl, libpthread, libgcc_s, libstdc++). */
const LIBRARY_PACKAGES = ["libc6", "libgcc-s1", "libstdc++6"];

/** Copies a Debian package's shared libraries (lib/, lib64/, usr/lib/; no gconv modules) into tree. */
async function copyLibraries(pkg: string, tree: string): Promise<string> {
  const { root, version } = await debian(pkg);
  for (const dir of ["lib", "lib64", "usr/lib"]) {
    if (!existsSync(path.join(root, dir))) continue;
    await cp(path.join(root, dir), path.join(tree, dir), {
      recursive: true,
      verbatimSymlinks: true,
      filter: (src) => !src.includes("/gconv"),
    });
  }
  // The licences travel with the libraries.
  const copyright = path.join(root, "usr/share/doc", pkg, "copyright");
  if (existsSync(copyright)) {
    await mkdir(path.join(tree, "usr/share/doc", pkg), { recursive: true });
    await cp(copyright, path.join(tree, "usr/share/doc", pkg, "copyright"));
  }
  return `${pkg} ${version}`;
}

export interface BuiltImage extends WrittenLayout {
  name: string;
  version: string;
  /** The Debian packages the libraries came from, with versions. */
  libraries: string[];
  entrypoint: string[];
}

/** Builds the image layout into `out` (default dist-image/) from the build in `dist`. */
export async function buildImage(o: { out?: string; dist?: string } = {}): Promise<BuiltImage> {
  const out = o.out ?? path.join(REPO, "dist-image");
  const dist = o.dist ?? path.join(REPO, "dist");
  if (!existsSync(path.join(dist, "bashible.d/app/main.mjs"))) {
    const { buildDist } = await import("./build.ts");
    await buildDist(dist);
  }
  const version = (JSON.parse(await readFile(path.join(REPO, "package.json"), "utf8")) as { version: string }).version;
  const tree = await mkdtemp(path.join(os.tmpdir(), "bashible-image-"));
  try {
    await cp(dist, path.join(tree, IMAGE_APP.slice(1)), { recursive: true, verbatimSymlinks: true });
    const libraries: string[] = [];
    for (const pkg of LIBRARY_PACKAGES) libraries.push(await copyLibraries(pkg, tree));
    await mkdir(path.join(tree, "etc"));
    await writeFile(
      path.join(tree, "etc/passwd"),
      `root:x:0:0:root:/:/sbin/nologin\n${IMAGE_NAME}:x:${IMAGE_UID}:${IMAGE_UID}::/:/sbin/nologin\n`,
    );
    await writeFile(path.join(tree, "etc/group"), `root:x:0:\n${IMAGE_NAME}:x:${IMAGE_UID}:\n`);
    // glibc without this file asks DNS before /etc/hosts; Kubernetes writes /etc/hosts for pods.
    await writeFile(path.join(tree, "etc/nsswitch.conf"), "passwd: files\ngroup: files\nhosts: files dns\n");
    await mkdir(path.join(tree, "tmp"));
    await chmod(path.join(tree, "tmp"), 0o1777);
    const entrypoint = [`${IMAGE_APP}/bashible.d/node`, ...RUNTIME_FLAGS, `${IMAGE_APP}/bashible.d/app/main.mjs`];
    const labels = {
      "org.opencontainers.image.title": IMAGE_NAME,
      "org.opencontainers.image.version": version,
      "org.opencontainers.image.description": "bashible's cluster side: bashible server, controllers, packages-proxy",
    };
    const image = await writeImageLayout({
      tree,
      dir: out,
      tag: tagOf(version),
      config: {
        architecture: "amd64",
        os: "linux",
        config: {
          User: `${IMAGE_UID}:${IMAGE_UID}`,
          Entrypoint: entrypoint,
          Cmd: ["--help"],
          WorkingDir: "/",
          Labels: labels,
        },
      },
      annotations: labels,
    });
    return { ...image, name: IMAGE_NAME, version, libraries, entrypoint };
  } finally {
    await rm(tree, { recursive: true, force: true });
  }
}

if (import.meta.main) {
  const args = process.argv.slice(2);
  const opt = (name: string) => {
    const i = args.indexOf(name);
    return i >= 0 ? path.resolve(args[i + 1] ?? ".") : undefined;
  };
  try {
    const out = opt("--out");
    const dist = opt("--dist");
    const started = Date.now();
    const img = await buildImage({ ...(out ? { out } : {}), ...(dist ? { dist } : {}) });
    console.log(
      `image ${img.name}:${img.tag} ${img.digest} (${(img.size / 1e6).toFixed(1)} MB compressed, ${((Date.now() - started) / 1000).toFixed(1)} s) in ${img.dir}`,
    );
    console.log(`  libraries from Debian: ${img.libraries.join(", ")}`);
    console.log(`  push it: npm run push -- --image REGISTRY/PATH (cluster/deploy/deployment.yaml names the result)`);
  } catch (err) {
    console.error(`image: ${(err as Error).message}`);
    process.exit(1);
  }
}
