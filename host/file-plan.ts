// Plans whole-file, directory and symlink changes: compare what is wanted with what is on the
// host and describe the difference (a unified diff for text the plan may show). The host's
// confined reads refuse links and non-regular files, so a plan never shows what sits behind a
// link or inside a FIFO.
import type { DirChange, FileChange, SymlinkChange } from "./changes.ts";
import { LinkRefusedError, NotRegularFileError } from "./confined.ts";
import type { Host } from "./host.ts";

export interface WantedFile {
  path: string;
  content: string | Buffer;
  /** Octal mode as a number, e.g. 0o644. */
  mode: number;
  uid?: number;
  gid?: number;
  /** Content must never be shown (plans say "secret content" instead of a diff). */
  secret?: boolean;
  /** argv validating the candidate before it replaces the live file; "{}" is its path. */
  check?: string[];
}

const octal = (m: number) => `0${m.toString(8)}`;

function isBinary(b: Buffer): boolean {
  return b.subarray(0, 8000).includes(0);
}

/** The change that makes `want` true on the host, or undefined when it already is. */
export async function planFile(host: Host, want: WantedFile): Promise<FileChange | undefined> {
  const uid = want.uid ?? 0;
  const gid = want.gid ?? 0;
  const wanted = typeof want.content === "string" ? Buffer.from(want.content, "utf8") : want.content;
  const st = await host.stat(want.path);
  if (st?.isSymlink) throw new LinkRefusedError(want.path, (await host.fs.readLink(want.path)) ?? "?");
  if (st?.isDirectory) throw new NotRegularFileError(want.path, "a directory");
  const base = {
    kind: "file" as const,
    path: want.path,
    content: want.content,
    mode: want.mode,
    uid,
    gid,
    ...(want.secret ? { secret: true } : {}),
    ...(want.check ? { check: want.check } : {}),
  };
  if (!st) {
    return {
      ...base,
      action: "create",
      summary: `create ${want.path} (${octal(want.mode)}, ${wanted.length} bytes)`,
      diff: want.secret
        ? "(secret content)"
        : isBinary(wanted)
          ? "(binary content)"
          : await unifiedDiff(want.path, "", wanted.toString("utf8")),
    };
  }
  let current: Buffer | undefined;
  let unreadable = "";
  try {
    current = st.isFile ? await host.readFile(want.path) : undefined;
    if (!st.isFile) unreadable = "not a regular file";
  } catch (err) {
    if (!(err instanceof NotRegularFileError)) throw err;
    unreadable = err.message;
  }
  const sameContent = current?.equals(wanted) ?? false;
  const notes: string[] = [];
  if (st.mode !== want.mode) notes.push(`mode ${octal(st.mode)} → ${octal(want.mode)}`);
  if (st.uid !== uid || st.gid !== gid) notes.push(`owner ${st.uid}:${st.gid} → ${uid}:${gid}`);
  if (sameContent && notes.length === 0 && st.isFile && st.nlink === 1) return undefined;
  if (st.nlink > 1) notes.push(`replace: it has ${st.nlink} hard links`);
  let diff = "";
  if (!sameContent) {
    notes.unshift("content");
    if (unreadable) diff = `(current content not shown: ${unreadable})`;
    else if (want.secret || (current && isBinary(current)) || isBinary(wanted))
      diff = "(secret or binary content differs)";
    else diff = await unifiedDiff(want.path, current?.toString("utf8") ?? "", wanted.toString("utf8"));
  }
  return { ...base, action: "update", summary: `update ${want.path}: ${notes.join(", ")}`, diff };
}

/** The change that removes a file (or a link we manage), or undefined when it is absent. */
export async function planAbsent(
  host: Host,
  nodePath: string,
  o: { secret?: boolean } = {},
): Promise<FileChange | undefined> {
  const st = await host.stat(nodePath);
  if (!st) return undefined;
  if (st.isDirectory) throw new NotRegularFileError(nodePath, "a directory");
  let diff = "";
  if (st.isFile && !o.secret) {
    try {
      const current = (await host.readFile(nodePath)) ?? Buffer.alloc(0);
      diff = isBinary(current) ? "(binary content)" : await unifiedDiff(nodePath, current.toString("utf8"), "");
    } catch (err) {
      if (!(err instanceof NotRegularFileError)) throw err;
      diff = `(content not shown: ${err.message})`;
    }
  }
  return { kind: "file", path: nodePath, action: "delete", summary: `delete ${nodePath}`, diff };
}

/** The change that makes a directory exist with this mode and owner, or undefined. */
export async function planDir(
  host: Host,
  nodePath: string,
  own: { mode: number; uid?: number; gid?: number },
): Promise<DirChange | undefined> {
  const uid = own.uid ?? 0;
  const gid = own.gid ?? 0;
  const st = await host.stat(nodePath);
  if (st?.isSymlink) throw new LinkRefusedError(nodePath, (await host.fs.readLink(nodePath)) ?? "?");
  if (st && !st.isDirectory) throw new NotRegularFileError(nodePath, "not a directory");
  if (st && st.mode === own.mode && st.uid === uid && st.gid === gid) return undefined;
  return {
    kind: "dir",
    path: nodePath,
    action: st ? "update" : "create",
    mode: own.mode,
    uid,
    gid,
    summary: st
      ? `set ${nodePath} to ${octal(own.mode)} ${uid}:${gid} (was ${octal(st.mode)} ${st.uid}:${st.gid})`
      : `create ${nodePath} (${octal(own.mode)}, ${uid}:${gid})`,
  };
}

/** The change that makes nodePath a symlink to target, or undefined. */
export async function planSymlink(host: Host, nodePath: string, target: string): Promise<SymlinkChange | undefined> {
  const st = await host.stat(nodePath);
  if (st?.isSymlink && (await host.fs.readLink(nodePath)) === target) return undefined;
  if (st && !st.isSymlink) throw new NotRegularFileError(nodePath, "not a symlink");
  return {
    kind: "symlink",
    path: nodePath,
    action: st ? "update" : "create",
    target,
    summary: `${st ? "point" : "create"} ${nodePath} → ${target}`,
  };
}

/** jsdiff loads with the first diff: a plan of a converged node makes none. */
let jsdiff: Promise<typeof import("diff")> | undefined;

export async function unifiedDiff(p: string, before: string, after: string): Promise<string> {
  jsdiff ??= import("diff");
  const { createTwoFilesPatch } = await jsdiff;
  return createTwoFilesPatch(`a${p}`, `b${p}`, before, after, "", "", { context: 3 })
    .split("\n")
    .slice(1) // drop the "Index"/separator line jsdiff adds
    .join("\n");
}
