// Plans and applies whole-file changes: compare wanted content, mode and owner with what is
// on the host, describe the difference as a unified diff, and write it atomically.
import { createTwoFilesPatch } from "diff";
import type { FileSpec } from "../../bundles/types.ts";
import type { FileChange } from "../../steps/types.ts";
import type { Host } from "./host.ts";

const octal = (m: number) => `0${m.toString(8)}`;

function isBinary(b: Buffer): boolean {
  return b.subarray(0, 8000).includes(0);
}

/** The change that makes `spec` true on the host, or undefined when it already is. */
export async function planFile(host: Host, spec: FileSpec): Promise<FileChange | undefined> {
  const uid = spec.uid ?? 0;
  const gid = spec.gid ?? 0;
  const [current, st] = await Promise.all([host.readFile(spec.path), host.stat(spec.path)]);
  const wanted = Buffer.from(spec.content, "utf8");
  const base = { kind: "file" as const, path: spec.path, content: spec.content, mode: spec.mode, uid, gid };
  if (!current || !st) {
    return {
      ...base,
      action: "create",
      summary: `create ${spec.path} (${octal(spec.mode)}, ${wanted.length} bytes)`,
      diff: spec.secret ? "(secret content)" : unifiedDiff(spec.path, "", spec.content),
    };
  }
  const sameContent = current.equals(wanted);
  const notes: string[] = [];
  if (st.mode !== spec.mode) notes.push(`mode ${octal(st.mode)} → ${octal(spec.mode)}`);
  if (st.uid !== uid || st.gid !== gid) notes.push(`owner ${st.uid}:${st.gid} → ${uid}:${gid}`);
  if (sameContent && notes.length === 0 && st.isFile) return undefined;
  let diff = "";
  if (!sameContent) {
    notes.unshift("content");
    diff =
      spec.secret || isBinary(current)
        ? "(secret or binary content differs)"
        : unifiedDiff(spec.path, current.toString("utf8"), spec.content);
  }
  return { ...base, action: "update", summary: `update ${spec.path}: ${notes.join(", ")}`, diff };
}

/** The change that removes a file, or undefined when it is already absent. */
export async function planAbsent(host: Host, nodePath: string): Promise<FileChange | undefined> {
  const st = await host.stat(nodePath);
  if (!st) return undefined;
  const current = st.isFile ? ((await host.readFile(nodePath)) ?? Buffer.alloc(0)) : Buffer.alloc(0);
  return {
    kind: "file",
    path: nodePath,
    action: "delete",
    summary: `delete ${nodePath}`,
    diff: isBinary(current) ? "(binary content)" : unifiedDiff(nodePath, current.toString("utf8"), ""),
  };
}

export async function applyFileChange(host: Host, c: FileChange): Promise<void> {
  if (c.action === "delete") return host.remove(c.path);
  if (c.content === undefined || c.mode === undefined) throw new Error(`file change for ${c.path} has no content`);
  await host.writeFile(c.path, c.content, { mode: c.mode, uid: c.uid, gid: c.gid });
}

export function unifiedDiff(p: string, before: string, after: string): string {
  return createTwoFilesPatch(`a${p}`, `b${p}`, before, after, "", "", { context: 3 })
    .split("\n")
    .slice(1) // drop the "Index"/separator line jsdiff adds
    .join("\n");
}
