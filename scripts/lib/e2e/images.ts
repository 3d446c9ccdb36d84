// Container images for the end-to-end node, built here from Debian's static busybox (no
// registry on the node's side of the veth: images are imported into containerd, as an operator
// of an air-gapped node would). Two images:
//   - the workload: busybox with its applets, running what the pod says;
//   - the sandbox ("pause") image the bundle names: busybox sleeping, as PID 1 of every pod.
// Each is an OCI image archive (oci-layout, index.json, blobs) that `ctr images import` reads; the
// index entry names the image (`io.containerd.image.name`), so no --base-name is needed.
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { cp, mkdir, mkdtemp, rename, rm, symlink, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { debian } from "../../package.ts";

export const PAUSE_IMAGE = "e2e.bashible.test/pause:e2e";
export const BUSYBOX_IMAGE = "e2e.bashible.test/busybox:e2e";

const sha256 = (b: Buffer) => createHash("sha256").update(b).digest("hex");

export interface ImageArchive {
  name: string;
  file: string;
}

/** Static busybox from Debian (downloaded once into the test cache). */
async function busybox(): Promise<string> {
  const { root } = await debian("busybox-static");
  const bin = path.join(root, "bin/busybox");
  if (!existsSync(bin)) throw new Error(`busybox-static has no bin/busybox under ${root}`);
  return bin;
}

async function imageArchive(
  out: string,
  name: string,
  config: { Entrypoint?: string[]; Cmd?: string[] },
): Promise<ImageArchive> {
  const bin = await busybox();
  const work = await mkdtemp(path.join(os.tmpdir(), "bashible-e2e-image-"));
  try {
    const rootfs = path.join(work, "rootfs");
    await mkdir(path.join(rootfs, "bin"), { recursive: true });
    await cp(bin, path.join(rootfs, "bin/busybox"));
    const applets = execFileSync(bin, ["--list"], { encoding: "utf8" }).split("\n").filter(Boolean);
    for (const a of applets) if (a !== "busybox") await symlink("busybox", path.join(rootfs, "bin", a));
    for (const d of ["etc", "tmp", "proc", "sys", "dev", "root"]) await mkdir(path.join(rootfs, d));
    await writeFile(path.join(rootfs, "etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n");
    await writeFile(path.join(rootfs, "etc/group"), "root:x:0:\n");
    const layer = execFileSync(
      "tar",
      ["--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner", "-C", rootfs, "-cf", "-", "."],
      { maxBuffer: 64 << 20 },
    );
    const layout = path.join(work, "layout");
    const blobs = path.join(layout, "blobs/sha256");
    await mkdir(blobs, { recursive: true });
    const blob = async (b: Buffer) => {
      const hex = sha256(b);
      await writeFile(path.join(blobs, hex), b);
      return { digest: `sha256:${hex}`, size: b.length };
    };
    const l = await blob(layer);
    const cfg = await blob(
      Buffer.from(
        JSON.stringify({
          architecture: "amd64",
          os: "linux",
          config: { Env: ["PATH=/bin"], WorkingDir: "/", ...config },
          rootfs: { type: "layers", diff_ids: [l.digest] },
        }),
      ),
    );
    const manifest = await blob(
      Buffer.from(
        JSON.stringify({
          schemaVersion: 2,
          mediaType: "application/vnd.oci.image.manifest.v1+json",
          config: { mediaType: "application/vnd.oci.image.config.v1+json", ...cfg },
          layers: [{ mediaType: "application/vnd.oci.image.layer.v1.tar", ...l }],
        }),
      ),
    );
    await writeFile(path.join(layout, "oci-layout"), JSON.stringify({ imageLayoutVersion: "1.0.0" }));
    await writeFile(
      path.join(layout, "index.json"),
      JSON.stringify({
        schemaVersion: 2,
        manifests: [
          {
            mediaType: "application/vnd.oci.image.manifest.v1+json",
            ...manifest,
            annotations: { "io.containerd.image.name": name, "org.opencontainers.image.ref.name": "e2e" },
          },
        ],
      }),
    );
    await mkdir(out, { recursive: true });
    const file = path.join(out, `${name.replace(/[^A-Za-z0-9]+/g, "-")}.tar`);
    execFileSync("tar", ["-C", layout, "-cf", `${file}.tmp`, "."]);
    await rename(`${file}.tmp`, file);
    return { name, file };
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}

/** Both images as archives in `out`. */
export async function buildImages(out: string): Promise<{ pause: ImageArchive; busybox: ImageArchive }> {
  return {
    // PID 1 of a pod sandbox: it only has to stay alive; containerd stops it with SIGKILL.
    pause: await imageArchive(out, PAUSE_IMAGE, { Entrypoint: ["/bin/sleep", "2147483647"] }),
    busybox: await imageArchive(out, BUSYBOX_IMAGE, { Cmd: ["/bin/sh"] }),
  };
}
