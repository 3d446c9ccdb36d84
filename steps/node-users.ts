// NodeUsers (000_add_node_users): the node's local accounts match the cluster's NodeUser
// objects. Users this agent manages carry the GECOS marker "created by deckhouse" (Deckhouse's
// own marker, so its users are adopted); only marked users are ever modified or removed.
//
// A NodeUser owns its home: nothing in it is trusted. Files there are written through the
// host's confined walk (no link is ever followed), and a home whose .ssh or authorized_keys is
// a link, or not what it should be, is a problem for that user and left alone. Every user's
// changes are isolated: one failing user is reported (NodeUser status.errors[<node>]) and the
// others go on. Privilege comes only from isSudoer: extraGroups that grant root are refused.
//
// Accounts are changed with the shadow tools (`--prefix` under a sandbox root). The password
// hash is a secret: it never appears in a plan, an argv, a log line or an error; it reaches
// `chpasswd -e` on stdin at apply time.
import type { NodeUserSpec } from "../bundles/types.ts";
import { NODE_USERS } from "../bundles/paths.ts";
import { PRIVILEGED_GROUPS } from "../bundles/rules.ts";
import type { Host } from "../host/host.ts";
import { planDir, planFile } from "../host/file-plan.ts";
import type { Primitive, Problem, Step, StepContext, UserChange } from "./types.ts";

