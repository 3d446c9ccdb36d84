// DistributionPackages (000_add_mandatory_packages): the distribution packages the bundle's
// roles need, installed with the node's own package manager from its own mirror
// (bundles/os-families.ts: each family's package names, each manager's commands). The plan asks
// the package database which are missing (dpkg-query, or rpm's list of what installed packages
// provide) and installs exactly those in one transaction after refreshing the lists; a mirror
// that cannot be reached fails the step with a message naming it (steps/checks/package-mirror.sh).
// Packages of held roles (nginx and its stream module: where Deckhouse held them) are held at
// the installed version (apt-mark hold; dnf/yum versionlock, whose plugin comes along; zypper
// addlock; ALT's apt-rpm cannot hold). The distribution's nginx.service, which Debian's package
// enables and starts on port 80, is disabled and stopped: the API proxy runs its own unit.
//
// What this step installed is recorded (`<manager> <package>` lines in
// /var/lib/bashible/distro-packages: the install runs through steps/checks/record-new-packages.sh,
// which adds every package it brought, dependencies included), so cleanup_static_node.sh removes
// exactly that and nothing the machine had before. Under a sandbox root nothing is installed (the commands are
// recorded); packages in that record count as installed there, so the tree converges.
import { asset } from "../lib/assets.ts";
import {
  type BundleFamily,
  DENY_STARTS_MARKER,
  distroPackagesFor,
  FAMILY_PACKAGE_MANAGERS,
  HELD_ROLES,
  PACKAGE_MANAGERS,
  POLICY_RC_D,
  type DistroPackageManager,
  type PackageManagerFacts,
  type PackageRole,
  ROLE_UNITS_TO_DISABLE,
  VERSIONLOCK_PLUGIN,
} from "../bundles/os-families.ts";
import { PATHS } from "../bundles/paths.ts";
import type { Host } from "../host/host.ts";
import { planAbsent, planFile } from "../host/file-plan.ts";
import { unitState } from "./lib/units.ts";
import type { Primitive, Step } from "./types.ts";

export interface PackageState {
  installed: ReadonlySet<string>;
  held: ReadonlySet<string>;
}

/** The family's package manager: the first whose program the machine has (EL7: yum, not dnf). */
export async function packageManagerOf(host: Host): Promise<DistroPackageManager> {
  const candidates = FAMILY_PACKAGE_MANAGERS[host.os.family];
  for (const m of candidates) {
    const p = PACKAGE_MANAGERS[m].program;
    for (const dir of ["/usr/bin", "/bin", "/usr/sbin"]) if ((await host.stat(`${dir}/${p}`))?.isFile) return m;
  }
  return candidates[0] as DistroPackageManager;
}

/** Parses `dpkg-query -W -f '${Package}\t${db:Status-Abbrev}\n'`: "ii " installed, "hi " held and installed. */
export function parseDpkgQuery(out: string): PackageState {
  const installed = new Set<string>();
  const held = new Set<string>();
  for (const line of out.split("\n")) {
    const [name, abbrev] = line.split("\t");
    if (!name || !abbrev) continue;
    if (abbrev[1] === "i") installed.add(name.replace(/:.*$/, ""));
    if (abbrev[0] === "h") held.add(name.replace(/:.*$/, ""));
  }
  return { installed, held };
}

/** Whether a versionlock/locks list holds this package. */
export function heldIn(list: string, pkg: string): boolean {
  const esc = pkg.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  return new RegExp(`(^|[\\s:])(${esc})(-[0-9][^\\s]*)?(\\s|$)`, "m").test(list);
}

async function packageState(
  host: Host,
  m: PackageManagerFacts,
  pkgs: string[],
  recorded: Set<string>,
): Promise<PackageState> {
  if (m.query === "dpkg") {
    const status = "/var/lib/dpkg/status";
    if (host.sandbox && !(await host.exists(status))) return { installed: recorded, held: recorded };
    const admin = host.sandbox ? [`--admindir=${host.path("/var/lib/dpkg")}`] : [];
    // Exit 1 only says some names are unknown; the known ones are printed either way.
    const r = await host.run([
      "dpkg-query",
      ...admin,
      "-W",
      "-f",
      // biome-ignore lint/suspicious/noTemplateCurlyInString: dpkg-query's own format syntax
      "${Package}\\t${db:Status-Abbrev}\\n",
      "--",
      ...pkgs,
    ]);
    if (r.exitCode > 1) throw new Error(`dpkg-query failed (exit ${r.exitCode}): ${r.stderr.trim()}`);
    const s = parseDpkgQuery(r.stdout);
    return host.sandbox
      ? { installed: new Set([...s.installed, ...recorded]), held: new Set([...s.held, ...recorded]) }
      : s;
  }
  if (host.sandbox && !(await host.exists("/var/lib/rpm"))) return { installed: recorded, held: recorded };
  const rootArgs = host.sandbox ? ["--root", host.root] : [];
  const r = await host.run(["rpm", ...rootArgs, "-qa", "--qf", "[%{PROVIDENAME}\\n]"]);
  if (r.exitCode !== 0) throw new Error(`rpm -qa failed (exit ${r.exitCode}): ${r.stderr.trim()}`);
  const provided = new Set(
    r.stdout
      .split("\n")
      .map((l) => l.trim())
      .filter(Boolean),
  );
  const list = m.holdList ? ((await host.readText(m.holdList)) ?? "") : "";
  const installed = new Set(pkgs.filter((p) => provided.has(p) || recorded.has(p)));
  const held = new Set(pkgs.filter((p) => heldIn(list, p) || (host.sandbox && recorded.has(p))));
  return { installed, held };
}

