// CACertificates (003_install_ca_certificates): the bundle's CA certificates are in the OS trust
// store, and the ones this agent added earlier (recognised by the file name prefix) that the
// bundle no longer lists are gone. Where the store lives and how it is refreshed is
// per-family data (TRUST_STORES); the refresh command planned is exactly the one applied.
import { X509Certificate } from "node:crypto";
import type { BundleFamily } from "../bundles/os-families.ts";
import type { Host } from "../host/host.ts";
import { planAbsent, planFile } from "../host/file-plan.ts";
import { RefusedError } from "../lib/errors.ts";
import type { CommandChange, Primitive, Problem, Step } from "./types.ts";

/** File name prefix of every certificate this step owns; nothing else is ever removed. */
export const PREFIX = "bashible-";

export interface TrustStore {
  /** Directory the refresh command reads local anchors from. */
  anchors: string;
  /** The refresh command on a real root. */
  refresh: string[];
  /** Directories the refresh writes into (made when missing, e.g. in a fresh sandbox tree). */
  outputs?: string[];
  /** A file the refresh leaves per installed anchor, to notice an interrupted refresh. */
  installedMark?: (file: string) => string;
}

export const TRUST_STORES: Record<BundleFamily, TrustStore> = {
  // debian, ubuntu, astra: ca-certificates
  debian: {
    anchors: "/usr/local/share/ca-certificates",
    refresh: ["update-ca-certificates"],
    outputs: ["/etc/ssl/certs"],
    installedMark: (file) => `/etc/ssl/certs/${file.replace(/\.crt$/, ".pem")}`,
  },
  // centos, rocky, alma, rhel, redos: ca-certificates (p11-kit)
  rhel: { anchors: "/etc/pki/ca-trust/source/anchors", refresh: ["update-ca-trust", "extract"] },
  // ALT Linux: ca-trust
  altlinux: { anchors: "/etc/pki/ca-trust/source/anchors", refresh: ["update-ca-trust"] },
};

/** A certificate that is not one; the message says which and why. */
export class InvalidCertificateError extends RefusedError {
  override name = "InvalidCertificateError";
}

const BLOCKS = /-----BEGIN CERTIFICATE-----[\s\S]*?-----END CERTIFICATE-----/g;

/** Checks every PEM block parses as an X.509 certificate; returns the normalised PEM text. */
export function validateCertificate(name: string, pem: string): string {
  const blocks = pem.match(BLOCKS) ?? [];
  if (blocks.length === 0) {
    throw new InvalidCertificateError(
      `CACertificates: certificate '${name}' is not PEM: no '-----BEGIN CERTIFICATE-----' block found`,
    );
  }
  for (const [i, block] of blocks.entries()) {
    try {
      // Parses or throws. A self-signed leaf (CA:FALSE) is accepted: people pin registry certs so.
      new X509Certificate(block);
    } catch (err) {
      throw new InvalidCertificateError(
        `CACertificates: certificate '${name}'${blocks.length > 1 ? ` (block ${i + 1})` : ""} is not a valid X.509 certificate: ${(err as Error).message}`,
      );
    }
  }
  return `${blocks.join("\n")}\n`;
}

/** One line per certificate: subject, expiry, SHA-256 fingerprint (for plans). */
export function describeCertificates(pem: string): string {
  const blocks = pem.match(BLOCKS) ?? [];
  if (blocks.length === 0) return "(no certificate)";
  return blocks
    .map((b) => {
      try {
        const x = new X509Certificate(b);
        const fp = x.fingerprint256.replace(/:/g, "").toLowerCase().slice(0, 16);
        return `${x.subject.replace(/\n/g, ", ")} (expires ${new Date(x.validTo).toISOString().slice(0, 10)}, sha256 ${fp}…)`;
      } catch {
        return "(unparseable certificate)";
      }
    })
    .join("\n");
}

/** The refresh argv for this host: against a sandbox tree where the tool supports it; undefined when it cannot. */
export function refreshArgv(host: Host): string[] | undefined {
  const store = TRUST_STORES[host.os.family];
  if (!host.sandbox) return store.refresh;
  if (host.os.family === "debian") {
    return [
      "update-ca-certificates",
      "--certsconf",
      host.path("/etc/ca-certificates.conf"),
      "--certsdir",
      host.path("/usr/share/ca-certificates"),
      "--localcertsdir",
      host.path("/usr/local/share/ca-certificates"),
      "--etccertsdir",
      host.path("/etc/ssl/certs"),
      "--hooksdir",
      host.path("/etc/ca-certificates/update.d"),
    ];
  }
  // update-ca-trust has no root option: in a sandbox the refresh is recorded, not run.
  return undefined;
}

const step: Step<"CACertificates"> = {
  kind: "CACertificates",
  async plan(spec, host) {
    const store = TRUST_STORES[host.os.family];
    const changes: Primitive[] = [];
    const problems: Problem[] = [];
    const wanted = new Set<string>();
    let stale = false;
    for (const c of spec.certificates) {
      const file = `${PREFIX}${c.name}.crt`;
      wanted.add(file);
      let content: string;
      try {
        content = validateCertificate(c.name, c.pem);
      } catch (err) {
        // One bad certificate must not keep the others out of the trust store.
        problems.push({ subject: `certificate ${c.name}`, message: (err as Error).message });
        continue;
      }
      const change = await planFile(host, { path: `${store.anchors}/${file}`, content, mode: 0o644 });
      if (change) {
        // A base64 diff tells a reader nothing: say which certificates, before and after.
        if (change.diff && !change.diff.startsWith("(")) {
          const before =
            change.action === "update" ? describeCertificates((await host.readText(change.path)) ?? "") : "";
          change.diff = `${before ? `- ${before.split("\n").join("\n- ")}\n` : ""}+ ${describeCertificates(content).split("\n").join("\n+ ")}`;
        }
        changes.push(change);
      } else if (store.installedMark && !(await host.exists(store.installedMark(file)))) stale = true;
    }
    for (const name of await host.listDir(store.anchors)) {
      if (!name.startsWith(PREFIX) || wanted.has(name)) continue;
      const gone = await planAbsent(host, `${store.anchors}/${name}`);
      if (gone) changes.push({ ...gone, summary: `remove CA certificate ${name} (no longer in the bundle)` });
    }
    if (changes.length > 0 || stale) {
      const why = stale ? " (an earlier refresh did not finish)" : "";
      const argv = refreshArgv(host);
      for (const dir of store.outputs ?? []) {
        if (!(await host.exists(dir))) {
          changes.push({
            kind: "dir",
            path: dir,
            action: "create",
            mode: 0o755,
            uid: 0,
            gid: 0,
            summary: `create ${dir}`,
          });
        }
      }
      const refresh: CommandChange = {
        kind: "command",
        // update-ca-trust has no root option: in a sandbox tree the refresh is recorded.
        argv: argv ?? store.refresh,
        ...(argv ? {} : { recordInSandbox: true }),
        summary: `refresh the trust store: ${store.refresh.join(" ")}${why}`,
      };
      changes.push(refresh);
    }
    return { changes, problems };
  },
};

export default step;
