// Name rules both sides apply: the server when it renders (so a bad object is refused with its
// name), the agent when it accepts a bundle (so a bundle from anywhere else is refused too).
// Names become paths on the node, so each rule also keeps them inside their directory.

/** Node group: a DNS label, at most 42 characters (Deckhouse's limit). */
export const GROUP_NAME = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
export const MAX_GROUP_NAME = 42;
/** NodeGroupConfiguration object name; becomes part of a step name. */
export const NGC_NAME = /^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$/;
/**
 * Step names: `NNN_name`, the weight first so names order steps; the weight as Go's `%03d`
 * writes it, so a NodeGroupConfiguration weight of 1000 or -5 is `1000_` or `-05_` (Deckhouse's
 * names for them).
 */
export const STEP_NAME = /^(?:\d{3,}|-\d{2,})_[a-z0-9][a-z0-9_.-]*$/;
/** Local user and group names (shadow-utils' portable set). */
export const USER_NAME = /^[a-z_][a-z0-9_-]{0,31}$/;
/** Registry package names: a directory under /var/cache/registrypackages. */
export const PACKAGE_NAME = /^[a-z0-9][a-z0-9._-]{0,62}$/;
/** A content digest, as OCI writes it. */
export const DIGEST = /^sha256:[0-9a-f]{64}$/;
/** CA certificate names: a file name in the trust store. */
export const CERT_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
/** host:port, IPv6 in brackets. */
export const ENDPOINT = /^[A-Za-z0-9.-]+:[0-9]{1,5}$|^\[[0-9a-fA-F:]+\]:[0-9]{1,5}$/;
/**
 * Where the node agent's authenticated metrics listen (`--metrics-secure-address`): `internal:PORT`
 * (the Node's InternalIP) or an IP address and port; never a name a resolver would answer.
 */
export const METRICS_SECURE_ADDRESS = /^(?:internal|[0-9]{1,3}(?:\.[0-9]{1,3}){3}|\[[0-9a-fA-F:.]+\]):[0-9]{1,5}$/;
/** Checksums: sha256 hex. */
export const CHECKSUM = /^[0-9a-f]{64}$/;

/** uids the system and the OS installer own; NodeUsers start above. */
export const MIN_NODE_USER_UID = 1001;
export const MAX_NODE_USER_UID = 59999;

/** Groups whose members are root in effect: only `isSudoer` may grant them. */
export const PRIVILEGED_GROUPS: ReadonlySet<string> = new Set([
  "root",
  "sudo",
  "wheel",
  "admin",
  "nodeadmin",
  // Raw disks, the password hashes or the container runtime: root by another door.
  "disk",
  "shadow",
  "docker",
  "lxd",
]);

/** Accounts every distribution has or that the agent and Kubernetes need for themselves. */
export const RESERVED_USERS: ReadonlySet<string> = new Set([
  "root",
  "daemon",
  "bin",
  "sys",
  "sync",
  "games",
  "man",
  "lp",
  "mail",
  "news",
  "uucp",
  "proxy",
  "www-data",
  "backup",
  "list",
  "irc",
  "nobody",
  "systemd-network",
  "systemd-resolve",
  "messagebus",
  "sshd",
  "deckhouse",
  "kubelet",
  "containerd",
]);
