// Where the agent's Kubernetes credentials come from: a kubeconfig (the kubelet's
// /etc/kubernetes/kubelet.conf, an admin or bootstrap-token kubeconfig), or the loose
// bootstrap files bootstrap.sh leaves in /var/lib/bashible. TLS is always verified against
// a pinned CA; a kubeconfig asking to skip verification is refused, not obeyed.
import { readFile } from "node:fs/promises";
import path from "node:path";
import { parse } from "yaml";

export interface KubeConnection {
  server: string;
  ca: Buffer;
  cert?: Buffer | undefined;
  key?: Buffer | undefined;
  token?: string | undefined;
  tlsServerName?: string | undefined;
  /** Where these credentials came from, for messages. */
  source: string;
}

export class KubeconfigError extends Error {
  override name = "KubeconfigError";
}

type Dict = Record<string, unknown>;

/** Finds `name` in a kubeconfig list (clusters, users, contexts) and returns its body. */
function pick(list: unknown, name: string, kind: "cluster" | "user" | "context", file: string): Dict {
  const entries = Array.isArray(list) ? (list as Dict[]) : [];
  const body = entries.find((e) => e?.name === name)?.[kind];
  if (!body || typeof body !== "object") {
    throw new KubeconfigError(`${file}: ${kind} '${name}' is not defined`);
  }
  return body as Dict;
}

/** Reads a file named by a kubeconfig: relative paths are relative to the kubeconfig, absolute ones to the root. */
async function readRef(ref: string, kubeconfigDir: string, root: string, what: string, file: string): Promise<Buffer> {
  const resolved = path.isAbsolute(ref) ? path.join(root, ref) : path.resolve(kubeconfigDir, ref);
  try {
    return await readFile(resolved);
  } catch (err) {
    throw new KubeconfigError(`${file}: cannot read ${what} ${resolved}: ${(err as Error).message}`);
  }
}

async function dataOrFile(
  obj: Dict,
  dataKey: string,
  fileKey: string,
  dir: string,
  root: string,
  file: string,
): Promise<Buffer | undefined> {
  const data = obj[dataKey];
  if (typeof data === "string" && data) return Buffer.from(data, "base64");
  const ref = obj[fileKey];
  if (typeof ref === "string" && ref) return readRef(ref, dir, root, fileKey, file);
  return undefined;
}

/** Loads the current context of a kubeconfig file (YAML or JSON). */
export async function loadKubeconfig(
  file: string,
  opts: { root?: string; context?: string } = {},
): Promise<KubeConnection> {
  const root = opts.root ?? "/";
  const fullPath = path.isAbsolute(file) ? path.join(root, file) : path.resolve(file);
  let text: string;
  try {
    text = await readFile(fullPath, "utf8");
  } catch (err) {
    throw new KubeconfigError(`cannot read kubeconfig ${fullPath}: ${(err as Error).message}`);
  }
  let doc: Dict;
  try {
    doc = (parse(text) ?? {}) as Dict;
  } catch (err) {
    throw new KubeconfigError(`${fullPath}: not valid YAML: ${(err as Error).message}`);
  }
  const contextName = opts.context ?? (doc["current-context"] as string | undefined);
  if (!contextName) throw new KubeconfigError(`${fullPath}: no current-context set`);
  const ctx = pick(doc.contexts, contextName, "context", fullPath);
  const cluster = pick(doc.clusters, String(ctx.cluster), "cluster", fullPath);
  const user = ctx.user ? pick(doc.users, String(ctx.user), "user", fullPath) : {};
  const dir = path.dirname(fullPath);

  if (cluster["insecure-skip-tls-verify"] === true) {
    throw new KubeconfigError(
      `${fullPath}: cluster '${ctx.cluster}' sets insecure-skip-tls-verify; bashible always verifies the API server, give it certificate-authority(-data)`,
    );
  }
  const server = cluster.server;
  if (typeof server !== "string" || !server.startsWith("https://")) {
    throw new KubeconfigError(
      `${fullPath}: cluster '${ctx.cluster}' needs an https:// server, got '${String(server)}'`,
    );
  }
  const ca = await dataOrFile(cluster, "certificate-authority-data", "certificate-authority", dir, root, fullPath);
  if (!ca) throw new KubeconfigError(`${fullPath}: cluster '${ctx.cluster}' has no certificate-authority(-data)`);
  const cert = await dataOrFile(user, "client-certificate-data", "client-certificate", dir, root, fullPath);
  const key = await dataOrFile(user, "client-key-data", "client-key", dir, root, fullPath);
  let token = typeof user.token === "string" ? user.token : undefined;
  if (!token && typeof user.tokenFile === "string") {
    token = (await readRef(user.tokenFile, dir, root, "tokenFile", fullPath)).toString("utf8").trim();
  }
  if (Boolean(cert) !== Boolean(key)) {
    throw new KubeconfigError(
      `${fullPath}: user '${ctx.user}' has a client certificate without a key, or a key without a certificate`,
    );
  }
  return {
    server: server.replace(/\/+$/, ""),
    ca,
    cert,
    key,
    token,
    tlsServerName: typeof cluster["tls-server-name"] === "string" ? cluster["tls-server-name"] : undefined,
    source: `kubeconfig ${fullPath}`,
  };
}

/** The bootstrap shape: a bearer token file and a CA file, before the kubelet has credentials. */
export async function bootstrapConnection(
  server: string,
  tokenFile: string,
  caFile: string,
  root = "/",
): Promise<KubeConnection> {
  const read = async (p: string, what: string) => {
    try {
      return await readFile(path.join(root, p));
    } catch (err) {
      throw new KubeconfigError(`cannot read bootstrap ${what} ${path.join(root, p)}: ${(err as Error).message}`);
    }
  };
  const token = (await read(tokenFile, "token")).toString("utf8").trim();
  if (!token) throw new KubeconfigError(`bootstrap token file ${path.join(root, tokenFile)} is empty`);
  return {
    server: server.replace(/\/+$/, ""),
    ca: await read(caFile, "CA"),
    token,
    source: `bootstrap token ${tokenFile}`,
  };
}
