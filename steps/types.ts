// The step contract. A step observes the host and returns a plan: the changes it would make
// (values that print, compare and test) and the problems it found (reported where the user
// looks, but not changes: a node with a problem is still "in sync"). The engine applies the
// primitive changes itself (files, directories, links, commands, units, service restarts,
// flags); a step applies only its own kinds (users, packages, scripts) in `applyOwn`. A re-run
// on a converged host plans nothing.
//
// Adding a step: docs/steps.md, "Adding a step".
import type { Logger } from "../lib/log/log.ts";
import type { KubeClient } from "../lib/kube/client.ts";
import type { Host } from "../host/host.ts";
import type { Primitive } from "../host/changes.ts";
import type { Flags } from "../host/flags.ts";

export type { Flags } from "../host/flags.ts";
import type { NodeGroupBundle, SpecOf, StepKind } from "../bundles/types.ts";

export type {
  CommandChange,
  DirChange,
  FileChange,
  FlagChange,
  Primitive,
  ServiceChange,
  SymlinkChange,
  UnitChange,
} from "../host/changes.ts";

/** NodeUsers' own change: an account created, updated or removed with the shadow tools. */
export interface UserChange {
  kind: "user";
  action: "create" | "update" | "delete";
  name: string;
  summary: string;
  isolate?: string;
  disruptive?: string;
  /**
   * Exactly what apply runs, in order. `stdin: "password"` marks the command that sets the
   * password: apply feeds `<name>:<hash>` on stdin (or fills the argv placeholder) from the spec,
   * so the hash is never part of a plan.
   */
  commands: { argv: string[]; stdin?: "password" }[];
  /** Kill the user's processes first (removal). */
  killUid?: number;
}

/** RegistryPackages' own change. */
export interface PackageChange {
  kind: "package";
  action: "install" | "upgrade" | "remove";
  name: string;
  digest?: string;
  repository?: string;
  summary: string;
  isolate?: string;
  disruptive?: string;
}

/** Script's own change: run a NodeGroupConfiguration script. */
export interface ScriptChange {
  kind: "script";
  name: string;
  summary: string;
  isolate?: string;
  disruptive?: string;
}

export type Change = Primitive | UserChange | PackageChange | ScriptChange;
export type OwnChange = Exclude<Change, Primitive>;

/** Something wrong that waiting will not fix and a change cannot: reported, never applied. */
export interface Problem {
  /** Who it concerns: "NodeUser alice", "package jq", a path. */
  subject: string;
  message: string;
}

export interface Plan<C extends Change = Primitive> {
  changes: C[];
  problems: Problem[];
}

/** A unit that reads files: restarted (or reloaded) when one of them changed in this run. */
export interface ServiceDecl {
  unit: string;
  /** Node paths; a path ending in "/" covers everything under it. */
  reads: string[];
  onChange: "restart" | "reload";
  /**
   * Flags that also ask for it, besides `<unit>-need-restart` (Deckhouse's scripts set
   * `containerd-need-restart` for containerd-deckhouse.service, say).
   */
  flags?: string[];
}

export interface StepContext {
  /** The bundle step's name, e.g. "050_configure_sysctl". */
  stepName: string;
  nodeName: string;
  nodeGroup: string;
  bundle: NodeGroupBundle;
  /** /var/lib/bashible/first_run exists: no approvals, no reboot. */
  firstRun: boolean;
  /** configuration_checksum is absent: a full run was forced (or none succeeded yet). */
  forced: boolean;
  /** The running kernel's boot id. */
  bootId: string;
  log: Logger;
  /** Absent in local mode (--bundle without a cluster). */
  kube?: KubeClient;
  /** Node path of this step's log file (/var/log/d8/bashible/step.<name>.log). */
  logFile: string;
  flags: Flags;
  /** argv that runs this agent (scripts' helpers call back into it). */
  agentArgv: string[];
  /**
   * How this run reaches the cluster, for the helpers that call back into the agent: the
   * kubeconfig it was given, or "local" when it runs without a cluster (the operator approves).
   */
  cluster: { kubeconfig?: string } | "local";
  /** Every secret value of the bundle: output and errors of what a step runs are redacted with them. */
  secrets: string[];
  signal?: AbortSignal;
}

export interface Step<K extends StepKind, C extends Change = Primitive> {
  kind: K;
  plan(spec: SpecOf<K>, host: Host, ctx: StepContext): Promise<Plan<C>>;
  /** Applies one of the step's own changes (the engine applies primitives). */
  applyOwn?(change: Exclude<C, Primitive>, spec: SpecOf<K>, host: Host, ctx: StepContext): Promise<void>;
  /** Units this step manages and the files they read (restart/reload-if-changed). */
  services?(spec: SpecOf<K>, host: Host): ServiceDecl[];
  /** Values in the spec that must never reach logs, plans, Events or status. */
  secrets?(spec: SpecOf<K>): string[];
  /** After apply (or a plan with nothing to do): report problems where users look. Never throws. */
  report?(problems: Problem[], spec: SpecOf<K>, ctx: StepContext): Promise<void>;
}
