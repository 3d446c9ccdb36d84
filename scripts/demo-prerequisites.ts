// The programs `npm run demo` needs on the machine, and the Debian packages that bring them.
//
//   node scripts/demo-prerequisites.ts           root: install what is missing; else name it
//   node scripts/demo-prerequisites.ts --check   only report; exit 1 when something is missing
//
// The list comes from reading what the demo runs: the demo itself (the OCI registry, the test
// PKI, packing registry packages) and the steps its bundle holds (NodeUsers, CACertificates,
// DeckhousePath, RegistryPackages, one Script, BashibleService). Programs every Debian system has (sh, coreutils)
// are not listed. This file imports nothing but Node's built-ins: it runs on its own, on a bare
// machine, before anything else of the demo loads.
//
// Installing changes the machine no more than the demo needs: Debian enables and starts
// docker-registry's own service on install (serving :5000 on every interface); the demo runs
// its own registry on loopback, so the install runs under a policy-rc.d that starts nothing and
// the service of a package the machine did not have is left disabled and stopped afterwards.
import { spawnSync } from "node:child_process";
import { accessSync, constants, existsSync, readFileSync, unlinkSync, writeFileSync } from "node:fs";
import path from "node:path";

export interface Prerequisite {
  program: string;
  /** Debian package that ships it. */
  pkg: string;
  /** Who runs it, for the message. */
  usedBy: string;
  /**
   * The package's own service, which Debian enables and starts on install; the demo does not
   * want it (it runs the program itself) and leaves it as the machine had it: not running.
   */
  service?: { name: string; why: string };
}

export const DEMO_PREREQUISITES: readonly Prerequisite[] = [
  {
    program: "docker-registry",
    pkg: "docker-registry",
    usedBy: "the demo's OCI registry (its own, on 127.0.0.1)",
    service: { name: "docker-registry", why: "it would serve :5000 on every interface, without authentication" },
  },
  { program: "openssl", pkg: "openssl", usedBy: "the demo's PKI (cluster CA, proxy and node certificates)" },
  { program: "tar", pkg: "tar", usedBy: "packing registry packages; RegistryPackages unpacks them" },
  { program: "gzip", pkg: "gzip", usedBy: "tar -z (registry package layers)" },
  { program: "bash", pkg: "bash", usedBy: "registry package install scripts; Script steps" },
  { program: "useradd", pkg: "passwd", usedBy: "NodeUsers" },
  { program: "usermod", pkg: "passwd", usedBy: "NodeUsers" },
  { program: "userdel", pkg: "passwd", usedBy: "NodeUsers" },
  { program: "groupadd", pkg: "passwd", usedBy: "NodeUsers (the sudo group)" },
  { program: "visudo", pkg: "sudo", usedBy: "NodeUsers (checks the sudoers drop-in)" },
  { program: "update-ca-certificates", pkg: "ca-certificates", usedBy: "CACertificates" },
  { program: "systemctl", pkg: "systemd", usedBy: "BashibleService (enables bashible.service offline in the sandbox)" },
  { program: "systemd-analyze", pkg: "systemd", usedBy: "BashibleService (checks the agent's units)" },
  // Its daily timer, enabled on install, rotates what the machine's own packages ask: what a
  // Debian machine with logrotate does anyway, nothing of the demo's.
  {
    program: "logrotate",
    pkg: "logrotate",
    usedBy: "LogRotation (checks the step logs' rotation file before installing it)",
  },
];
// Not listed, on purpose: chpasswd, pgrep and pkill (passwd, procps) run only on a real root,
// never in the demo's sandbox; sysctl only when a Script runs on "/".

const SEARCH = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"];

/** Finds a program on PATH or in the usual system directories (a user's PATH often lacks sbin). */
export function findProgram(program: string): string | undefined {
  const dirs = [...(process.env.PATH ?? "").split(":").filter(Boolean), ...SEARCH];
  for (const dir of dirs) {
    const p = path.join(dir, program);
    try {
      accessSync(p, constants.X_OK);
      return p;
    } catch {
      // next
    }
  }
  return undefined;
}

export function missingPrerequisites(list: readonly Prerequisite[] = DEMO_PREREQUISITES): Prerequisite[] {
  return list.filter((p) => !findProgram(p.program));
}

const packagesOf = (list: readonly Prerequisite[]) => [...new Set(list.map((p) => p.pkg))].sort();

/** What is missing, as a person would want it said. */
export function describeMissing(missing: readonly Prerequisite[]): string {
  const lines = missing.map((p) => `  ${p.program} (Debian package ${p.pkg}): ${p.usedBy}`);
  return [
    `the demo needs programs this machine lacks:`,
    ...lines,
    `install them as root: apt-get install -y --no-install-recommends ${packagesOf(missing).join(" ")}`,
  ].join("\n");
}

/** Whether dpkg has the package installed (not merely known or removed). */
function installed(pkg: string): boolean {
  // biome-ignore lint/suspicious/noTemplateCurlyInString: dpkg-query's format syntax, not a template
  const r = spawnSync("dpkg-query", ["-W", "-f=${Status}", pkg], { encoding: "utf8" });
  return r.status === 0 && r.stdout.trim().endsWith(" installed");
}

