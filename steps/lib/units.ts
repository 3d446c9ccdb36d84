// Units the built-in steps own: the unit file (checked with systemd-analyze before it replaces
// the live one), daemon-reload after it changed, enabled, and started when it is not running.
// Restarts and reloads are not planned here: each step declares what its unit reads
// (`services`) and the engine restarts or reloads it when one of those files changed.
import { asset } from "../../lib/assets.ts";
import { PATHS } from "../../bundles/paths.ts";
import type { Host } from "../../host/host.ts";
import { planFile } from "../../host/file-plan.ts";
import type { Primitive } from "../types.ts";

export const unitPath = (unit: string) => `${PATHS.unitDir}/${unit}`;

/** argv checking a candidate unit file ("{}") as `unit`: see steps/checks/systemd-unit.sh. */
export function unitCheck(host: Host, unit: string): string[] {
  return ["sh", asset("steps/checks/systemd-unit.sh"), unit, host.root, "{}"];
}

export interface UnitState {
  enabled: boolean;
  /** Running (or starting, or reloading). */
  active: boolean;
}

/** Every unit the built-in steps write is wanted by multi-user.target ([Install] WantedBy=). */
const WANTS = `${PATHS.unitDir}/multi-user.target.wants`;

/**
 * Whether the unit is enabled and running. Enabled = the link `systemctl enable` makes for
 * WantedBy=multi-user.target exists (read, not asked: no process on a converged node). Running is
 * asked of systemd on "/"; in a sandbox tree nothing runs, and an enabled unit counts as running
 * (its start was recorded when it was enabled).
 */
export async function unitState(host: Host, unit: string): Promise<UnitState> {
  const enabled = (await host.stat(`${WANTS}/${unit}`))?.isSymlink === true;
  if (host.sandbox) return { enabled, active: enabled };
  const r = await host.run(["systemctl", "is-active", "--", unit]);
  return { enabled, active: ["active", "activating", "reloading"].includes(r.stdout.trim()) };
}

export interface UnitPlan {
  changes: Primitive[];
  state: UnitState;
}

/** The unit file, daemon-reload when it changes, and `enable`. */
export async function planUnit(host: Host, unit: string, content: string): Promise<UnitPlan> {
  const changes: Primitive[] = [];
  const file = await planFile(host, { path: unitPath(unit), content, mode: 0o644, check: unitCheck(host, unit) });
  if (file) {
    changes.push(file, {
      kind: "unit",
      unit,
      action: "daemon-reload",
      summary: `systemctl daemon-reload (${unit} changed)`,
    });
  }
  const state = await unitState(host, unit);
  if (!state.enabled) changes.push({ kind: "unit", unit, action: "enable", summary: `enable ${unit}` });
  return { changes, state };
}

/**
 * The daemon-reload that files systemd reads beside a unit's own file need (a drop-in, a second
 * unit, a `.wants` link), or none when `planned` (that unit's plan) already reloads: one reload
 * covers them all.
 */
export function reloadUnlessPlanned(planned: readonly Primitive[], unit: string, why: string): Primitive[] {
  if (planned.some((c) => c.kind === "unit" && c.action === "daemon-reload")) return [];
  return [{ kind: "unit", unit, action: "daemon-reload", summary: `systemctl daemon-reload (${why})` }];
}

/**
 * A unit the engine restarts when what it reads changed, and that is not running: the flag
 * `<unit>-need-restart` makes the engine's restart start it, once, after the step (a separate
 * `start` would start it and the restart right after would start it again).
 */
export function startByRestart(unit: string, flag: string): Primitive {
  return {
    kind: "flag",
    name: flag,
    action: "set",
    why: `${unit} is not running`,
    summary: `start ${unit}: it is not running (flag ${flag}: the engine starts it after this step)`,
  };
}

/** A unit the engine reloads on change, and that is not running: start it (a reload needs it running). */
export function start(unit: string): Primitive {
  return { kind: "unit", unit, action: "start", summary: `start ${unit} (it is not running)` };
}
