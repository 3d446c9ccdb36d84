// What a built-in step is: `plan` observes the host and returns the changes it would make
// (values that print, compare and test); `apply` carries out exactly those changes.
// A re-run on a converged host plans nothing.
import type { Logger } from "../lib/log/log.ts";
import type { Host } from "../agent/host/host.ts";
import type { KubeClient } from "../lib/kube/client.ts";
import type { BundleStep, NodeGroupBundle } from "../bundles/types.ts";

interface ChangeBase {
  /** One line a person reads in `bashible plan`. */
  summary: string;
}

export interface FileChange extends ChangeBase {
  kind: "file";
  path: string;
  action: "create" | "update" | "delete";
  /** Unified diff, or a note for secret or binary content. Empty when only mode/owner differ. */
  diff: string;
  content?: string | Buffer;
  mode?: number;
  uid?: number;
  gid?: number;
}

export interface DirChange extends ChangeBase {
  kind: "dir";
  path: string;
  action: "create" | "update" | "delete";
  mode: number;
  uid?: number;
  gid?: number;
}

export interface CommandChange extends ChangeBase {
  kind: "command";
  argv: string[];
}

export interface UserChange extends ChangeBase {
  kind: "user";
  action: "create" | "update" | "delete";
  name: string;
  /** Step-private data apply needs (never secrets in clear: plans are printed). */
  data?: Record<string, unknown>;
}

export interface PackageChange extends ChangeBase {
  kind: "package";
  action: "install" | "upgrade" | "remove";
  name: string;
  digest?: string;
}

export interface RestartChange extends ChangeBase {
  kind: "restart";
  unit: string;
}

export interface FlagChange extends ChangeBase {
  kind: "flag";
  name: "reboot" | "disruption";
}

export interface ScriptChange extends ChangeBase {
  kind: "script";
  name: string;
}

export type Change =
  | FileChange
  | DirChange
  | CommandChange
  | UserChange
  | PackageChange
  | RestartChange
  | FlagChange
  | ScriptChange;

export interface StepContext {
  /** The bundle step's name, e.g. "050_configure_sysctl". */
  stepName: string;
  nodeName: string;
  nodeGroup: string;
  bundle: NodeGroupBundle;
  /** /var/lib/bashible/first_run exists: no approvals, no reboot. */
  firstRun: boolean;
  /** configuration_checksum is absent: a full run was forced (or none succeeded yet). */
  forced?: boolean;
  log: Logger;
  /** Absent in local mode (--bundle without a cluster). */
  kube?: KubeClient;
  /** Node path of this step's log file (/var/log/d8/bashible/step.<name>.log). */
  logFile: string;
  signal?: AbortSignal;
}

export interface StepResult {
  /** Facts later steps or the runtime act on, e.g. {installed: ["containerd"], skipped: [...], removed: [...]}. */
  outputs?: Record<string, unknown>;
  /** Problems that do not fail the step (one NodeUser failing must not stop the others). */
  warnings?: string[];
}

export type SpecOf<K extends BundleStep["kind"]> = Extract<BundleStep, { kind: K }>["spec"];

export interface Step<K extends BundleStep["kind"] = BundleStep["kind"]> {
  kind: K;
  plan(spec: SpecOf<K>, host: Host, ctx: StepContext): Promise<Change[]>;
  apply(changes: Change[], spec: SpecOf<K>, host: Host, ctx: StepContext): Promise<StepResult | undefined>;
}
