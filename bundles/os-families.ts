// Which bundle family an OS belongs to, from /etc/os-release ID. Steps read paths and
// commands from the family's data instead of branching on distributions.

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
