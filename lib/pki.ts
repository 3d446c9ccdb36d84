// A small PKI made with the openssl CLI (standalone server, tests, demo): a CA, and leaf certificates for servers
// (SANs) and clients (CN = user, O = groups), the way Kubernetes reads identities.
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { writeFile } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";

const run = promisify(execFile);

export interface CertFiles {
  cert: string;
  key: string;
}

async function openssl(args: string[]): Promise<void> {
  try {
    await run("openssl", args);
  } catch (err) {
    const e = err as { stderr?: string; message: string };
    throw new Error(`openssl ${args[0]} failed: ${e.stderr || e.message}`);
  }
}

const subject = (cn: string, orgs: string[] = []) => `${orgs.map((o) => `/O=${o}`).join("")}/CN=${cn}`;

export async function createCA(dir: string, name: string, cn = name): Promise<CertFiles> {
  const key = path.join(dir, `${name}.key`);
  const cert = path.join(dir, `${name}.crt`);
  await openssl(["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", key]);
  await openssl([
    "req",
    "-x509",
    "-new",
    "-key",
    key,
    "-out",
    cert,
    "-days",
    "3650",
    "-subj",
    `/CN=${cn}`,
    "-addext",
    "basicConstraints=critical,CA:TRUE",
    "-addext",
    "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
  ]);
  return { cert, key };
}

export interface LeafOptions {
  cn: string;
  orgs?: string[];
  /** DNS names and IPs; a server certificate when present. */
  dnsNames?: string[];
  ips?: string[];
  client?: boolean;
  days?: number;
}

export async function issueCert(dir: string, name: string, ca: CertFiles, o: LeafOptions): Promise<CertFiles> {
  const key = path.join(dir, `${name}.key`);
  const csr = path.join(dir, `${name}.csr`);
  const cert = path.join(dir, `${name}.crt`);
  const ext = path.join(dir, `${name}.ext`);
  const usages = [o.client ? "clientAuth" : "", o.dnsNames || o.ips ? "serverAuth" : ""].filter(Boolean);
  const sans = [...(o.dnsNames ?? []).map((d) => `DNS:${d}`), ...(o.ips ?? []).map((i) => `IP:${i}`)];
  await writeFile(
    ext,
    [
      "basicConstraints=critical,CA:FALSE",
      "keyUsage=critical,digitalSignature,keyEncipherment",
      `extendedKeyUsage=${usages.join(",") || "clientAuth"}`,
      ...(sans.length ? [`subjectAltName=${sans.join(",")}`] : []),
    ].join("\n"),
  );
  await openssl(["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", key]);
  await openssl(["req", "-new", "-key", key, "-out", csr, "-subj", subject(o.cn, o.orgs)]);
  await openssl([
    "x509",
    "-req",
    "-in",
    csr,
    "-CA",
    ca.cert,
    "-CAkey",
    ca.key,
    // A random serial per certificate: -CAcreateserial shares one serial file per CA, which
    // certificates issued in parallel tear ("Unable to load number from ca.srl").
    "-set_serial",
    `0x${randomBytes(8).toString("hex")}`,
    "-out",
    cert,
    "-days",
    String(o.days ?? 365),
    "-extfile",
    ext,
  ]);
  return { cert, key };
}

/** An EC key pair for service-account tokens. */
export async function createKeyPair(dir: string, name: string): Promise<{ priv: string; pub: string }> {
  const priv = path.join(dir, `${name}.key`);
  const pub = path.join(dir, `${name}.pub`);
  await openssl(["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", priv]);
  await openssl(["ec", "-in", priv, "-pubout", "-out", pub]);
  return { priv, pub };
}
