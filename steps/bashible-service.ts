// BashibleService (080_setup_bashible_service): the agent itself.
//
// - Self-update. The bundle pins the agent package. When it differs from the running release,
//   the package is downloaded and verified like any registry package (manifest and layer
//   digests), its install runs into a release directory of its own
//   (/opt/deckhouse/lib/bashible-releases/<digest hex>/, as its D8_ROOT), and the new agent is
//   run in check mode there: `bashible version`, then `bashible plan` against this very bundle
//   and node (local mode, read-only). Only when both succeed does /opt/deckhouse/lib/bashible, a
//   symlink, flip to the new release (one rename: atomic); the previous release stays for a
//   rollback by hand (`ln -sfn bashible-releases/<hex>/opt/deckhouse/lib/bashible
//   /opt/deckhouse/lib/bashible`), older ones are removed. A release that fails its check is
//   refused: the reason is reported (a problem of this step, in status and the step log) and the
//   running agent stays; the same package is not tried again with the same bundle.
//   The first update turns the tree bootstrap installed (a directory) into the link.
// - bashible.service and bashible-restart.service (systemd/), checked with systemd-analyze verify,
//   enabled and started. A new release or unit reloads bashible.service, which restarts it once
//   the converge in flight has finished (a converge cannot restart the daemon it runs under).
// - /var/lib/bashible/cleanup_static_node.sh from the bundle, rewritten on every run.
import { readFileSync } from "node:fs";
import { asset } from "../lib/assets.ts";
import { PATHS } from "../bundles/paths.ts";
import { UNITS } from "../bundles/steps/index.ts";
import type { BashibleServiceSpec, RegistryPackageRef } from "../bundles/types.ts";
import type { Host } from "../host/host.ts";
import { planDir, planFile } from "../host/file-plan.ts";
import type { PackageChange, Primitive, Problem, Step, StepContext } from "./types.ts";
import { planUnit, reloadUnlessPlanned, start, unitCheck, unitPath } from "./lib/units.ts";

const AGENT_DIR = PATHS.agentDir;
const RELEASES = PATHS.agentReleases;
const UNIT = UNITS.agent;
const RESTART_UNIT = UNITS.agentRestart;
const ISOLATE = "agent update";
/** Inside a release (its D8_ROOT), where the package put the agent's tree. */
const TREE = AGENT_DIR;
/** Written into a release once its check passed. */
const CHECKED = "checked";

export const LAUNCHER_CONTENT = `#!/bin/sh\nexec ${AGENT_DIR}/bashible "$@"\n`;

const hexOf = (digest: string) => digest.slice("sha256:".length);
const short = (digest: string | undefined) => (digest ? digest.slice(0, 19) : "(none)");
export const releaseDir = (digest: string) => `${RELEASES}/${hexOf(digest)}`;
/** The link's target for a release (relative, so a sandbox tree stays self-contained). */
export const linkTarget = (digest: string) => `bashible-releases/${hexOf(digest)}${TREE}`;
const refusedFile = (digest: string) => `${RELEASES}/${hexOf(digest)}.refused`;

