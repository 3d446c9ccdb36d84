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
  altlinux: { family: "altlinux", packageManager: "apt-rpm" },
};

export const KNOWN_OS_IDS = Object.keys(BY_ID);

export class UnknownOsError extends Error {
  override name = "UnknownOsError";
  readonly osId: string;
  constructor(osId: string) {
    super(
      `operating system '${osId || "(no ID in os-release)"}' is not supported; supported IDs: ${KNOWN_OS_IDS.join(", ")}`,
    );
    this.osId = osId;
  }
}

/** Maps an os-release ID to its family; throws UnknownOsError for anything else. */
export function familyOf(osId: string): FamilyFacts {
  const facts = BY_ID[osId.toLowerCase()];
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
