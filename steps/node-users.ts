// NodeUsers: the node's local accounts match the cluster's NodeUser objects. Users this agent
// manages carry the GECOS marker "created by deckhouse" (Deckhouse's own marker, so its users
// are adopted); only marked users are ever modified or removed, and a name or uid that clashes
// with an unmarked account is reported, never overwritten. One user's failure does not stop
// the others or fail the step: it becomes a warning and `status.errors[<node>]` on its NodeUser.
//
// Accounts are changed with the shadow tools (useradd/usermod/userdel/groupadd, `--prefix` for
// a sandbox tree); the password hash is a secret: it never appears in a plan, a log line, an
// error or a step log (on a real root it goes to `chpasswd -e` on stdin).
import type { NodeUserSpec } from "../bundles/types.ts";
import { CommandError, type Host } from "../agent/host/host.ts";
import { applyFileChange, planFile } from "../agent/host/file-plan.ts";
import type { Change, CommandChange, DirChange, FileChange, Step, StepContext, UserChange } from "./types.ts";

export const MARKER = "created by deckhouse";
export const HOME_BASE = "/home/deckhouse";
export const PRIMARY_GID = 100;
export const SHELL = "/bin/bash";
export const SUDO_GROUP = "nodeadmin";
export const SUDOERS_DROP_IN = "/etc/sudoers.d/30-deckhouse-nodeadmins";
export const SUDOERS_CONTENT = `# Managed by bashible (NodeUsers step): NodeUsers with isSudoer.\n%${SUDO_GROUP} ALL=(ALL) ALL\n`;
const INCLUDEDIR_RE = /^\s*[#@]includedir\s+\/etc\/sudoers\.d\/?\s*$/m;
const NAME_RE = /^[a-z_][a-z0-9_-]{0,31}$/;

interface PasswdEntry {
  name: string;
  uid: number;
  gid: number;
  gecos: string;
  home: string;
  shell: string;
}

interface GroupEntry {
  name: string;
  gid: number;
  members: string[];
}

interface Accounts {
  passwd: PasswdEntry[];
  groups: GroupEntry[];
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
      shell: f[6] ?? "",
    })),
    groups: parseColonFile(group).map((f) => ({
      name: f[0] ?? "",
      gid: Number(f[2]),
      members: (f[3] ?? "").split(",").filter(Boolean),
    })),
    shadow: new Map(parseColonFile(shadow).map((f) => [f[0] ?? "", f[1] ?? ""])),
  };
}

const homeOf = (name: string) => `${HOME_BASE}/${name}`;
const isMarked = (p: PasswdEntry) => p.gecos === MARKER || p.gecos.startsWith(`${MARKER},`);
/** What /etc/shadow should hold: the hash, or "*" (no password login; ssh keys still work). */
const wantedPassword = (u: NodeUserSpec) => u.passwordHash || "*";
const authorizedKeys = (u: NodeUserSpec) => (u.sshPublicKeys.length ? `${u.sshPublicKeys.join("\n")}\n` : "");

/** Data a user change carries to apply: never the hash itself. */
type UserData = {
  uid?: number;
  groups?: string[];
  setGroups?: boolean;
  setPassword?: boolean;
  error?: string;
};

function userChange(action: UserChange["action"], name: string, summary: string, data: UserData): UserChange {
  return { kind: "user", action, name, summary, data };
}

/** Ownership of a change: the user it belongs to, or undefined for node-wide changes. */
function ownerOf(c: Change): string | undefined {
  if (c.kind === "user") return c.name;
  if ((c.kind === "file" || c.kind === "dir") && c.path.startsWith(`${HOME_BASE}/`)) {
    return c.path.slice(HOME_BASE.length + 1).split("/")[0];
  }
  return undefined;
}

function validateUser(u: NodeUserSpec, groups: Set<string>): string | undefined {
  if (!NAME_RE.test(u.name)) return `'${u.name}' is not a valid user name`;
  if (!Number.isInteger(u.uid) || u.uid <= 1000) {
    return `uid ${u.uid} refused: uids up to 1000 belong to the system and the OS installer's users; use 1001 or more (1100+ recommended)`;
  }
  for (const k of u.sshPublicKeys) if (k.includes("\n")) return "an SSH public key contains a line break";
  if (u.passwordHash?.includes(":") || u.passwordHash?.includes("\n"))
    return "passwordHash is not in /etc/shadow format";
  const missing = u.extraGroups.filter((g) => !groups.has(g));
  if (missing.length) return `extraGroups ${missing.join(", ")} do not exist on this node`;
  return undefined;
}

