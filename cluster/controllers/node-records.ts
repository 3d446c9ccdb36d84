// What the kubelet client approver remembers about node names, in two ConfigMaps of its namespace
// (CONFIGMAPS in bundles/names.ts), written only by it:
//   bashible-node-groups       data[<node>] = the node group the approved bootstrap token was for
//                              ("" for a token of no group). ValidatingAdmissionPolicy
//                              bashible-node-group-on-create reads it: a node registers with a
//                              group label only if it is this one.
//   bashible-node-client-keys  data[<node>] = `<notBefore seconds>:<sha256 of the public key, base64>`
//                              of the newest kubelet client certificate issued for that name
//                              (whoever approved it): a machine re-bootstrapping reuses that key
//                              (the kubelet does), which proves it is the same machine.
// Each is one object, so a write is one compare-and-swap on its resourceVersion. A ConfigMap
// holds at most 1 MiB: about 25,000 names in the first, 12,000 in the second (entries of names
// that no Node has had for an hour are dropped).
import { createHash, createPublicKey } from "node:crypto";
import type { KubeClient } from "../../lib/kube/client.ts";
import { isConflict, isNotFound } from "../../lib/kube/errors.ts";

/** Where a ConfigMap stops: a little under the API server's 1 MiB, so a write never fails on size. */
const MAX_DATA_BYTES = 1000 * 1024;

/** Nothing more fits; the CSR waits and the log says so. */
export class RecordsFullError extends Error {
  override name = "RecordsFullError";
}

interface ConfigMap {
  metadata: { name: string; namespace: string; resourceVersion?: string };
  data?: Record<string, string>;
}

/** One ConfigMap of records: read it, or change it with a compare-and-swap (retried on conflict). */
export class RecordMap {
  private readonly client: KubeClient;
  private readonly namespace: string;
  readonly name: string;

  constructor(client: KubeClient, namespace: string, name: string) {
    this.client = client;
    this.namespace = namespace;
    this.name = name;
  }

  private get path(): string {
    return `/api/v1/namespaces/${this.namespace}/configmaps/${this.name}`;
  }

  private async get(): Promise<ConfigMap | undefined> {
    try {
      return await this.client.request<ConfigMap>("GET", this.path);
    } catch (err) {
      if (isNotFound(err)) return undefined;
      throw err;
    }
  }

  async read(): Promise<Record<string, string>> {
    return (await this.get())?.data ?? {};
  }

  /**
   * Applies `change` to the data (returning false when nothing changed, so nothing is written).
   * Resolves with the data as written; throws RecordsFullError when it would not fit.
   */
  async update(change: (data: Record<string, string>) => boolean): Promise<Record<string, string>> {
    for (let attempt = 0; ; attempt++) {
      const cm = await this.get();
      const data = { ...(cm?.data ?? {}) };
      if (!change(data)) return data;
      if (Buffer.byteLength(JSON.stringify(data)) > MAX_DATA_BYTES) {
        throw new RecordsFullError(
          `ConfigMap ${this.namespace}/${this.name} is full (${MAX_DATA_BYTES} bytes): too many node names recorded`,
        );
      }
      const body = {
        apiVersion: "v1",
        kind: "ConfigMap",
        metadata: {
          name: this.name,
          namespace: this.namespace,
          ...(cm ? { resourceVersion: cm.metadata.resourceVersion } : {}),
        },
        data,
      };
      try {
        if (cm) await this.client.request("PUT", this.path, { body });
        else await this.client.request("POST", `/api/v1/namespaces/${this.namespace}/configmaps`, { body });
        return data;
      } catch (err) {
        // Someone else wrote first (another leader's last write, kubectl apply): read again.
        if (!(isConflict(err) && attempt < 8)) throw err;
      }
    }
  }
}

/** One spelling of a public key (the DER of its SubjectPublicKeyInfo, re-encoded by OpenSSL), hashed. */
export function keyFingerprint(spkiDer: Uint8Array): string {
  const der = createPublicKey({ key: Buffer.from(spkiDer), format: "der", type: "spki" }).export({
    type: "spki",
    format: "der",
  });
  return createHash("sha256").update(der).digest("base64");
}

export interface IssuedKey {
  /** The certificate's notBefore, seconds since the epoch: the newest one wins. */
  issuedAt: number;
  fingerprint: string;
}

export const formatIssuedKey = (k: IssuedKey) => `${k.issuedAt}:${k.fingerprint}`;

export function parseIssuedKey(v: string | undefined): IssuedKey | undefined {
  const m = v === undefined ? null : /^(\d+):([A-Za-z0-9+/=]+)$/.exec(v);
  return m ? { issuedAt: Number(m[1]), fingerprint: m[2]! } : undefined;
}
