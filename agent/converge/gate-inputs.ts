// What the gate decides on, read in one place for both processes that ask it: the resident
// daemon (every check) and the converge child (once per run). The node's side is state files
// and the kernel: the applied checksum (configuration_checksum; gone means a forced full run),
// the boot id it was applied in (status.json), the running boot id, the reboot flag. The
// cluster's side is the Node's reboot annotation. Light on purpose: no step or engine code, so
// the daemon that imports it stays small.
import type { Host } from "../../host/host.ts";
import { FLAG, hostFlags } from "../../host/flags.ts";
import type { KubeObject } from "../../lib/kube/api.ts";
import { NODE_KEYS } from "../../bundles/names.ts";
import { readBootId } from "../facts.ts";
import type { GateInput } from "./gate.ts";
import { readAppliedChecksum, readStatus, type StateOptions } from "./state.ts";

/** The node's half of the gate's inputs, as the state files and the kernel say now. */
export interface NodeGateState {
  /** configuration_checksum; undefined when removed (a forced run) or never written. */
  appliedChecksum: string | undefined;
  /** The boot id of the last successful run (status.json). */
  appliedBootId: string | undefined;
  /** The running kernel's boot id. */
  bootId: string;
  /** Deckhouse's reboot flag: a step or a script asked for a reboot that has not happened. */
  rebootPending: boolean;
}

/**
 * Reads the node's gate inputs. Only "no such file" means absent: an unreadable file is an
 * error, never a guess. A torn status.json is logged (and moved aside when `mayWrite`) and
 * counts as "no applied boot", so the gate runs a converge, which rewrites it.
 */
export async function readGateState(host: Host, o: StateOptions = {}): Promise<NodeGateState> {
  const [appliedChecksum, status, rebootPending, bootId] = await Promise.all([
    readAppliedChecksum(host),
    readStatus(host, o),
    hostFlags(host).has(FLAG.reboot),
    readBootId(),
  ]);
  return { appliedChecksum, appliedBootId: status.appliedBootId, bootId, rebootPending };
}

/** The Node carries update.node.deckhouse.io/reboot. */
export const rebootRequested = (node: KubeObject | undefined): boolean =>
  node?.metadata.annotations?.[NODE_KEYS.reboot] !== undefined;

/** The gate's whole input: the node's state, the bundle to apply, and the Node as last seen. */
export function gateInput(state: NodeGateState, bundleChecksum: string, node: KubeObject | undefined): GateInput {
  return {
    bundleChecksum,
    bootId: state.bootId,
    appliedChecksum: state.appliedChecksum,
    appliedBootId: state.appliedBootId,
    rebootRequested: rebootRequested(node),
    rebootPending: state.rebootPending,
  };
}
