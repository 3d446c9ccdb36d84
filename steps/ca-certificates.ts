// CACertificates: the bundle's CA certificates are in the OS trust store, and the ones this
// agent added earlier (recognised by the file name prefix) that the bundle no longer lists are
// gone. Where the store lives and how it is refreshed is per-family data (TRUST_STORES).
import { X509Certificate } from "node:crypto";
import type { BundleFamily } from "../bundles/os-families.ts";
import type { CACertificatesSpec } from "../bundles/types.ts";
import type { Host } from "../agent/host/host.ts";
import { applyFileChange, planAbsent, planFile } from "../agent/host/file-plan.ts";
import type { Change, CommandChange, FileChange, Step } from "./types.ts";

/** File name prefix of every certificate this step owns; nothing else is ever removed. */
export const PREFIX = "bashible-";

export interface TrustStore {
  /** Directory the refresh command reads local anchors from. */
  anchors: string;
  /** The refresh command (node paths; made root-aware by `refreshArgv`). */
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

const NAME_RE = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;

/** A certificate that is not one; the message says which and why. */
export class InvalidCertificateError extends Error {
  override name = "InvalidCertificateError";
}

/** Checks every PEM block parses as an X.509 certificate; returns the normalised PEM text. */
export function validateCertificate(name: string, pem: string): string {
  const blocks = pem.match(/-----BEGIN CERTIFICATE-----[\s\S]*?-----END CERTIFICATE-----/g) ?? [];
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
  const blocks = pem.match(/-----BEGIN CERTIFICATE-----[\s\S]*?-----END CERTIFICATE-----/g) ?? [];
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

/** The refresh argv for this host: against a sandbox tree where the tool supports it. */
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

async function plan(spec: CACertificatesSpec, host: Host): Promise<Change[]> {
  const store = TRUST_STORES[host.os.family];
  const changes: Change[] = [];
  const wanted = new Set<string>();
  let stale = false;
  for (const c of spec.certificates) {
    if (!NAME_RE.test(c.name))
      throw new InvalidCertificateError(`CACertificates: invalid certificate name '${c.name}'`);
    const file = `${PREFIX}${c.name}.crt`;
    if (wanted.has(file)) throw new InvalidCertificateError(`CACertificates: certificate '${c.name}' is listed twice`);
    wanted.add(file);
    const change = await planFile(host, {
      path: `${store.anchors}/${file}`,
      content: validateCertificate(c.name, c.pem),
      mode: 0o644,
    });
    if (change) {
      // A base64 diff tells a reader nothing: say which certificates, before and after.
      if (change.diff) {
        const before = change.action === "update" ? describeCertificates((await host.readText(change.path)) ?? "") : "";
        change.diff = `${before ? `- ${before.split("\n").join("\n- ")}\n` : ""}+ ${describeCertificates(String(change.content)).split("\n").join("\n+ ")}`;
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
    const refresh: CommandChange = {
      kind: "command",
      argv: store.refresh,
      summary: `refresh the trust store: ${store.refresh.join(" ")}${stale ? " (an earlier refresh did not finish)" : ""}`,
    };
    changes.push(refresh);
  }
  return changes;
}

const step: Step<"CACertificates"> = {
  kind: "CACertificates",
  plan: (spec, host) => plan(spec, host),
  async apply(changes, _spec, host, ctx) {
    for (const c of changes) {
      if (c.kind === "file") {
        if (c.action !== "delete") await host.mkdir(TRUST_STORES[host.os.family].anchors, { mode: 0o755 });
        await applyFileChange(host, c as FileChange);
      } else if (c.kind === "command") {
        const argv = refreshArgv(host);
        for (const dir of TRUST_STORES[host.os.family].outputs ?? []) {
          if (!(await host.exists(dir))) await host.mkdir(dir, { mode: 0o755 });
        }
        if (argv) await host.mustRun(argv, { logFile: ctx.logFile });
        else await host.recordSandboxAction(c.argv.join(" "));
      } else {
        throw new Error(`CACertificates: unexpected change kind ${c.kind}`);
      }
    }
    return undefined;
  },
};

export default step;
