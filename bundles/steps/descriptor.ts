// What the contract says about one built-in step, in one place: its name, its kind, the schema
// of its spec, the systemd units it owns, and the constants both the renderer and the step
// read. bundles/steps/index.ts derives the step list, the spec table, the unit names and the
// cleanup script's unit list from these descriptors; nothing else lists built-in steps.
import type { Schema } from "../schema.ts";

export interface BuiltinStep {
  /**
   * Deckhouse's name (`NNN_name`): NodeGroupConfiguration weights order custom scripts against
   * it as in Deckhouse, a custom script cannot take it, and the bundle runs steps by name.
   */
  readonly name: string;
  /** The step kind: which module of steps/ runs it (steps/index.ts). */
  readonly kind: string;
  /** The spec's schema: the agent refuses a bundle whose spec does not match it exactly. */
  readonly spec: Schema<unknown>;
  /** systemd units the step writes and manages, under the key `UNITS` names them with. */
  readonly units: Readonly<Record<string, string>>;
  /**
   * What cleanup_static_node.sh stops, disables and removes for this step, in that order; by
   * default its `units`. Lists them and the units of the same role the step does not write
   * (Deckhouse's own, the distribution's).
   */
  readonly cleanupUnits?: readonly string[];
}

/** A descriptor with its literal name, kind and units kept in its type (and any constants of its own). */
export const builtinStep = <const D extends BuiltinStep>(d: D): D => d;
