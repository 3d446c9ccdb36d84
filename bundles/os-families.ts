// Which bundle an OS belongs to, from /etc/os-release ID, in two vocabularies:
// - the family (debian | rhel | altlinux): steps read paths and commands from the family's data
//   instead of branching on distributions;
// - Deckhouse's bundle names (ubuntu-lts, debian, centos, …): what NodeGroupConfiguration
//   `spec.bundles`, a script's `$BUNDLE` and `bb-is-bundle` speak. This map is the contract: the
//   bundle server validates spec.bundles against it, the agent's Script step picks `$BUNDLE` from
//   it, and steps/bashbooster/bashbooster.sh carries the same table (a test keeps them equal).

export type BundleFamily = "debian" | "rhel" | "altlinux";

export interface FamilyFacts {
  family: BundleFamily;
  packageManager: "apt" | "dnf" | "apt-rpm";
}

const BY_ID: Record<string, FamilyFacts> = {
  debian: { family: "debian", packageManager: "apt" },
  ubuntu: { family: "debian", packageManager: "apt" },
  astra: { family: "debian", packageManager: "apt" },
  centos: { family: "rhel", packageManager: "dnf" },
  rocky: { family: "rhel", packageManager: "dnf" },
  almalinux: { family: "rhel", packageManager: "dnf" },
  rhel: { family: "rhel", packageManager: "dnf" },
  redos: { family: "rhel", packageManager: "dnf" },
  // ROSA (Fresh, and RELS, its enterprise edition): dnf and the RHEL layout, as Deckhouse's
  // rosa bundle treats it (not tried here: no ROSA package source at hand).
  rosa: { family: "rhel", packageManager: "dnf" },
  rels: { family: "rhel", packageManager: "dnf" },
  altlinux: { family: "altlinux", packageManager: "apt-rpm" },
};

export const KNOWN_OS_IDS = Object.keys(BY_ID);

export class UnknownOsError extends Error {
  override name = "UnknownOsError";
  readonly osId: string;
  constructor(osId: string) {
    const why = Object.hasOwn(REFUSED_OS_IDS, osId.toLowerCase()) ? REFUSED_OS_IDS[osId.toLowerCase()] : undefined;
    super(
      `operating system '${osId || "(no ID in os-release)"}' is not supported${why ? ` (${why})` : ""}; supported IDs: ${KNOWN_OS_IDS.join(", ")}`,
    );
    this.osId = osId;
  }
}

/** Maps an os-release ID to its family; throws UnknownOsError for anything else. */
export function familyOf(osId: string): FamilyFacts {
  const facts = Object.hasOwn(BY_ID, osId.toLowerCase()) ? BY_ID[osId.toLowerCase()] : undefined;
  if (!facts) throw new UnknownOsError(osId);
  return facts;
}

