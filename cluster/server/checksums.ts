// Secret d8-cloud-instance-manager/configuration-checksums: data[<group>] = the group's bundle
// checksum (sha256 hex). Controllers compare nodes' annotations with it. Written as
// compare-and-swap with retries, because other writers (a second replica) may race.
import type { KubeClient } from "../../lib/kube/client.ts";
import { createSecret, getSecret, updateSecret, type KubeObject } from "../../lib/kube/api.ts";
import { isConflict, isNotFound } from "../../lib/kube/errors.ts";
import { NAMESPACE, SECRETS } from "../../bundles/names.ts";

const CHECKSUMS_SECRET = SECRETS.checksums;

const b64 = (s: string) => Buffer.from(s, "utf8").toString("base64");

/** Makes data equal `checksums` (groups missing from it are removed). Returns whether it wrote. */
export async function writeChecksums(
  client: KubeClient,
  checksums: ReadonlyMap<string, string>,
  opts: { attempts?: number; namespace?: string; onSecret?: (secret: KubeObject) => void } = {},
): Promise<boolean> {
  const namespace = opts.namespace ?? NAMESPACE;
  const data = Object.fromEntries([...checksums].sort(([a], [b]) => (a < b ? -1 : 1)).map(([g, c]) => [g, b64(c)]));
  const attempts = opts.attempts ?? 8;
  for (let i = 1; ; i++) {
    try {
      let current: KubeObject | undefined;
      try {
        current = await getSecret(client, namespace, CHECKSUMS_SECRET);
      } catch (err) {
        if (!isNotFound(err)) throw err;
      }
      if (!current) {
        const created = await createSecret(client, {
          apiVersion: "v1",
          kind: "Secret",
          type: "Opaque",
          metadata: { name: CHECKSUMS_SECRET, namespace, labels: { app: "bashible-apiserver" } },
          data,
        });
        opts.onSecret?.(created);
        return true;
      }
      const existing = (current.data as Record<string, string> | undefined) ?? {};
      const same =
        Object.keys(existing).length === Object.keys(data).length &&
        Object.entries(data).every(([k, v]) => existing[k] === v);
      if (same) {
        opts.onSecret?.(current);
        return false;
      }
      opts.onSecret?.(await updateSecret(client, { ...current, data }));
      return true;
    } catch (err) {
      // 409: someone wrote between our read and write (or created it first): read again.
      const raced = isConflict(err) || (err as { reason?: string }).reason === "AlreadyExists";
      if (!raced || i >= attempts) throw err;
      await new Promise((r) => setTimeout(r, 20 * i + Math.random() * 50));
    }
  }
}
