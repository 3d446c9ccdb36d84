// os-release ID → Deckhouse bundle name: the contract spec.bundles, $BUNDLE and bb-is-bundle
// share. Ubuntu is ubuntu-lts, not debian; every RHEL rebuild is centos.
import t from "tap";
import {
  bundlesSelect,
  DECKHOUSE_BUNDLES,
  DECKHOUSE_OS_BY_ID,
  deckhouseOsOf,
  familyOf,
} from "../../bundles/os-families.ts";

t.test("each os-release ID maps to Deckhouse's bundle, family and package manager", async (t) => {
  const want: Record<string, [string, string, string]> = {
    ubuntu: ["ubuntu-lts", "debian", "apt"],
    debian: ["debian", "debian", "apt"],
    astra: ["astra", "debian", "apt"],
    centos: ["centos", "rhel", "dnf"],
    rocky: ["centos", "rhel", "dnf"],
    almalinux: ["centos", "rhel", "dnf"],
    rhel: ["centos", "rhel", "dnf"],
    ol: ["centos", "rhel", "dnf"],
    redos: ["redos", "rhel", "dnf"],
    rosa: ["rosa", "rhel", "dnf"],
    rels: ["rosa", "rhel", "dnf"],
    "opensuse-leap": ["opensuse", "suse", "zypper"],
    "mosos-arbat": ["opensuse", "suse", "zypper"],
    altlinux: ["altlinux", "altlinux", "apt-rpm"],
  };
  t.same(Object.keys(DECKHOUSE_OS_BY_ID).sort(), Object.keys(want).sort(), "no ID more, none less");
  for (const [id, [bundle, family, pm]] of Object.entries(want)) {
    t.same(deckhouseOsOf(id), { bundle, family, packageManager: pm }, id);
  }
  t.equal(deckhouseOsOf("Ubuntu")?.bundle, "ubuntu-lts", "IDs compare case-insensitively");
  t.equal(deckhouseOsOf("gentoo"), undefined);
  t.equal(deckhouseOsOf("constructor"), undefined, "no prototype keys");
  t.same(
    [...new Set(Object.values(DECKHOUSE_OS_BY_ID).map((o) => o.bundle))].sort(),
    [...DECKHOUSE_BUNDLES].sort(),
    "every bundle name has an OS",
  );
});

t.test("the family data the steps use is unchanged: Ubuntu's family is debian, its bundle is not", async (t) => {
  t.equal(familyOf("ubuntu").family, "debian");
  t.equal(deckhouseOsOf("ubuntu")?.bundle, "ubuntu-lts");
});

t.test("spec.bundles selects by bundle name; empty or * selects every OS", async (t) => {
  t.ok(bundlesSelect([], "ubuntu"));
  t.ok(bundlesSelect(["*"], "gentoo"));
  t.ok(bundlesSelect(["ubuntu-lts"], "ubuntu"));
  t.notOk(bundlesSelect(["debian"], "ubuntu"), "Ubuntu is not debian");
  t.notOk(bundlesSelect(["ubuntu-lts"], "debian"));
  t.ok(bundlesSelect(["centos"], "rocky"));
  t.ok(bundlesSelect(["redos", "centos"], "redos"));
  t.notOk(bundlesSelect(["centos"], "gentoo"), "an OS Deckhouse has no bundle for matches no name");
});
