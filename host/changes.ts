// The primitive changes: values a plan is made of and the engine applies itself. A step returns
// these (plus its own kinds, which it applies itself), so plans print, compare and test well,
// and `apply` carries out exactly what `plan` showed.

interface ChangeBase {
  /** One line a person reads in `bashible plan`. */
  summary: string;
  /**
   * Changes with the same `isolate` key (e.g. "NodeUser alice") fail together and alone: when
   * one fails, the rest of its group is skipped and the failure is reported as a problem of
   * that subject; the step goes on with the others.
   */
  isolate?: string;
  /**
   * Why this change disrupts the node's workloads (a containerd major version, say): the run
   * asks for disruption approval (update.node.deckhouse.io/disruption-required) before it.
   */
  disruptive?: string;
}

export interface FileChange extends ChangeBase {
  kind: "file";
  path: string;
  action: "create" | "update" | "delete";
  /** Unified diff, or a note for secret, binary or unreadable content. Empty when only mode/owner differ. */
  diff: string;
  content?: string | Buffer;
  mode?: number;
  uid?: number;
  gid?: number;
  /** Never show the content (diff says so). */
  secret?: boolean;
  /** argv that validates the candidate before it replaces the live file; "{}" is its path. */
  check?: string[];
}

export interface DirChange extends ChangeBase {
  kind: "dir";
  path: string;
  action: "create" | "update";
  mode: number;
  uid?: number;
  gid?: number;
}

export interface SymlinkChange extends ChangeBase {
  kind: "symlink";
  path: string;
  action: "create" | "update" | "delete";
  target: string;
}

export interface CommandChange extends ChangeBase {
  kind: "command";
  /** Exactly what apply runs. */
  argv: string[];
  /** Given on stdin (never shown: it may carry a secret). */
  input?: string;
  env?: Record<string, string>;
  /** Node path. */
  cwd?: string;
  timeoutMs?: number;
  /** Values to redact from the command's output and errors. */
  secrets?: string[];
  /** The command can only act on "/": under a sandbox root it is recorded, not run. */
  recordInSandbox?: boolean;
}

export interface UnitChange extends ChangeBase {
  kind: "unit";
  unit: string;
  action: "daemon-reload" | "enable" | "disable" | "start" | "stop";
}

export interface ServiceChange extends ChangeBase {
  kind: "service";
  unit: string;
  action: "restart" | "reload";
  /** What changed that the unit reads. */
  why: string[];
}

/** Flags outlive a step within a run and across a crash: Deckhouse's flag directory. */
export interface FlagChange extends ChangeBase {
  kind: "flag";
  name: string;
  action: "set" | "unset";
  why: string;
}

export type Primitive =
  | FileChange
  | DirChange
  | SymlinkChange
  | CommandChange
  | UnitChange
  | ServiceChange
  | FlagChange;

export const PRIMITIVE_KINDS: ReadonlySet<string> = new Set([
  "file",
  "dir",
  "symlink",
  "command",
  "unit",
  "service",
  "flag",
]);

export function isPrimitive(c: { kind: string }): c is Primitive {
  return PRIMITIVE_KINDS.has(c.kind);
}

/** Node paths a change writes (for restart-if-changed). */
export function pathsOf(c: { kind: string; path?: string }): string[] {
  return (c.kind === "file" || c.kind === "dir" || c.kind === "symlink") && c.path ? [c.path] : [];
}