async function planSshFiles(host: Host, u: NodeUserSpec, gid: number): Promise<Change[]> {
  const changes: Change[] = [];
  const dir = `${homeOf(u.name)}/.ssh`;
  const st = await host.stat(dir);
  if (!st?.isDirectory || st.mode !== 0o700 || st.uid !== u.uid || st.gid !== gid) {
    const c: DirChange = {
      kind: "dir",
      path: dir,
      action: st ? "update" : "create",
      mode: 0o700,
      uid: u.uid,
      gid,
      summary: st ? `set ${dir} to 0700 ${u.uid}:${gid}` : `create ${dir} (0700, ${u.uid}:${gid})`,
    };
    changes.push(c);
  }
  const file = await planFile(host, {
    path: `${dir}/authorized_keys`,
    content: authorizedKeys(u),
    mode: 0o600,
    uid: u.uid,
    gid,
  });
  if (file) changes.push(file);
  return changes;
}

async function plan(spec: { users: NodeUserSpec[] }, host: Host): Promise<Change[]> {
  const acc = await readAccounts(host);
  const changes: Change[] = [];
  const groupNames = new Set(acc.groups.map((g) => g.name));

  // Node-wide: the sudo group, its sudoers drop-in, and sudoers reading the drop-in directory.
  if (!groupNames.has(SUDO_GROUP)) {
    const c: CommandChange = {
      kind: "command",
      argv: ["groupadd", "--system", SUDO_GROUP],
      summary: `create group ${SUDO_GROUP}`,
    };
    changes.push(c);
    groupNames.add(SUDO_GROUP);
  }
  const dropIn = await planFile(host, { path: SUDOERS_DROP_IN, content: SUDOERS_CONTENT, mode: 0o440 });
  if (dropIn) changes.push(dropIn);
  const sudoers = await host.readText("/etc/sudoers");
  if (sudoers !== undefined && !INCLUDEDIR_RE.test(sudoers)) {
    const st = await host.stat("/etc/sudoers");
    const add = await planFile(host, {
      path: "/etc/sudoers",
      content: `${sudoers}${sudoers.endsWith("\n") || !sudoers ? "" : "\n"}#includedir /etc/sudoers.d\n`,
      mode: st?.mode ?? 0o440,
    });
    if (add) changes.push({ ...add, summary: "add '#includedir /etc/sudoers.d' to /etc/sudoers" });
  }

  const primary = acc.groups.find((g) => g.gid === PRIMARY_GID);
  const listed = new Set<string>();
  for (const u of spec.users) {
    listed.add(u.name);
    const report = (error: string) =>
      changes.push(userChange("update", u.name, `NodeUser ${u.name}: ${error} (reported, nothing changed)`, { error }));
    const invalid =
      validateUser(u, groupNames) ?? (primary ? undefined : `no group with gid ${PRIMARY_GID} on this node`);
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
    if (!byName) {
      const summary = `create user ${u.name} (uid ${u.uid}, home ${homeOf(u.name)}${groups.length ? `, groups ${groups.join(",")}` : ""}${u.passwordHash ? ", password hash set" : ""})`;
      changes.push(userChange("create", u.name, summary, { uid: u.uid, groups, setGroups: true, setPassword: true }));
      changes.push(...(await planSshFiles(host, u, PRIMARY_GID)));
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
    const current = acc.groups
      .filter((g) => g.members.includes(u.name))
      .map((g) => g.name)
      .sort();
    const notes: string[] = [];
    const setGroups = current.join(",") !== groups.join(",");
    if (setGroups) notes.push(`groups ${current.join(",") || "(none)"} → ${groups.join(",") || "(none)"}`);
    const setPassword = acc.shadow.get(u.name) !== wantedPassword(u);
    if (setPassword) notes.push(u.passwordHash ? "password hash changes" : "password login removed");
    if (notes.length) {
      changes.push(
        userChange("update", u.name, `update user ${u.name}: ${notes.join("; ")}`, {
          uid: u.uid,
          groups,
          setGroups,
          setPassword,
        }),
      );
    }
    changes.push(...(await planSshFiles(host, u, byName.gid)));
  }

  for (const p of acc.passwd) {
    if (listed.has(p.name) || !isMarked(p) || p.uid <= 1000) continue;
    changes.push(userChange("delete", p.name, `remove user ${p.name} (uid ${p.uid}) and ${p.home}`, { uid: p.uid }));
  }
  return changes;
}

// ---- apply ----

const prefix = (host: Host) => (host.sandbox ? ["--prefix", host.root] : []);

/** Runs a shadow tool; the message of a failure never carries `secret`. */
async function tool(host: Host, argv: string[], ctx: StepContext, secret?: string): Promise<void> {
  const r = await host.run(argv, secret ? {} : { logFile: ctx.logFile });
  if (r.exitCode === 0) return;
  const shown = secret ? argv.map((a) => (a === secret ? "(redacted)" : a)) : argv;
  const out = (r.stderr || r.stdout).trim();
  throw new CommandError(shown, { ...r, stdout: "", stderr: secret ? out.split(secret).join("(redacted)") : out });
}

async function setPassword(host: Host, u: NodeUserSpec, ctx: StepContext): Promise<void> {
  const hash = wantedPassword(u);
  if (host.sandbox) return tool(host, ["usermod", ...prefix(host), "-p", hash, u.name], ctx, hash);
  // On a real root the hash goes through stdin, not argv (argv is world-readable in /proc).
  const r = await host.run(["chpasswd", "-e"], { input: `${u.name}:${hash}\n` });
  if (r.exitCode !== 0) {
    throw new CommandError(["chpasswd", "-e"], { ...r, stderr: r.stderr.split(hash).join("(redacted)"), stdout: "" });
  }
}

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

async function applyUser(host: Host, ctx: StepContext, c: UserChange, spec: NodeUserSpec | undefined): Promise<void> {
  const data = (c.data ?? {}) as UserData;
  if (data.error) throw new Error(data.error);
  if (c.action === "delete") {
    await killProcesses(host, c.name, data.uid ?? -1, ctx);
    await tool(host, ["userdel", ...prefix(host), "--remove", c.name], ctx);
    return;
  }
  if (!spec) throw new Error(`no NodeUser ${c.name} in the spec`);
  const groups = data.groups ?? [];
  if (c.action === "create") {
    await host.mkdir(HOME_BASE, { mode: 0o755 });
    await tool(
      host,
      [
        "useradd",
        ...prefix(host),
        "--uid",
        String(spec.uid),
        "--gid",
        String(PRIMARY_GID),
        "--home-dir",
        homeOf(spec.name),
        "--create-home",
        "--shell",
        SHELL,
        "--comment",
        MARKER,
        ...(groups.length ? ["--groups", groups.join(",")] : []),
        spec.name,
      ],
      ctx,
    );
  } else if (data.setGroups) {
    await tool(host, ["usermod", ...prefix(host), "--groups", groups.join(","), spec.name], ctx);
  }
  if (data.setPassword) await setPassword(host, spec, ctx);
}

async function validateSudoers(host: Host, c: FileChange): Promise<void> {
  const r = await host.run(["visudo", "-c", "-q", "-f", "-"], { input: c.content ?? "" });
  if (r.exitCode !== 0) {
    throw new Error(`${c.path}: visudo refuses the new content, not installed: ${(r.stderr || r.stdout).trim()}`);
  }
}

async function applyChange(host: Host, ctx: StepContext, c: Change, spec: { users: NodeUserSpec[] }): Promise<void> {
  switch (c.kind) {
    case "user":
      return applyUser(
        host,
        ctx,
        c,
        spec.users.find((u) => u.name === c.name),
      );
    case "command":
      return tool(host, [c.argv[0] as string, ...prefix(host), ...c.argv.slice(1)], ctx);
    case "dir":
      return host.mkdir(c.path, { mode: c.mode, uid: c.uid ?? 0, gid: c.gid ?? 0 });
    case "file":
      if (c.path === SUDOERS_DROP_IN || c.path === "/etc/sudoers") {
        await validateSudoers(host, c);
        if (c.path === SUDOERS_DROP_IN) await host.mkdir("/etc/sudoers.d", { mode: 0o750 });
      }
      return applyFileChange(host, c);
    default:
      throw new Error(`NodeUsers: unexpected change kind ${c.kind}`);
  }
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

const step: Step<"NodeUsers"> = {
  kind: "NodeUsers",
  plan: (spec, host) => plan(spec, host),
  async apply(changes, spec, host, ctx) {
    // Node-wide changes first; a failure there fails the step (the runtime retries).
    for (const c of changes.filter((c) => ownerOf(c) === undefined)) await applyChange(host, ctx, c, spec);
    const byUser = new Map<string, Change[]>();
    for (const c of changes) {
      const owner = ownerOf(c);
      if (owner !== undefined) byUser.set(owner, [...(byUser.get(owner) ?? []), c]);
    }
    const warnings: string[] = [];
    const created: string[] = [];
    const updated: string[] = [];
    const removed: string[] = [];
    const failed: string[] = [];
    for (const [name, userChanges] of byUser) {
      const listed = spec.users.some((u) => u.name === name);
      try {
        for (const c of userChanges) await applyChange(host, ctx, c, spec);
        const action = userChanges.find((c) => c.kind === "user")?.action;
        (action === "create" ? created : action === "delete" ? removed : updated).push(name);
        ctx.log.info({ user: name, action: action ?? "update" }, "node user converged");
        if (listed) await reportStatus(ctx, name, null);
      } catch (err) {
        const msg = (err as Error).message;
        failed.push(name);
        warnings.push(`NodeUser ${name}: ${msg}`);
        ctx.log.warn({ user: name, err: msg }, "node user failed; the others go on");
        if (listed) await reportStatus(ctx, name, msg);
      }
    }
    return { outputs: { created, updated, removed, failed }, ...(warnings.length ? { warnings } : {}) };
  },
};

export default step;