/** Parses os-release(5): KEY=value lines, values optionally quoted. */
export function parseOsRelease(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (!line || line.startsWith("#")) continue;
    const eq = line.indexOf("=");
    if (eq <= 0) continue;
    let value = line.slice(eq + 1).trim();
    const q = value[0];
    if ((q === '"' || q === "'") && value.endsWith(q) && value.length >= 2) {
      value = value.slice(1, -1);
      if (q === '"') value = value.replace(/\\(["\\$`])/g, "$1");
    }
    out[line.slice(0, eq)] = value;
  }
  return out;
}

/** Deckhouse's bundle names, as NodeGroupConfiguration `spec.bundles` takes them (plus `*`). */
export const DECKHOUSE_BUNDLES = [
  "ubuntu-lts",
  "debian",
  "astra",
  "centos",
  "redos",
  "rosa",
  "opensuse",
  "altlinux",
] as const;
export type DeckhouseBundle = (typeof DECKHOUSE_BUNDLES)[number];

/** Deckhouse's family names, as `bb-is-family` prints them (suse has no agent support yet). */
export type DeckhouseFamily = "debian" | "rhel" | "suse" | "altlinux";

export interface DeckhouseOs {
  bundle: DeckhouseBundle;
  family: DeckhouseFamily;
  /** What `bb-pkg-mgr` prints. */
  packageManager: "apt" | "dnf" | "zypper" | "apt-rpm";
}

const apt = (bundle: DeckhouseBundle): DeckhouseOs => ({ bundle, family: "debian", packageManager: "apt" });
const dnf = (bundle: DeckhouseBundle): DeckhouseOs => ({ bundle, family: "rhel", packageManager: "dnf" });
const zypper: DeckhouseOs = { bundle: "opensuse", family: "suse", packageManager: "zypper" };

/** os-release ID → Deckhouse bundle (Deckhouse's candi/version_map.yml `bashible.os`). */
export const DECKHOUSE_OS_BY_ID: Readonly<Record<string, DeckhouseOs>> = {
  ubuntu: apt("ubuntu-lts"),
  debian: apt("debian"),
  astra: apt("astra"),
  centos: dnf("centos"),
  rocky: dnf("centos"),
  almalinux: dnf("centos"),
  rhel: dnf("centos"),
  ol: dnf("centos"),
  redos: dnf("redos"),
  rosa: dnf("rosa"),
  rels: dnf("rosa"),
  "opensuse-leap": zypper,
  "mosos-arbat": zypper,
  altlinux: { bundle: "altlinux", family: "altlinux", packageManager: "apt-rpm" },
};

/** The Deckhouse bundle of an os-release ID; undefined for an OS Deckhouse has no bundle for. */
export function deckhouseOsOf(osId: string): DeckhouseOs | undefined {
  return Object.hasOwn(DECKHOUSE_OS_BY_ID, osId.toLowerCase()) ? DECKHOUSE_OS_BY_ID[osId.toLowerCase()] : undefined;
}

export const isDeckhouseBundle = (name: string): name is DeckhouseBundle =>
  (DECKHOUSE_BUNDLES as readonly string[]).includes(name);

/**
 * Whether a NodeGroupConfiguration with these `spec.bundles` runs on this OS: an empty list or
 * `*` selects every OS, otherwise the OS's Deckhouse bundle must be listed.
 */
export function bundlesSelect(bundles: readonly string[], osId: string): boolean {
  if (!bundles.length || bundles.includes("*")) return true;
  const os = deckhouseOsOf(osId);
  return os !== undefined && bundles.includes(os.bundle);
}

/** Programs the steps run, and the Debian / RHEL packages that provide them. */
export const PROGRAM_PACKAGES: Record<string, { debian: string; rhel: string }> = {
  visudo: { debian: "sudo", rhel: "sudo" },
  useradd: { debian: "passwd", rhel: "shadow-utils" },
  usermod: { debian: "passwd", rhel: "shadow-utils" },
  userdel: { debian: "passwd", rhel: "shadow-utils" },
  groupadd: { debian: "passwd", rhel: "shadow-utils" },
  chpasswd: { debian: "passwd", rhel: "shadow-utils" },
  "update-ca-certificates": { debian: "ca-certificates", rhel: "ca-certificates" },
  "update-ca-trust": { debian: "ca-certificates", rhel: "ca-certificates" },
  tar: { debian: "tar", rhel: "tar" },
  gzip: { debian: "gzip", rhel: "gzip" },
  bash: { debian: "bash", rhel: "bash" },
  pgrep: { debian: "procps", rhel: "procps-ng" },
  pkill: { debian: "procps", rhel: "procps-ng" },
  systemctl: { debian: "systemd", rhel: "systemd" },
  "systemd-analyze": { debian: "systemd", rhel: "systemd" },
  nginx: { debian: "nginx-light (with libnginx-mod-stream)", rhel: "nginx (with nginx-mod-stream)" },
  modprobe: { debian: "kmod", rhel: "kmod" },
};

// ---------------------------------------------------------------------------------------------
// Distribution packages (000_add_mandatory_packages): what a node needs from its distribution,
// by the role a package plays, and how each package manager installs, holds, lists and removes
// packages. The bundle names roles; the node maps them through its family here, so a group's
// bundle is the same for every OS and the differences stay data.

/** The roles a bundle may ask for (the spec of 000_add_mandatory_packages names these). */
export const PACKAGE_ROLES = [
  // Deckhouse's mandatory set (its 003_install_mandatory_packages)
  "curl",
  "jq",
  "socat",
  "conntrack",
  "iptables",
  "nftables",
  "e2fsprogs",
  "growpart",
  "lsblk",
  "virt-what",
  "netcat",
  // What this agent's own steps run: update-ca-certificates / update-ca-trust (003), modprobe
  // (004), sysctl (041), ip, visudo and pkill (000_add_node_users), runc's shared library
  // (Deckhouse's Debian bundle installs libseccomp2 the same way), logrotate (the step logs).
  "ca-certificates",
  "kmod",
  "procps",
  "iproute",
  "sudo",
  "libseccomp",
  "logrotate",
  // The kubernetes-api-proxy's nginx with its stream module.
  "nginx",
] as const;
export type PackageRole = (typeof PACKAGE_ROLES)[number];

/** Roles whose packages are held at their installed version: where Deckhouse held them. */
export const HELD_ROLES: ReadonlySet<PackageRole> = new Set<PackageRole>([
  // Deckhouse held (apt-mark hold, yum versionlock) the api proxy's nginx: the binary and its
  // dynamic stream module must stay at one version, and an unattended upgrade of one without the
  // other makes `nginx -t` refuse the configuration ("module is not binary compatible").
  "nginx",
]);

/** The distribution's package names for each role, per family. */
export const DISTRO_PACKAGES: Readonly<Record<BundleFamily, Readonly<Record<PackageRole, readonly string[]>>>> = {
  // Debian, Ubuntu, Astra
  debian: {
    curl: ["curl"],
    jq: ["jq"],
    socat: ["socat"],
    conntrack: ["conntrack"],
    iptables: ["iptables"],
    nftables: ["nftables"],
    e2fsprogs: ["e2fsprogs"],
    growpart: ["cloud-guest-utils"],
    lsblk: ["util-linux"],
    "virt-what": ["virt-what"],
    netcat: ["netcat-openbsd"],
    "ca-certificates": ["ca-certificates"],
    kmod: ["kmod"],
    procps: ["procps"],
    iproute: ["iproute2"],
    sudo: ["sudo"],
    libseccomp: ["libseccomp2"],
    logrotate: ["logrotate"],
    nginx: ["nginx-light", "libnginx-mod-stream"],
  },
  // CentOS, Rocky, Alma, RHEL, Oracle, RED OS, ROSA
  rhel: {
    curl: ["curl"],
    jq: ["jq"],
    socat: ["socat"],
    conntrack: ["conntrack-tools"],
    iptables: ["iptables"],
    nftables: ["nftables"],
    e2fsprogs: ["e2fsprogs"],
    growpart: ["cloud-utils-growpart"],
    lsblk: ["util-linux"],
    "virt-what": ["virt-what"],
    netcat: ["nmap-ncat"],
    "ca-certificates": ["ca-certificates"],
    kmod: ["kmod"],
    procps: ["procps-ng"],
    iproute: ["iproute"],
    sudo: ["sudo"],
    libseccomp: ["libseccomp"],
    logrotate: ["logrotate"],
    nginx: ["nginx", "nginx-mod-stream"],
  },
  // ALT Linux (its nginx has the stream module built in)
  altlinux: {
    curl: ["curl"],
    jq: ["jq"],
    socat: ["socat"],
    conntrack: ["conntrack-tools"],
    iptables: ["iptables"],
    nftables: ["nftables"],
    e2fsprogs: ["e2fsprogs"],
    growpart: ["cloud-utils-growpart"],
    lsblk: ["util-linux"],
    "virt-what": ["virt-what"],
    netcat: ["netcat"],
    "ca-certificates": ["ca-certificates"],
    kmod: ["kmod"],
    procps: ["procps"],
    iproute: ["iproute2"],
    sudo: ["sudo"],
    libseccomp: ["libseccomp"],
    logrotate: ["logrotate"],
    nginx: ["nginx"],
  },
};

/** The distribution packages for these roles on a family, in role order, each once. */
export function distroPackagesFor(family: BundleFamily, roles: readonly PackageRole[]): string[] {
  return [...new Set(roles.flatMap((r) => DISTRO_PACKAGES[family][r]))];
}

export type DistroPackageManager = "apt" | "dnf" | "yum" | "zypper" | "apt-rpm";

/**
 * How a package manager is driven: exact argv (the packages are appended), where its sources
 * are configured (named when a mirror cannot be reached), how installed packages are listed and
 * held. `query` prints one line per argument: `dpkg-query` the name and its status, `rpm
 * --whatprovides` the name of the package providing it (so a name another package provides, as
 * EL9's iptables-nft provides iptables, counts as installed).
 */
export interface PackageManagerFacts {
  /** The program that must exist for this manager to be the node's. */
  program: string;
  refresh: readonly string[];
  install: readonly string[];
  /** Remove exactly these packages (cleanup_static_node.sh: the record lists the dependencies too). */
  remove: readonly string[];
  env: Readonly<Record<string, string>>;
  /** More environment for `remove`. */
  removeEnv?: Readonly<Record<string, string>>;
  /** Holds at the installed version; undefined: this manager cannot hold a package. */
  hold?: readonly string[];
  /** Releases a hold (cleanup, before it removes held packages). */
  unhold?: readonly string[];
  /** The file listing held packages (one name per line; dnf/yum: name-version globs). */
  holdList?: string;
  query: "dpkg" | "rpm";
  sources: string;
}

const APT_OPTIONS = [
  "-o",
  "Dpkg::Options::=--force-confdef",
  "-o",
  "Dpkg::Options::=--force-confold",
  // A mirror that does not answer fails the step in seconds, not after apt's 120 s × retries.
  "-o",
  "Acquire::http::Timeout=20",
  "-o",
  "Acquire::https::Timeout=20",
  "-o",
  "Acquire::Retries=1",
];

export const PACKAGE_MANAGERS: Readonly<Record<DistroPackageManager, PackageManagerFacts>> = {
  apt: {
    program: "apt-get",
    // Error-Mode=any: a source that cannot be fetched is an error (exit 100), not a warning
    // after which apt goes on with old or no lists and "Unable to locate package".
    refresh: ["apt-get", "update", "-q", "-o", "APT::Update::Error-Mode=any", ...APT_OPTIONS],
    install: ["apt-get", "install", "-y", "-q", "--no-install-recommends", ...APT_OPTIONS],
    remove: ["apt-get", "purge", "-y", "-q"],
    env: { DEBIAN_FRONTEND: "noninteractive", LANG: "C" },
    // sudo's prerm refuses to go on a machine whose root has no password unless told: the agent
    // installed it, so cleanup removes it.
    removeEnv: { SUDO_FORCE_REMOVE: "yes" },
    hold: ["apt-mark", "hold"],
    unhold: ["apt-mark", "unhold"],
    query: "dpkg",
    sources: "/etc/apt/sources.list, /etc/apt/sources.list.d/",
  },
  dnf: {
    program: "dnf",
    refresh: ["dnf", "makecache", "-q", "-y"],
    install: ["dnf", "install", "-y", "-q"],
    remove: ["dnf", "remove", "-y", "-q", "--noautoremove"],
    env: { LANG: "C" },
    // python3-dnf-plugin-versionlock: installed with the held packages (VERSIONLOCK_PLUGIN).
    hold: ["dnf", "versionlock", "add"],
    unhold: ["dnf", "versionlock", "delete"],
    holdList: "/etc/dnf/plugins/versionlock.list",
    query: "rpm",
    sources: "/etc/yum.repos.d/",
  },
  yum: {
    program: "yum",
    refresh: ["yum", "makecache", "-q", "-y"],
    install: ["yum", "install", "-y", "-q"],
    remove: ["yum", "remove", "-y", "-q"],
    env: { LANG: "C" },
    hold: ["yum", "versionlock", "add"],
    unhold: ["yum", "versionlock", "delete"],
    holdList: "/etc/yum/pluginconf.d/versionlock.list",
    query: "rpm",
    sources: "/etc/yum.repos.d/",
  },
  zypper: {
    program: "zypper",
    refresh: ["zypper", "--non-interactive", "refresh"],
    install: ["zypper", "--non-interactive", "install", "--no-recommends"],
    remove: ["zypper", "--non-interactive", "remove"],
    env: { LANG: "C" },
    hold: ["zypper", "--non-interactive", "addlock"],
    unhold: ["zypper", "--non-interactive", "removelock"],
    holdList: "/etc/zypp/locks",
    query: "rpm",
    sources: "/etc/zypp/repos.d/",
  },
  "apt-rpm": {
    program: "apt-get",
    refresh: ["apt-get", "update", "-q"],
    install: ["apt-get", "install", "-y", "-q"],
    remove: ["apt-get", "remove", "-y", "-q"],
    env: { LANG: "C" },
    // ALT's apt-rpm has no apt-mark: nothing is held there.
    query: "rpm",
    sources: "/etc/apt/sources.list, /etc/apt/sources.list.d/",
  },
};

/** The versionlock plugin dnf and yum need to hold a package, per manager. */
export const VERSIONLOCK_PLUGIN: Partial<Record<DistroPackageManager, string>> = {
  dnf: "python3-dnf-plugin-versionlock",
  yum: "yum-plugin-versionlock",
};

/** The package managers a family may use, the first one present wins (EL7 has only yum). */
export const FAMILY_PACKAGE_MANAGERS: Readonly<Record<BundleFamily, readonly DistroPackageManager[]>> = {
  debian: ["apt"],
  rhel: ["dnf", "yum"],
  altlinux: ["apt-rpm"],
};

/** Distribution units a role's packages start that a node must not run (the api proxy runs its own nginx). */
/**
 * Debian's policy-rc.d, and the line that marks the one the package step writes for the length
 * of an install (steps/checks/deny-service-starts.sh): the step's next plan and
 * cleanup_static_node.sh remove one an install that was killed left behind.
 */
export const POLICY_RC_D = "/usr/sbin/policy-rc.d";
export const DENY_STARTS_MARKER = "# bashible: deny-service-starts";

export const ROLE_UNITS_TO_DISABLE: Partial<Record<PackageRole, readonly string[]>> = {
  // Debian's nginx package enables and starts nginx.service on port 80 (Deckhouse disabled it
  // too): a node's port 80 belongs to its ingress controller.
  nginx: ["nginx.service"],
};

/**
 * What a role's packages leave behind when they are purged (made by their maintainer scripts,
 * not their file lists), for cleanup to remove after it removed them; directories only when that
 * left them empty.
 */
export const ROLE_PURGE_LEFTOVERS: Partial<Record<PackageRole, { files: readonly string[]; dirs: readonly string[] }>> =
  {
    // Debian's nginx-common puts its welcome page into /var/www/html and leaves it on purge.
    nginx: { files: ["/var/www/html/index.nginx-debian.html"], dirs: ["/var/www/html", "/var/www"] },
  };

/**
 * os-release IDs Deckhouse has a bundle for that this agent refuses, and why (docs/steps.md).
 * openSUSE and MOS are SUSE: zypper (the data above has it), but CA anchors, the nginx module
 * path and the PATH drop-ins differ again, and no SUSE package source is at hand to try a fourth
 * family against.
 */
export const REFUSED_OS_IDS: Readonly<Record<string, string>> = {
  "opensuse-leap": "openSUSE is not supported yet: the SUSE family (zypper, /etc/pki/trust/anchors) is not implemented",
  "mosos-arbat": "MOS is not supported yet: the SUSE family (zypper, /etc/pki/trust/anchors) is not implemented",
};