/** The running release: the link's target, or the bootstrap's tree and the digest it recorded. */
export async function installedAgent(
  host: Host,
  pkg: string,
): Promise<{ digest?: string; form: "link" | "tree" | "absent" }> {
  const st = await host.stat(AGENT_DIR);
  if (st?.isSymlink) {
    const target = (await host.fs.readLink(AGENT_DIR)) ?? "";
    const m = target.match(/^bashible-releases\/([0-9a-f]{64})\//);
    return { digest: m ? `sha256:${m[1]}` : undefined, form: "link" };
  }
  if (st?.isDirectory) {
    const recorded = (await host.readText(`${PATHS.packageStore}/${pkg}/digest`))?.trim();
    return { digest: recorded || undefined, form: "tree" };
  }
  return { form: "absent" };
}

interface Refusal {
  bundle: string;
  reason: string;
  at: string;
}

async function refusal(host: Host, digest: string, bundle: string): Promise<Refusal | undefined> {
  const text = await host.readText(refusedFile(digest));
  if (!text) return undefined;
  try {
    const r = JSON.parse(text) as Refusal;
    return r.bundle === bundle ? r : undefined;
  } catch {
    return undefined;
  }
}

const unitText = (unit: string) => readFileSync(asset(`systemd/${unit}`), "utf8");

async function planAgentUpdate(
  spec: BashibleServiceSpec,
  host: Host,
  ctx: StepContext,
): Promise<{ changes: (Primitive | PackageChange)[]; problems: Problem[]; installedAfter: boolean }> {
  const ref = spec.agent;
  const installed = await installedAgent(host, ref.name);
  if (installed.digest === ref.digest) return { changes: [], problems: [], installedAfter: true };
  const refused = await refusal(host, ref.digest, ctx.bundle.checksum);
  if (refused) {
    return {
      changes: [],
      problems: [
        {
          subject: ISOLATE,
          message: `agent ${short(ref.digest)} was refused at ${refused.at}: ${refused.reason}; ${installed.form === "absent" ? "no agent is installed" : `the running agent ${short(installed.digest)} stays`} (a new bundle, or removing ${refusedFile(ref.digest)}, tries again)`,
        },
      ],
      installedAfter: installed.form !== "absent",
    };
  }
  const changes: (Primitive | PackageChange)[] = [
    {
      kind: "package",
      action: installed.form === "absent" ? "install" : "upgrade",
      name: ref.name,
      digest: ref.digest,
      repository: ref.repository,
      isolate: ISOLATE,
      summary: `${installed.form === "absent" ? "install" : `update`} the agent ${installed.form === "absent" ? "" : `${short(installed.digest)} → `}${short(ref.digest)} from ${ref.repository} into ${releaseDir(ref.digest)}, checked with 'bashible version' and 'bashible plan' before it is used`,
    },
    {
      kind: "symlink",
      path: AGENT_DIR,
      action: installed.form === "absent" ? "create" : "update",
      target: linkTarget(ref.digest),
      isolate: ISOLATE,
      summary: `point ${AGENT_DIR} → ${linkTarget(ref.digest)} (the checked release)${installed.form === "link" ? "; the previous release is kept" : ""}`,
    },
  ];
  const record = await planFile(host, {
    path: `${PATHS.packageStore}/${ref.name}/digest`,
    content: `${ref.digest}\n`,
    mode: 0o644,
  });
  if (record) changes.push({ ...record, isolate: ISOLATE });
  return { changes, problems: [], installedAfter: installed.form !== "absent" };
}

/** Runs a package's install with its own D8_ROOT (the release directory). */
/** The package library, loaded only when an update runs (its download brings the HTTP client). */
const packageFetch = () => import("./lib/package-fetch.ts");
const packageStore = () => import("./lib/package-store.ts");

async function installInto(
  host: Host,
  ctx: StepContext,
  ref: RegistryPackageRef,
  archive: string,
  release: string,
): Promise<void> {
  // The release directory is the package's root: its install puts the agent under it.
  await (await packageStore()).unpackAndInstall(host, ctx, ref, archive, {
    d8Root: await host.fs.realPath(release),
    needUninstall: false,
  });
}

/** `bashible version` and `bashible plan` of the staged release against this bundle and node. */
async function checkRelease(host: Host, ctx: StepContext, release: string): Promise<void> {
  const bin = `${await host.fs.realPath(release)}${TREE}/bashible`;
  if (!(await host.stat(`${release}${TREE}/bashible`))?.isFile) {
    throw new Error(`the package did not install ${TREE}/bashible (looked in ${release})`);
  }
  const tail = (r: { stdout: string; stderr: string }) =>
    (r.stderr.trim() || r.stdout.trim()).split("\n").slice(-3).join(" | ");
  const version = await host.run([bin, "version"], {
    timeoutMs: 60_000,
    logFile: ctx.logFile,
    secrets: ctx.secrets,
    ...(ctx.signal ? { signal: ctx.signal } : {}),
  });
  if (version.exitCode !== 0 || version.killed) {
    throw new Error(
      `'bashible version' of the new agent ${version.killed ? `was killed (${version.killed})` : `exited ${version.exitCode}`}: ${tail(version)}`,
    );
  }
  const bundleFile = `${release}/check-bundle.json`;
  await host.writeFile(bundleFile, JSON.stringify(ctx.bundle), { mode: 0o600 });
  try {
    const plan = await host.run(
      [
        bin,
        "plan",
        "--root",
        host.root,
        "--bundle",
        await host.fs.realPath(bundleFile),
        "--node-name",
        ctx.nodeName,
        "--node-group",
        ctx.nodeGroup,
        "--log-level",
        "error",
      ],
      {
        timeoutMs: 5 * 60_000,
        logFile: ctx.logFile,
        secrets: ctx.secrets,
        ...(ctx.signal ? { signal: ctx.signal } : {}),
      },
    );
    // 0: in sync, 2: changes pending (this very update, at least). 1: it could not plan.
    if ((plan.exitCode !== 0 && plan.exitCode !== 2) || plan.killed) {
      throw new Error(
        `'bashible plan' of the new agent against this bundle ${plan.killed ? `was killed (${plan.killed})` : `exited ${plan.exitCode}`}: ${tail(plan)}`,
      );
    }
  } finally {
    await host.remove(bundleFile);
  }
}

/** Keeps the new release and the running one; removes older releases and stale refusals. */
async function prune(host: Host, keep: Set<string>): Promise<void> {
  for (const name of await host.listDir(RELEASES)) {
    const hex = name.replace(/\.refused$/, "");
    if (keep.has(hex) || name.startsWith(".")) continue;
    if (!/^[0-9a-f]{64}(\.refused)?$/.test(name)) continue;
    await host.remove(`${RELEASES}/${name}`, { recursive: true });
  }
}

async function updateAgent(spec: BashibleServiceSpec, host: Host, ctx: StepContext): Promise<void> {
  const ref = spec.agent;
  const release = releaseDir(ref.digest);
  const installed = await installedAgent(host, ref.name);
  await host.mkdir(RELEASES, { mode: 0o755 });
  if (!(await host.exists(`${release}/${CHECKED}`))) {
    await host.remove(release, { recursive: true });
    const { fetchPackage, proxyOf } = await packageFetch();
    const archive = await fetchPackage(host, { log: ctx.log, signal: ctx.signal, proxy: proxyOf(ctx) }, ref);
    try {
      await host.mkdir(release, { mode: 0o755 });
      await installInto(host, ctx, ref, archive, release);
      await checkRelease(host, ctx, release);
    } catch (err) {
      const reason = (err as Error).message;
      await host.remove(release, { recursive: true }).catch(() => undefined);
      // A failed download is not the release's fault: only a failed install or check refuses it.
      if (!ctx.signal?.aborted) {
        const r: Refusal = { bundle: ctx.bundle.checksum, reason, at: new Date().toISOString() };
        await host.writeFile(refusedFile(ref.digest), `${JSON.stringify(r)}\n`, { mode: 0o644 });
      }
      throw new Error(`the new agent ${short(ref.digest)} was refused; the running agent stays: ${reason}`);
    } finally {
      await host.remove(archive).catch(() => undefined);
    }
    await host.writeFile(`${release}/${CHECKED}`, `${new Date().toISOString()}\n`, { mode: 0o644 });
    ctx.log.info({ digest: ref.digest, release }, "new agent release passed its check");
  }
  const keep = new Set([hexOf(ref.digest)]);
  if (installed.form === "tree") {
    // The bootstrap's tree becomes a release, so the link can take its place.
    const previous = installed.digest ?? `sha256:${"0".repeat(64)}`;
    const dest = `${releaseDir(previous)}${TREE}`;
    await host.remove(releaseDir(previous), { recursive: true });
    await host.mkdir(`${releaseDir(previous)}/opt/deckhouse/lib`, { mode: 0o755 });
    await host.mustRun(["mv", "-T", await host.fs.realPath(AGENT_DIR), await host.fs.realPath(dest)], {
      logFile: ctx.logFile,
    });
    await host.symlink(AGENT_DIR, linkTarget(previous));
    keep.add(hexOf(previous));
  } else if (installed.digest) keep.add(hexOf(installed.digest));
  await prune(host, keep);
}

const step: Step<"BashibleService", Primitive | PackageChange> = {
  kind: "BashibleService",
  async plan(spec, host, ctx) {
    const changes: (Primitive | PackageChange)[] = [];
    const problems: Problem[] = [];
    const update = await planAgentUpdate(spec, host, ctx);
    if (update.changes.length) {
      const dir = await planDir(host, RELEASES, { mode: 0o755 });
      if (dir) changes.push(dir);
    }
    changes.push(...update.changes);
    problems.push(...update.problems);
    const launcher = await planFile(host, { path: PATHS.agentLauncher, content: LAUNCHER_CONTENT, mode: 0o755 });
    if (launcher) changes.push(launcher);
    const cleanup = await planFile(host, { path: PATHS.cleanupScript, content: spec.cleanupScript, mode: 0o700 });
    if (cleanup) changes.push(cleanup);
    if (!update.installedAfter && update.changes.length === 0) {
      problems.push({ subject: UNIT, message: `no agent is installed at ${AGENT_DIR}; ${UNIT} is not set up` });
      return { changes, problems };
    }
    // Units go after the release: their check wants the program they start to exist.
    const isolate = update.installedAfter ? {} : { isolate: ISOLATE };
    const restart = await planFile(host, {
      path: unitPath(RESTART_UNIT),
      content: unitText(RESTART_UNIT),
      mode: 0o644,
      check: unitCheck(host, RESTART_UNIT),
    });
    if (restart) changes.push({ ...restart, ...isolate });
    const unit = await planUnit(host, UNIT, unitText(UNIT));
    if (restart) {
      const reload = reloadUnlessPlanned(unit.changes, RESTART_UNIT, `${RESTART_UNIT} changed`);
      changes.push(...reload.map((c) => ({ ...c, ...isolate })));
    }
    changes.push(...unit.changes.map((c) => ({ ...c, ...isolate })));
    if (!unit.state.active) changes.push({ ...start(UNIT), ...isolate });
    return { changes, problems };
  },
  async applyOwn(change, spec, host, ctx) {
    if (change.kind !== "package" || change.digest !== spec.agent.digest) {
      throw new Error(`BashibleService: a '${change.kind}' change it did not plan`);
    }
    await updateAgent(spec, host, ctx);
  },
  services: () => [{ unit: UNIT, reads: [AGENT_DIR, PATHS.agentLauncher, unitPath(UNIT)], onChange: "reload" }],
};

export default step;
