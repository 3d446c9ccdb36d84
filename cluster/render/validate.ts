// Input checks that turn bad objects into RenderErrors naming the object, before anything is
// rendered. The CRDs refuse most of these already; objects from --config-dir (or a CRD
// installed by someone else) do not pass through that validation, so the server checks again.
import { DECKHOUSE_BUNDLES, isDeckhouseBundle } from "../../bundles/os-families.ts";
import {
  DIGEST,
  ENDPOINT,
  GROUP_NAME,
  MAX_GROUP_NAME,
  MAX_NODE_USER_UID,
  METRICS_SECURE_ADDRESS,
  MIN_NODE_USER_UID,
  NGC_NAME,
  PACKAGE_NAME,
  RESERVED_USERS,
  USER_NAME,
} from "../../bundles/rules.ts";
import { RenderError } from "./errors.ts";
import type { ClusterContext, NodeGroupConfigurationObject, NodeUserObject } from "./inputs.ts";

export const MAX_SCRIPT_BYTES = 256 * 1024;
/** Safe inside a double-quoted shell word and in sed: what bootstrap scripts and sed read. */
const SHELL_SAFE = /^[A-Za-z0-9:./_-]+$/;

export function checkGroupName(name: string): void {
  if (typeof name !== "string" || name.length > MAX_GROUP_NAME || !GROUP_NAME.test(name)) {
    throw new RenderError(
      `NodeGroup/${name}`,
      `invalid name: use at most ${MAX_GROUP_NAME} lower-case letters, digits and '-', starting and ending with a letter or digit`,
    );
  }
}

export function checkNodeUser(u: NodeUserObject): void {
  const name = u.metadata?.name;
  const obj = `NodeUser/${name}`;
  if (typeof name !== "string" || !USER_NAME.test(name)) {
    throw new RenderError(obj, "invalid user name: use lower-case letters, digits, '_' and '-' (at most 32)");
  }
  if (RESERVED_USERS.has(name)) throw new RenderError(obj, `'${name}' is a system account and cannot be a NodeUser`);
  const uid = u.spec?.uid;
  if (!Number.isInteger(uid) || uid < MIN_NODE_USER_UID || uid > MAX_NODE_USER_UID) {
    throw new RenderError(
      obj,
      `uid ${uid} is not allowed: use ${MIN_NODE_USER_UID}..${MAX_NODE_USER_UID} (uids up to ${MIN_NODE_USER_UID - 1} belong to the system)`,
    );
  }
  const keys = u.spec.sshPublicKeys ?? [];
  if (!Array.isArray(keys) || keys.some((k) => typeof k !== "string" || /[\r\n]/.test(k) || !k.trim())) {
    throw new RenderError(obj, "sshPublicKeys must be single-line strings");
  }
  const single = u.spec.sshPublicKey;
  if (single !== undefined && (typeof single !== "string" || /[\r\n]/.test(single))) {
    throw new RenderError(obj, "sshPublicKey must be a single-line string");
  }
  const hash = u.spec.passwordHash;
  if (hash !== undefined && (typeof hash !== "string" || /[:\r\n]/.test(hash))) {
    throw new RenderError(obj, "passwordHash must be one /etc/shadow field (no ':' or newline)");
  }
  for (const g of u.spec.extraGroups ?? []) {
    if (typeof g !== "string" || !USER_NAME.test(g))
      throw new RenderError(obj, `extraGroups: invalid group name '${g}'`);
  }
}

export function checkConfiguration(c: NodeGroupConfigurationObject): void {
  const name = c.metadata?.name;
  const obj = `NodeGroupConfiguration/${name}`;
  if (typeof name !== "string" || name.length > 253 || !NGC_NAME.test(name)) {
    throw new RenderError(obj, "invalid name: use lower-case letters, digits, '-', '_' and '.' (at most 253)");
  }
  // Deckhouse puts no bound on the weight; it only orders the step (`%03d_<name>`).
  const weight = c.spec?.weight ?? 100;
  if (!Number.isSafeInteger(weight)) throw new RenderError(obj, `weight ${weight} is not an integer`);
  if (typeof c.spec.content !== "string" || !c.spec.content.trim()) throw new RenderError(obj, "content is empty");
  for (const b of c.spec.bundles ?? []) {
    if (b === "*" || (typeof b === "string" && isDeckhouseBundle(b))) continue;
    const hint = Object.hasOwn(FAMILY_HINTS, b) ? ` ('${b}' is a family; its bundles are ${FAMILY_HINTS[b]})` : "";
    throw new RenderError(
      obj,
      `unknown bundle '${b}' in spec.bundles${hint}; Deckhouse's bundle names are *, ${DECKHOUSE_BUNDLES.join(", ")}`,
    );
  }
}