const {
  marker: MARKER,
  homeBase: HOME_BASE,
  primaryGid: PRIMARY_GID,
  shell: SHELL,
  sudoGroup: SUDO_GROUP,
} = NODE_USERS;
export const SUDOERS_DROP_IN = NODE_USERS.sudoersDropIn;
export const SUDOERS_CONTENT = `# Managed by bashible (000_add_node_users): NodeUsers with isSudoer.\n%${SUDO_GROUP} ALL=(ALL) ALL\n`;
const INCLUDEDIR_RE = /^\s*[#@]includedir\s+\/etc\/sudoers\.d\/?\s*$/m;
const VISUDO_CHECK = ["visudo", "-c", "-q", "-f", "{}"];
/** Stands for the password hash in a planned argv; apply fills it in from the spec. */
const PASSWORD_PLACEHOLDER = "<password hash>";

interface PasswdEntry {
  name: string;
  uid: number;
  gid: number;
  gecos: string;
  home: string;
}

interface Accounts {
  passwd: PasswdEntry[];
  groups: { name: string; gid: number; members: string[] }[];
  /** name → password field of /etc/shadow (a secret: compared, never shown). */
  shadow: Map<string, string>;
}

function parseColonFile(text: string | undefined): string[][] {
  return (text ?? "")
    .split("\n")
    .filter((l) => l.trim() && !l.startsWith("#"))
    .map((l) => l.split(":"));
}

async function readAccounts(host: Host): Promise<Accounts> {
  const [passwd, group, shadow] = await Promise.all([
    host.readText("/etc/passwd"),
    host.readText("/etc/group"),
    host.readText("/etc/shadow"),
  ]);
  return {
    passwd: parseColonFile(passwd).map((f) => ({
      name: f[0] ?? "",
      uid: Number(f[2]),
      gid: Number(f[3]),
      gecos: f[4] ?? "",
      home: f[5] ?? "",
    })),
    groups: parseColonFile(group).map((f) => ({
      name: f[0] ?? "",
      gid: Number(f[2]),
      members: (f[3] ?? "").split(",").filter(Boolean),
    })),
    shadow: new Map(parseColonFile(shadow).map((f) => [f[0] ?? "", f[1] ?? ""])),
  };
}

/** Groups the sudoers files grant (`%group ...`): membership there is root. */
async function sudoGroups(host: Host): Promise<Set<string>> {
  const out = new Set<string>();
  const files = ["/etc/sudoers", ...(await host.listDir("/etc/sudoers.d")).map((f) => `/etc/sudoers.d/${f}`)];
  for (const f of files) {
    const text = await host.readText(f).catch(() => undefined);
    for (const m of text?.matchAll(/^\s*%([A-Za-z0-9_.-]+)\s/gm) ?? []) out.add(m[1] as string);
  }
  return out;
}

const homeOf = (name: string) => `${HOME_BASE}/${name}`;
const isMarked = (p: PasswdEntry) => p.gecos === MARKER || p.gecos.startsWith(`${MARKER},`);
/** What /etc/shadow should hold: the hash, or "*" (no password login; ssh keys still work). */
const wantedPassword = (u: NodeUserSpec) => u.passwordHash || "*";
const authorizedKeys = (u: NodeUserSpec) => (u.sshPublicKeys.length ? `${u.sshPublicKeys.join("\n")}\n` : "");
const subject = (name: string) => `NodeUser ${name}`;

function checkUser(u: NodeUserSpec, groups: Set<string>, privileged: Set<string>): string | undefined {
  // The bundle's schema refuses these already; a step never trusts a spec it did not check.
  if (!Number.isInteger(u.uid) || u.uid <= 1000) {
    return `uid ${u.uid} refused: uids up to 1000 belong to the system and the OS installer's users; use 1001 or more (1100+ recommended)`;
  }
  const missing = u.extraGroups.filter((g) => !groups.has(g));
  if (missing.length) return `extraGroups ${missing.join(", ")} do not exist on this node`;
  if (!u.isSudoer) {
    const root = u.extraGroups.filter((g) => privileged.has(g));
    if (root.length) {
      return `extraGroups ${root.join(", ")} grant root on this node; only isSudoer may do that (the user is left unchanged)`;
    }
  }
  return undefined;
}

/**
 * The home itself, when it is not the user's: useradd commits passwd and shadow, then creates
 * the home as root (mkdir mode 0, chown 0:0, chmod) and only then gives it to the user, so a
 * run killed in between leaves an empty root-owned home the user cannot write (and a useradd
 * run again on that name keeps it as it is). The repair gives it to the user; a home the user
 * owns is theirs, mode included, unless it does not even let them in (a kill before the chmod).
 * A home another user owns is a problem.
 */
async function planHome(
  host: Host,
  u: NodeUserSpec,
  gid: number,
  exists: boolean,
): Promise<Primitive | string | undefined> {
  const home = homeOf(u.name);
  const st = await host.stat(home);
  if (!st) {
    // useradd --create-home makes it; an existing account without one gets a fresh, private one.
    return exists ? planDir(host, home, { mode: 0o700, uid: u.uid, gid }) : undefined;
  }
  if (st.isSymlink || !st.isDirectory) return undefined; // planSshFiles reports it
  if (st.uid === u.uid && (st.mode & 0o700) === 0o700) return undefined;
  if (st.uid !== u.uid && st.uid !== 0) return `${home} belongs to uid ${st.uid}, not ${u.name}; left alone`;
  const mode = (st.mode & 0o700) === 0o700 ? st.mode : 0o700;
  const change = await planDir(host, home, { mode, uid: u.uid, gid });
  if (!change) return undefined;
  return {
    ...change,
    summary: `give ${home} to ${u.name} (${u.uid}:${gid}, 0${mode.toString(8)}; was 0${st.mode.toString(8)} ${st.uid}:${st.gid}, as an interrupted useradd leaves it)`,
  };
}

/** ~/.ssh and authorized_keys, planned through the confined walk; a link there is a problem. */
async function planSshFiles(host: Host, u: NodeUserSpec, gid: number, exists: boolean): Promise<Primitive[] | string> {
  const home = homeOf(u.name);
  const dir = `${home}/.ssh`;
  const file = `${dir}/authorized_keys`;
  for (const p of [home, dir, file]) {
    const st = await host.stat(p);
    if (st?.isSymlink) {
      return `${p} is a symbolic link (to ${await host.fs.readLink(p)}); left alone: remove it and the next run rewrites it`;
    }
    if (st && p !== file && !st.isDirectory) return `${p} is not a directory; left alone`;
    if (st && p === file && !st.isFile) return `${p} is not a regular file; left alone`;
  }
  const changes: Primitive[] = [];
  const h = await planHome(host, u, gid, exists);
  if (typeof h === "string") return h;
  if (h) changes.push(h);
  const d = await planDir(host, dir, { mode: 0o700, uid: u.uid, gid });
  if (d) changes.push(d);
  const f = await planFile(host, { path: file, content: authorizedKeys(u), mode: 0o600, uid: u.uid, gid });
  if (f) changes.push(f);
  return changes;
}

async function plan(spec: { users: NodeUserSpec[] }, host: Host) {
  const acc = await readAccounts(host);
  const changes: (Primitive | UserChange)[] = [];
  const problems: Problem[] = [];
  const prefix = host.sandbox ? ["--prefix", host.root] : [];
  const groupNames = new Set(acc.groups.map((g) => g.name));

  // Node-wide: the sudo group, its sudoers drop-in, sudoers reading the drop-in directory,
  // and a home base nobody but root controls.
  if (!groupNames.has(SUDO_GROUP)) {
    changes.push({
      kind: "command",
      argv: ["groupadd", ...prefix, "--system", SUDO_GROUP],
      summary: `create group ${SUDO_GROUP}`,
    });
    groupNames.add(SUDO_GROUP);
  }
  const sudoersD = await planDir(host, "/etc/sudoers.d", { mode: 0o750 });
  if (sudoersD && sudoersD.action === "create") changes.push(sudoersD);
  const dropIn = await planFile(host, {
    path: SUDOERS_DROP_IN,
    content: SUDOERS_CONTENT,
    mode: 0o440,
    check: VISUDO_CHECK,
  });
  if (dropIn) changes.push(dropIn);
  const sudoers = await host.readText("/etc/sudoers");
  if (sudoers !== undefined && !INCLUDEDIR_RE.test(sudoers)) {
    const st = await host.stat("/etc/sudoers");
    const add = await planFile(host, {
      path: "/etc/sudoers",
      content: `${sudoers}${sudoers.endsWith("\n") || !sudoers ? "" : "\n"}#includedir /etc/sudoers.d\n`,
      mode: st?.mode ?? 0o440,
      check: VISUDO_CHECK,
    });
    if (add) changes.push({ ...add, summary: "add '#includedir /etc/sudoers.d' to /etc/sudoers" });
  }
  const homeBase = await planDir(host, HOME_BASE, { mode: 0o755 });
  if (homeBase) changes.push(homeBase);

  const privileged = new Set([...PRIVILEGED_GROUPS, ...(await sudoGroups(host))]);
  const primary = acc.groups.find((g) => g.gid === PRIMARY_GID);
  const listed = new Set<string>();
  for (const u of spec.users) {
    listed.add(u.name);
    const isolate = subject(u.name);
    const report = (message: string) => problems.push({ subject: isolate, message });
    const invalid =
      checkUser(u, groupNames, privileged) ?? (primary ? undefined : `no group with gid ${PRIMARY_GID} on this node`);
    if (invalid) {
      report(invalid);
      continue;
    }
    const byName = acc.passwd.find((p) => p.name === u.name);
    const byUid = acc.passwd.find((p) => p.uid === u.uid);
    if (byUid && byUid.name !== u.name) {
      report(`uid ${u.uid} belongs to ${isMarked(byUid) ? "" : "unmanaged "}user '${byUid.name}'`);
      continue;
    }
    const groups = [...new Set([...u.extraGroups, ...(u.isSudoer ? [SUDO_GROUP] : [])])].sort();
    // On "/" the hash goes to chpasswd on stdin; chpasswd has no --prefix, so under a sandbox
    // root usermod -p takes it in argv (a test tree's machine, not a node). Either way the plan
    // holds a placeholder, filled in from the spec at apply time.
    const setPassword = host.sandbox
      ? { argv: ["usermod", ...prefix, "-p", PASSWORD_PLACEHOLDER, u.name], stdin: "password" as const }
      : { argv: ["chpasswd", "-e"], stdin: "password" as const };
    if (!byName) {
      const useradd = [
        "useradd",
        ...prefix,
        "--uid",
        String(u.uid),
        "--gid",
        String(PRIMARY_GID),
        "--home-dir",
        homeOf(u.name),
        "--create-home",
        "--shell",
        SHELL,
        "--comment",
        MARKER,
        ...(groups.length ? ["--groups", groups.join(",")] : []),
        u.name,
      ];
      const user: UserChange = {
        kind: "user",
        action: "create",
        name: u.name,
        isolate,
        summary: `create user ${u.name} (uid ${u.uid}, home ${homeOf(u.name)}${groups.length ? `, groups ${groups.join(",")}` : ""}${u.passwordHash ? ", password hash set" : ""})`,
        commands: [{ argv: useradd }, setPassword],
      };
      changes.push(user);
      const ssh = await planSshFiles(host, u, PRIMARY_GID, false);
      if (typeof ssh === "string") report(ssh);
      else changes.push(...ssh.map((c) => ({ ...c, isolate })));
      continue;
    }
    if (!isMarked(byName)) {
      report(`a user '${u.name}' not created by deckhouse exists (GECOS '${byName.gecos}'); it is left alone`);
      continue;
    }
    if (byName.uid !== u.uid) {
      report(`user '${u.name}' exists with uid ${byName.uid}, not ${u.uid}; uids are immutable`);
      continue;
    }
    if (byName.home !== homeOf(u.name) || byName.gid !== PRIMARY_GID) {
      report(
        `user '${u.name}' has home ${byName.home} and gid ${byName.gid}, expected ${homeOf(u.name)} and ${PRIMARY_GID}`,
      );
      continue;
    }
    const ssh = await planSshFiles(host, u, byName.gid, true);
    if (typeof ssh === "string") {
      report(ssh);
      continue;
    }
    const current = acc.groups
      .filter((g) => g.members.includes(u.name))
      .map((g) => g.name)
      .sort();
    const notes: string[] = [];
    const commands: UserChange["commands"] = [];
    if (current.join(",") !== groups.join(",")) {
      notes.push(`groups ${current.join(",") || "(none)"} → ${groups.join(",") || "(none)"}`);
      commands.push({ argv: ["usermod", ...prefix, "--groups", groups.join(","), u.name] });
    }
    if (acc.shadow.get(u.name) !== wantedPassword(u)) {
      notes.push(u.passwordHash ? "password hash changes" : "password login removed");
      commands.push(setPassword);
    }
    if (commands.length) {
      changes.push({
        kind: "user",
        action: "update",
        name: u.name,
        isolate,
        summary: `update user ${u.name}: ${notes.join("; ")}`,
        commands,
      });
    }
    changes.push(...ssh.map((c) => ({ ...c, isolate })));
  }

  for (const p of acc.passwd) {
    if (listed.has(p.name) || !isMarked(p) || p.uid <= 1000) continue;
    changes.push({
      kind: "user",
      action: "delete",
      name: p.name,
      isolate: subject(p.name),
      summary: `remove user ${p.name} (uid ${p.uid}) and ${p.home}`,
      killUid: p.uid,
      commands: [{ argv: ["userdel", ...prefix, "--remove", p.name] }],
    });
  }
  return { changes, problems };
}

/** A removed user's processes go first, so nothing of theirs races userdel through their home. */
async function killProcesses(host: Host, name: string, uid: number, ctx: StepContext): Promise<void> {
  if (host.sandbox) {
    ctx.log.info({ user: name }, "sandbox: not killing the user's processes (the uid is the real machine's)");
    return;
  }
  for (let i = 0; i < 50; i++) {
    const left = await host.run(["pgrep", "-U", String(uid)]);
    if (left.exitCode !== 0) return;
    await host.run(["pkill", "-KILL", "-U", String(uid)]);
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`processes of user ${name} (uid ${uid}) survive SIGKILL`);
}

/** Writes (or clears) this node's entry in NodeUser status.errors; never fails the step. */
async function reportStatus(ctx: StepContext, name: string, error: string | null): Promise<void> {
  if (!ctx.kube) return;
  try {
    await ctx.kube.request("PATCH", `/apis/deckhouse.io/v1/nodeusers/${encodeURIComponent(name)}/status`, {
      body: { status: { errors: { [ctx.nodeName]: error } } },
    });
  } catch (err) {
    ctx.log.warn({ user: name, err: (err as Error).message }, "could not update NodeUser status");
  }
}

const step: Step<"NodeUsers", Primitive | UserChange> = {
  kind: "NodeUsers",
  plan: (spec, host) => plan(spec, host),
  async applyOwn(c, spec, host, ctx) {
    if (c.killUid !== undefined) await killProcesses(host, c.name, c.killUid, ctx);
    const user = spec.users.find((u) => u.name === c.name);
    for (const cmd of c.commands) {
      if (cmd.stdin === "password") {
        if (!user) throw new Error(`no NodeUser ${c.name} in the spec`);
        const hash = wantedPassword(user);
        const argv = cmd.argv.map((a) => (a === PASSWORD_PLACEHOLDER ? hash : a));
        const input = argv.includes(hash) ? undefined : `${user.name}:${hash}\n`;
        await host.mustRun(argv, {
          ...(input ? { input } : {}),
          secrets: [...ctx.secrets, hash],
          logFile: ctx.logFile,
        });
      } else {
        await host.mustRun(cmd.argv, { logFile: ctx.logFile, secrets: ctx.secrets });
      }
    }
  },
  secrets: (spec) => spec.users.flatMap((u) => (u.passwordHash ? [u.passwordHash] : [])),
  async report(problems, spec, ctx) {
    for (const u of spec.users) {
      const mine = problems.filter((p) => p.subject === subject(u.name)).map((p) => p.message);
      await reportStatus(ctx, u.name, mine.length ? mine.join("; ") : null);
    }
  },
};

export default step;