/** The units of roles whose packages this install brings that the step disables afterwards. */
function unitsToDisable(roles: readonly PackageRole[], missing: readonly string[], family: BundleFamily): string[] {
  return roles.flatMap((role) =>
    distroPackagesFor(family, [role]).some((p) => missing.includes(p)) ? [...(ROLE_UNITS_TO_DISABLE[role] ?? [])] : [],
  );
}

const step: Step<"DistributionPackages"> = {
  kind: "DistributionPackages",
  async plan(spec, host) {
    const manager = await packageManagerOf(host);
    const m = PACKAGE_MANAGERS[manager];
    const heldRoles = spec.roles.filter((r) => HELD_ROLES.has(r));
    const toHold = m.hold ? distroPackagesFor(host.os.family, heldRoles) : [];
    const plugin = toHold.length ? VERSIONLOCK_PLUGIN[manager] : undefined;
    const wanted = [...distroPackagesFor(host.os.family, spec.roles), ...(plugin ? [plugin] : [])];
    const recordText = (await host.readText(PATHS.distroPackagesRecord)) ?? "";
    const recordLines = recordText.split("\n").filter(Boolean);
    const recorded = new Set(recordLines.map((l) => l.split(" ")[1] ?? ""));
    const state = await packageState(host, m, wanted, recorded);
    const missing = wanted.filter((p) => !state.installed.has(p));
    const changes: Primitive[] = [];
    const wrap = (argv: readonly string[]) => ["sh", asset("steps/checks/package-mirror.sh"), m.sources, ...argv];
    // Debian's maintainer scripts start what they install; the units this step disables are kept
    // from starting at all (steps/checks/deny-service-starts.sh), so Debian's nginx never takes
    // the node's port 80, not even for the length of the install.
    const denied = m.query === "dpkg" ? unitsToDisable(spec.roles, missing, host.os.family) : [];
    const denyStarts = (argv: readonly string[]) =>
      denied.length ? ["sh", asset("steps/checks/deny-service-starts.sh"), denied.join(","), ...argv] : [...argv];
    if (missing.length) {
      // The names asked for, before the install (the install appends what it really installed,
      // dependencies included; under a sandbox root this is what counts as installed).
      const lines = [...recordLines];
      for (const p of missing) if (!lines.includes(`${manager} ${p}`)) lines.push(`${manager} ${p}`);
      const record = await planFile(host, {
        path: PATHS.distroPackagesRecord,
        content: `${lines.join("\n")}\n`,
        mode: 0o644,
      });
      if (record) changes.push({ ...record, summary: `${record.summary} (what cleanup removes)` });
      changes.push(
        {
          kind: "command",
          argv: wrap(m.refresh),
          env: { ...m.env },
          recordInSandbox: true,
          summary: `refresh the package lists (${manager})`,
        },
        {
          kind: "command",
          argv: [
            "sh",
            asset("steps/checks/record-new-packages.sh"),
            host.path(PATHS.distroPackagesRecord),
            manager,
            m.query,
            ...denyStarts(wrap([...m.install, ...missing])),
          ],
          env: { ...m.env },
          recordInSandbox: true,
          timeoutMs: 20 * 60_000,
          summary: `install ${missing.join(" ")} (${manager})`,
        },
      );
    }
    if (!missing.length) {
      // An install that was killed could not remove the policy-rc.d it ran under.
      const stale = (await host.readText(POLICY_RC_D))?.includes(DENY_STARTS_MARKER);
      const gone = stale ? await planAbsent(host, POLICY_RC_D) : undefined;
      if (gone) changes.push({ ...gone, summary: `${gone.summary} (left by an install that did not finish)` });
    }
    const hold = toHold.filter((p) => !state.held.has(p));
    if (hold.length && m.hold) {
      changes.push({
        kind: "command",
        argv: [...m.hold, ...hold],
        env: { ...m.env },
        recordInSandbox: true,
        summary: `hold ${hold.join(" ")} at the installed version`,
      });
    }
    for (const role of spec.roles) {
      const installing = distroPackagesFor(host.os.family, [role]).some((p) => missing.includes(p));
      for (const unit of ROLE_UNITS_TO_DISABLE[role] ?? []) {
        // Offline (a sandbox) systemctl can only disable a unit file the tree has.
        if (host.sandbox && !(await host.exists(`/lib/systemd/system/${unit}`))) continue;
        const s = await unitState(host, unit);
        // Installing the package enables and starts the unit; the plan cannot see that yet.
        if (!s.enabled && !s.active && !(installing && !host.sandbox)) continue;
        changes.push(
          {
            kind: "unit",
            unit,
            action: "disable",
            summary: `disable ${unit} (the distribution's; the API proxy runs its own nginx)`,
          },
          { kind: "unit", unit, action: "stop", summary: `stop ${unit}` },
        );
      }
    }
    return { changes, problems: [] };
  },
};

export default step;
