// Where bundles come from: the aggregated API (through the node's API proxy, falling back to
// the API servers the last bundle named) or, in local mode, a file. Sources return raw bytes;
// acceptBundle() decides whether they are a bundle.
import { open, readdir, stat } from "node:fs/promises";
import path from "node:path";
import { createHash } from "node:crypto";
import type { KubeClient } from "../../lib/kube/client.ts";
import { KubeError, KubeStatusError, ResponseTooLargeError } from "../../lib/kube/errors.ts";
import { API_VERSION } from "../../bundles/types.ts";
import { BundleRejectedError, MAX_BUNDLE_BYTES } from "../../bundles/verify.ts";

export type Fetched = { raw: Buffer; etag?: string; via?: KubeClient } | { notModified: true; via?: KubeClient };

export interface BundleSource {
  readonly description: string;
  fetch(etag?: string): Promise<Fetched>;
}

export const bundlePath = (group: string) => `/apis/${API_VERSION}/nodegroupbundles/${encodeURIComponent(group)}`;

export class FileBundleSource implements BundleSource {
  readonly description: string;
  private readonly file: string;
  constructor(file: string) {
    this.file = file;
    this.description = `file ${file}`;
  }
  async fetch(etag?: string): Promise<Fetched> {
    const raw = await readLimited(this.file, MAX_BUNDLE_BYTES);
    const tag = createHash("sha256").update(raw).digest("hex");
    return tag === etag ? { notModified: true } : { raw, etag: tag };
  }
}

/**
 * Reads at most `limit` bytes; a longer file is a rejected bundle without being read whole.
 * The buffer is sized by the file (its size at open, plus one byte to notice that it grew), never
 * by the limit: the daemon reads the file every tick, and an 8 MiB zero-filled buffer per tick
 * stays in the process as glibc heap (RSS grew 8 MB a minute). A file that grows while it is
 * read, or reports no size (a pipe, /dev/zero), is read in growing steps up to `limit` + 1.
 */
async function readLimited(file: string, limit: number): Promise<Buffer> {
  const fh = await open(file, "r");
  try {
    const { size } = await fh.stat();
    if (size > limit) throw new BundleRejectedError(`file ${file}`, `larger than the ${limit}-byte limit`);
    let buf = Buffer.alloc(size + 1);
    let n = 0;
    for (;;) {
      if (n === buf.length) {
        if (n > limit) throw new BundleRejectedError(`file ${file}`, `larger than the ${limit}-byte limit`);
        const bigger = Buffer.alloc(Math.min(limit + 1, Math.max(64 * 1024, n * 2)));
        buf.copy(bigger, 0, 0, n);
        buf = bigger;
      }
      const { bytesRead } = await fh.read(buf, n, buf.length - n, null);
      if (bytesRead === 0) break;
      n += bytesRead;
    }
    return buf.subarray(0, n);
  } finally {
    await fh.close();
  }
}

/** `--bundle DIR`: DIR/<group>.json, or the only *.json in DIR. */
export async function resolveBundleFile(p: string, group?: string): Promise<string> {
  const s = await stat(p).catch(() => undefined);
  if (!s) throw new Error(`--bundle ${p}: no such file or directory`);
  if (s.isFile()) return p;
  if (group) return path.join(p, `${group}.json`);
  const json = (await readdir(p)).filter((f) => f.endsWith(".json"));
  if (json.length !== 1) {
    throw new Error(`--bundle ${p}: ${json.length} bundles in the directory; say which with --node-group`);
  }
  return path.join(p, json[0] as string);
}

/** Transport failures move on to the next endpoint; an answer with a status does not. */
const transport = (e: unknown) => e instanceof KubeError && !(e instanceof KubeStatusError);

export class ApiBundleSource implements BundleSource {
  readonly description: string;
  private readonly clients: KubeClient[];
  private readonly group: string;
  constructor(clients: KubeClient[], group: string) {
    this.clients = clients;
    this.group = group;
    this.description = `${clients.map((c) => c.connection.server).join(", ")} nodegroupbundles/${group}`;
  }
  async fetch(etag?: string): Promise<Fetched> {
    const errors: string[] = [];
    for (const via of this.clients) {
      try {
        let res: Awaited<ReturnType<KubeClient["raw"]>>;
        try {
          res = await via.raw("GET", bundlePath(this.group), {
            headers: etag ? { "If-None-Match": `"${etag}"` } : {},
            maxBytes: MAX_BUNDLE_BYTES,
          });
        } catch (err) {
          if (err instanceof ResponseTooLargeError) {
            throw new BundleRejectedError(
              `nodegroupbundles/${this.group}`,
              `larger than the ${MAX_BUNDLE_BYTES}-byte limit`,
            );
          }
          throw err;
        }
        if (res.status === 304) return { notModified: true, via };
        if (res.status !== 200) {
          let message = res.body.toString("utf8").slice(0, 300);
          try {
            message = (JSON.parse(message) as { message?: string }).message ?? message;
          } catch {
            // keep the raw text
          }
          throw new KubeStatusError(
            res.status,
            "",
            `GET nodegroupbundles/${this.group}: ${res.status}: ${message}`,
            via.url(bundlePath(this.group)),
          );
        }
        const tag =
          String(res.headers.etag ?? "")
            .replace(/^W\//, "")
            .replace(/"/g, "") || undefined;
        return { raw: res.body, etag: tag, via };
      } catch (err) {
        if (!transport(err)) throw err;
        errors.push((err as KubeError).message);
      }
    }
    throw new Error(`no API endpoint answered: ${errors.join("; ")}`);
  }
}