const POLICY = "/usr/sbin/policy-rc.d";
const POLICY_MARK = "# written by bashible's npm run demo for one apt-get install; pid ";

/**
 * Debian's way of keeping a package's install from starting its services (man invoke-rc.d):
 * while it exists and exits 101, maintainer scripts start nothing, under systemd or not. Written
 * only when the machine has no policy of its own; one left by a demo that was killed is removed.
 * Returns the function that removes it again.
 */
function holdServices(log: (s: string) => void): () => void {
  if (existsSync(POLICY)) {
    const text = readFileSync(POLICY, "utf8");
    const pid = Number(text.split(POLICY_MARK)[1]?.split("\n")[0]);
    const alive = Number.isInteger(pid) && existsSync(`/proc/${pid}`);
    if (!text.includes(POLICY_MARK) || alive) return () => undefined; // the machine's own policy decides
    log(`demo: removing ${POLICY} left by an interrupted demo (pid ${pid})`);
    unlinkSync(POLICY);
  }
  writeFileSync(POLICY, `#!/bin/sh\n${POLICY_MARK}${process.pid}\nexit 101\n`, { mode: 0o755 });
  return () => {
    if (readFileSync(POLICY, "utf8").includes(`${POLICY_MARK}${process.pid}\n`)) unlinkSync(POLICY);
  };
}

/**
 * A service the install just enabled goes back to what it was before the package: disabled and
 * stopped. Only for packages this run installed; one the machine had keeps its state.
 */
function leaveServiceOff(service: { name: string; why: string }, log: (s: string) => void): void {
  const quiet = { stdio: "ignore" } as const;
  if (existsSync("/run/systemd/system")) {
    spawnSync("systemctl", ["disable", "--now", "--quiet", `${service.name}.service`], quiet);
  } else {
    // No systemd running: the sysv script (held back by policy-rc.d, unless the machine's own
    // policy let it start) and the boot-time links of both init systems.
    if (existsSync(`/etc/init.d/${service.name}`)) {
      spawnSync(`/etc/init.d/${service.name}`, ["stop"], quiet);
      spawnSync("update-rc.d", [service.name, "disable"], quiet);
    }
    if (findProgram("deb-systemd-helper"))
      spawnSync("deb-systemd-helper", ["disable", `${service.name}.service`], quiet);
  }
  log(`demo: left ${service.name}'s own service disabled and stopped (${service.why}); the demo runs its own`);
}

function aptGet(args: string[], log: (s: string) => void): boolean {
  log(`$ apt-get ${args.join(" ")}`);
  const r = spawnSync("apt-get", args, {
    stdio: ["ignore", "inherit", "inherit"],
    env: { ...process.env, DEBIAN_FRONTEND: "noninteractive" },
  });
  return r.status === 0;
}

/**
 * Makes sure every prerequisite is there: as root installs the missing packages with apt-get
 * (refreshing the package lists once if a package is not found), otherwise throws naming the
 * packages. Returns the packages it installed.
 */
export function ensurePrerequisites(
  opts: { list?: readonly Prerequisite[]; log?: (s: string) => void } = {},
): string[] {
  const list = opts.list ?? DEMO_PREREQUISITES;
  const log = opts.log ?? ((s: string) => console.log(s));
  const missing = missingPrerequisites(list);
  if (missing.length === 0) return [];
  if (process.getuid?.() !== 0) throw new Error(describeMissing(missing));
  if (!findProgram("apt-get")) {
    throw new Error(`${describeMissing(missing)}\n(no apt-get here: install the equivalent packages by hand)`);
  }
  const pkgs = packagesOf(missing);
  log(`demo: installing Debian packages ${pkgs.join(", ")} (for ${missing.map((p) => p.program).join(", ")})`);
  const install = ["install", "-y", "-q", "--no-install-recommends", ...pkgs];
  // Services of packages the machine did not have stay off, from the install on.
  const services = missing.filter((p) => p.service && !installed(p.pkg)).map((p) => p.service) as {
    name: string;
    why: string;
  }[];
  const release = services.length > 0 ? holdServices(log) : () => undefined;
  try {
    // A fresh machine may have no package lists yet ("Unable to locate package"): update, retry.
    if (!aptGet(install, log) && !(aptGet(["update", "-q"], log) && aptGet(install, log))) {
      throw new Error(`apt-get install ${pkgs.join(" ")} failed\n${describeMissing(missing)}`);
    }
  } finally {
    release();
  }
  for (const service of services) leaveServiceOff(service, log);
  const still = missingPrerequisites(list);
  if (still.length > 0) throw new Error(`installed ${pkgs.join(" ")}, yet:\n${describeMissing(still)}`);
  return pkgs;
}

if (import.meta.main) {
  const check = process.argv.includes("--check");
  const missing = missingPrerequisites();
  if (check || missing.length === 0) {
    if (missing.length > 0) {
      console.error(describeMissing(missing));
      process.exit(1);
    }
    console.log(`demo prerequisites: all present (${DEMO_PREREQUISITES.map((p) => p.program).join(", ")})`);
    process.exit(0);
  }
  try {
    const installed = ensurePrerequisites();
    console.log(`demo prerequisites: installed ${installed.join(", ")}; all present`);
  } catch (err) {
    console.error(`demo: ${(err as Error).message}`);
    process.exit(1);
  }
}