/** Family names people write where a bundle name belongs. */
const FAMILY_HINTS: Record<string, string> = {
  rhel: "centos, redos and rosa",
  suse: "opensuse",
  ubuntu: "ubuntu-lts",
};

export function checkScriptSize(obj: string, script: string): void {
  const bytes = Buffer.byteLength(script, "utf8");
  if (bytes > MAX_SCRIPT_BYTES) {
    throw new RenderError(obj, `rendered script is ${bytes} bytes; the limit is ${MAX_SCRIPT_BYTES} (256 KiB)`);
  }
}

export function checkContext(c: ClusterContext): void {
  const bad = (msg: string) => new RenderError("context", msg);
  if (!c || typeof c !== "object") throw bad("missing");
  if (typeof c.clusterUUID !== "string" || !c.clusterUUID) throw bad("clusterUUID is required");
  if (typeof c.kubernetesVersion !== "string" || !/^\d+\.\d+(\.\d+)?$/.test(c.kubernetesVersion)) {
    throw bad(`kubernetesVersion '${c.kubernetesVersion}' is not like 1.34 or 1.34.4`);
  }
  if (!Array.isArray(c.apiserverEndpoints) || !c.apiserverEndpoints.length) {
    throw bad("apiserverEndpoints needs at least one host:port");
  }
  for (const e of c.apiserverEndpoints) if (!ENDPOINT.test(e)) throw bad(`apiserverEndpoints: '${e}' is not host:port`);
  if (typeof c.clusterCA !== "string" || !c.clusterCA.includes("-----BEGIN CERTIFICATE-----")) {
    throw bad("clusterCA must be a PEM certificate");
  }
  if (c.registry?.ca !== undefined && !c.registry.ca.includes("-----BEGIN CERTIFICATE-----")) {
    throw bad("registry.ca must be a PEM certificate");
  }
  const proxy = c.packagesProxy;
  if (!proxy || !Array.isArray(proxy.endpoints) || !proxy.endpoints.length) {
    throw bad("packagesProxy.endpoints needs at least one host:port");
  }
  for (const e of proxy.endpoints) if (!ENDPOINT.test(e)) throw bad(`packagesProxy.endpoints: '${e}' is not host:port`);
  if (typeof proxy.token !== "string" || !/^[A-Za-z0-9._~+/=-]+$/.test(proxy.token)) {
    throw bad("packagesProxy.token must be a non-empty bearer token");
  }
  for (const [name, p] of Object.entries(c.packages ?? {})) {
    if (!PACKAGE_NAME.test(name)) throw bad(`packages: invalid package name '${name}'`);
    if (!DIGEST.test(p?.digest ?? "")) throw bad(`packages.${name}.digest must be sha256:<64 hex>`);
    if (p.layer !== undefined && !DIGEST.test(p.layer)) throw bad(`packages.${name}.layer must be sha256:<64 hex>`);
    if (p.repository !== undefined && !SHELL_SAFE.test(p.repository)) {
      throw bad(`packages.${name}.repository '${p.repository}' has characters other than [A-Za-z0-9:./_-]`);
    }
  }
  if (!c.agent || !c.packages?.[c.agent.package]) {
    throw bad(
      `agent.package '${c.agent?.package}' must name one of packages (${Object.keys(c.packages ?? {}).join(", ")})`,
    );
  }
  if (typeof c.agent.version !== "string" || !SHELL_SAFE.test(c.agent.version)) throw bad("agent.version is required");
  const secure = c.agent.metricsSecureAddress;
  if (
    secure !== undefined &&
    (!METRICS_SECURE_ADDRESS.test(String(secure)) || Number(String(secure).split(":").pop()) > 65535)
  ) {
    throw bad(
      `agent.metricsSecureAddress '${secure}' must be internal:PORT (the Node's InternalIP) or IP:PORT, e.g. internal:9650`,
    );
  }
  if (c.registry && !SHELL_SAFE.test(`${c.registry.address}/${c.registry.path}`)) {
    throw bad("registry.address and registry.path must be plain host[:port] and path");
  }
}
