// This node's kubelet serving certificate, what its peer endpoint answers with: the kubelet
// (serverTLSBootstrap) keeps it, certificate and key in one PEM file, under
// /var/lib/kubelet/pki/kubelet-server-current.pem once the cluster's serving approver has
// approved it, and renews it before it expires (a new file, the link moved). Read again when
// the file changes, looked at once a minute (a rotation leaves the old one valid for days).
import { X509Certificate } from "node:crypto";
import { readFile, stat } from "node:fs/promises";
import path from "node:path";
import type { Logger } from "../../lib/log/log.ts";
import type { Clock } from "./clock.ts";
import { nodeOfSubject } from "./peer-identity.ts";

export const KUBELET_SERVING_PEM = "/var/lib/kubelet/pki/kubelet-server-current.pem";

/** How often a certificate already loaded is looked at again. */
const RECHECK_MS = 60_000;

export interface ServingTls {
  /** The certificate (and any chain after it), PEM. */
  cert: Buffer;
  key: Buffer;
}

const CERTS = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----\s*/g;
const KEY = /-----BEGIN ([A-Z ]*)PRIVATE KEY-----[\s\S]+?-----END \1PRIVATE KEY-----\s*/;

/** Splits the kubelet's PEM file into the certificate chain and the key; undefined parts are missing. */
export function splitKubeletPem(text: string): { cert?: string; key?: string } {
  const certs = text.match(CERTS)?.join("");
  const key = KEY.exec(text)?.[0];
  return { ...(certs ? { cert: certs } : {}), ...(key ? { key } : {}) };
}

export class ServingCertificate {
  readonly file: string;
  private readonly nodeName: string;
  private readonly log: Logger;
  private readonly now: Clock;
  private loaded: { tls: ServingTls; version: string } | undefined;
  private checkedAt = Number.NEGATIVE_INFINITY;
  /** The last problem logged, so a missing file is one line, not one per round. */
  private reported: string | undefined;

  constructor(o: { root: string; nodeName: string; log: Logger; now: Clock; file?: string }) {
    this.file = path.join(o.root, o.file ?? KUBELET_SERVING_PEM);
    this.nodeName = o.nodeName;
    this.log = o.log;
    this.now = o.now;
  }

  /** The current certificate, or undefined (and one warning) while there is none to use. */
  async current(): Promise<ServingTls | undefined> {
    const now = this.now();
    if (this.loaded && now - this.checkedAt < RECHECK_MS) return this.loaded.tls;
    this.checkedAt = now;
    try {
      const st = await stat(this.file);
      const version = `${st.dev}:${st.ino}:${st.size}:${st.mtimeMs}`;
      if (this.loaded?.version === version) return this.loaded.tls;
      const { cert, key } = splitKubeletPem(await readFile(this.file, "utf8"));
      if (!cert || !key) return this.problem(`${this.file} holds no certificate and key`);
      const leaf = new X509Certificate(cert);
      const node = nodeOfSubject(leaf);
      if (node !== this.nodeName)
        return this.problem(`${this.file} is a certificate of ${leaf.subject.replace(/\n/g, ",")}, not of this node`);
      this.loaded = { tls: { cert: Buffer.from(cert), key: Buffer.from(key) }, version };
      if (this.reported !== undefined) this.log.info({ file: this.file }, "kubelet serving certificate found");
      this.reported = undefined;
      return this.loaded.tls;
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      return this.problem(
        code === "ENOENT"
          ? `no kubelet serving certificate at ${this.file} yet (the kubelet asks for one with serverTLSBootstrap; the cluster's serving approver approves it)`
          : `cannot read ${this.file}: ${(err as Error).message}`,
      );
    }
  }

  private problem(msg: string): ServingTls | undefined {
    // A certificate loaded before stays in use until a good one replaces it.
    if (this.reported !== msg)
      this.log.warn(
        msg +
          (this.loaded
            ? "; the peer endpoint keeps the previous certificate"
            : "; the peer endpoint does not listen, so the group's other nodes cannot count this one"),
      );
    this.reported = msg;
    return this.loaded?.tls;
  }
}
