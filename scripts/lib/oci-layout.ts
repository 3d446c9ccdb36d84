// OCI image layouts (https://github.com/opencontainers/image-spec/blob/main/image-layout.md),
// written without Docker: one gzipped tar layer of a directory, an image config, a manifest and
// an index naming it by tag. `npm run package` writes each registry package this way,
// `npm run image` the server's image, and scripts/push.ts pushes any of them.
//
// Layers are reproducible: names sorted, times and owners zeroed, a gzip header without a
// time, so the same tree gives the same digests.
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { createWriteStream } from "node:fs";
import { mkdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import { createGzip } from "node:zlib";

export const MEDIA = {
  index: "application/vnd.oci.image.index.v1+json",
  manifest: "application/vnd.oci.image.manifest.v1+json",
  config: "application/vnd.oci.image.config.v1+json",
  layer: "application/vnd.oci.image.layer.v1.tar+gzip",
} as const;

const REF_NAME = "org.opencontainers.image.ref.name";
const sha256hex = (b: Buffer | string) => createHash("sha256").update(b).digest("hex");

export interface WrittenLayout {
  dir: string;
  tag: string;
  /** The manifest's digest: what a registry and a bundle name the image by. */
  digest: string;
  /** The (one) layer's digest and compressed size. */
  layer: string;
  size: number;
}

/**
 * Writes `tree` as a one-layer image into the layout directory `dir` (replaced). `config` is
 * the image config without `rootfs`, which is filled in from the layer.
 */
export async function writeImageLayout(o: {
  tree: string;
  dir: string;
  tag: string;
  config: Record<string, unknown>;
  annotations?: Record<string, string>;
}): Promise<WrittenLayout> {
  await rm(o.dir, { recursive: true, force: true });
  const blobs = path.join(o.dir, "blobs/sha256");
  await mkdir(blobs, { recursive: true });
  const tar = spawn(
    "tar",
    [
      "--sort=name",
      "--mtime=@0",
      "--owner=0",
      "--group=0",
      "--numeric-owner",
      "--format=gnu",
      "-C",
      o.tree,
      "-cf",
      "-",
      ".",
    ],
    { stdio: ["ignore", "pipe", "inherit"] },
  );
  const diffHash = createHash("sha256");
  const layerHash = createHash("sha256");
  let size = 0;
  const tmpLayer = path.join(blobs, ".layer.tmp");
  const tee = (hash: ReturnType<typeof createHash>, count = false) =>
    new Transform({
      transform(chunk: Buffer, _enc, cb) {
        hash.update(chunk);
        if (count) size += chunk.length;
        cb(null, chunk);
      },
    });
  const tarDone = new Promise<number>((r) => tar.once("close", (code) => r(code ?? 1)));
  await pipeline(
    tar.stdout,
    tee(diffHash),
    createGzip({ level: 6 }),
    tee(layerHash, true),
    createWriteStream(tmpLayer),
  );
  if ((await tarDone) !== 0) throw new Error(`${o.tree}: tar failed`);
  const layerHex = layerHash.digest("hex");
  await rename(tmpLayer, path.join(blobs, layerHex));

  const config = Buffer.from(
    JSON.stringify({ ...o.config, rootfs: { type: "layers", diff_ids: [`sha256:${diffHash.digest("hex")}`] } }),
  );
  const configHex = sha256hex(config);
  await writeFile(path.join(blobs, configHex), config);
  const manifest = Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: MEDIA.manifest,
      config: { mediaType: MEDIA.config, digest: `sha256:${configHex}`, size: config.length },
      layers: [{ mediaType: MEDIA.layer, digest: `sha256:${layerHex}`, size }],
      ...(o.annotations ? { annotations: o.annotations } : {}),
    }),
  );
  const manifestHex = sha256hex(manifest);
  await writeFile(path.join(blobs, manifestHex), manifest);
  await writeFile(path.join(o.dir, "oci-layout"), JSON.stringify({ imageLayoutVersion: "1.0.0" }));
  await writeFile(
    path.join(o.dir, "index.json"),
    JSON.stringify({
      schemaVersion: 2,
      mediaType: MEDIA.index,
      manifests: [
        {
          mediaType: MEDIA.manifest,
          digest: `sha256:${manifestHex}`,
          size: manifest.length,
          annotations: { [REF_NAME]: o.tag },
        },
      ],
    }),
  );
  return { dir: o.dir, tag: o.tag, digest: `sha256:${manifestHex}`, layer: `sha256:${layerHex}`, size };
}

export interface LayoutImage {
  dir: string;
  /** The index's tag for it (org.opencontainers.image.ref.name), if any. */
  tag: string | undefined;
  manifest: { digest: string; mediaType: string; bytes: Buffer };
  /** Config first, then the layers: every blob the manifest names. */
  blobs: { digest: string; size: number }[];
  /** The last layer's digest (a registry package's payload). */
  layer: string;
  /** A blob's bytes, checked against its digest. */
  blob(digest: string): Promise<Buffer>;
}

/** Reads the first image of a layout, checking the manifest against its digest. */
export async function readImageLayout(dir: string): Promise<LayoutImage> {
  const index = JSON.parse(
    await readFile(path.join(dir, "index.json"), "utf8").catch((err: Error) => {
      throw new Error(`${dir} is not an OCI image layout (no index.json: ${err.message})`);
    }),
  ) as { manifests?: { digest: string; mediaType: string; annotations?: Record<string, string> }[] };
  const entry = index.manifests?.[0];
  if (!entry) throw new Error(`${dir}: index.json names no manifest`);
  const blob = async (digest: string) => {
    const bytes = await readFile(path.join(dir, "blobs/sha256", digest.replace(/^sha256:/, "")));
    if (`sha256:${sha256hex(bytes)}` !== digest) throw new Error(`${dir}: blob ${digest} does not match its digest`);
    return bytes;
  };
  const bytes = await blob(entry.digest);
  const m = JSON.parse(bytes.toString()) as {
    config: { digest: string; size: number };
    layers: { digest: string; size: number }[];
  };
  const last = m.layers[m.layers.length - 1];
  if (!last) throw new Error(`${dir}: the image has no layer`);
  return {
    dir,
    tag: entry.annotations?.[REF_NAME],
    manifest: { digest: entry.digest, mediaType: entry.mediaType, bytes },
    blobs: [m.config, ...m.layers].map((b) => ({ digest: b.digest, size: b.size })),
    layer: last.digest,
    blob,
  };
}
