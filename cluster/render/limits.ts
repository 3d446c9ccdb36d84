// The node's limits, applied where the bundle is made: a bundle the agent would refuse (over
// 8 MiB, more NodeUsers than one bundle carries, any spec its schema refuses) is never served.
// It becomes a RenderError instead, so the group keeps its last good bundle, the NodeGroup gets
// a Warning Event saying which limit and which objects, and no node stops converging or
// joining because of it. The limits themselves are the agent's own (bundles/verify.ts, the
// step descriptors in bundles/steps/): one set, read by both sides.
import { MAX_NODE_USERS } from "../../bundles/steps/node-users.ts";
import type { NodeGroupBundle } from "../../bundles/types.ts";
import {
  acceptBundle,
  BundleRejectedError,
  MAX_BUNDLE_BYTES,
  MAX_RENDERED_BUNDLE_BYTES,
} from "../../bundles/verify.ts";
import { canonicalJson } from "../../bundles/checksum.ts";
import { RenderError } from "./errors.ts";

const mib = (n: number) => `${(n / (1024 * 1024)).toFixed(1)} MiB`;
const kib = (n: number) => `${Math.ceil(n / 1024)} KiB`;

/** Before anything is rendered: the NodeUsers selecting the group fit in one bundle. */
export function checkNodeUserCount(group: string, count: number): void {
  if (count > MAX_NODE_USERS) {
    throw new RenderError(
      `NodeGroup/${group}`,
      `${count} NodeUsers select node group ${group}; a bundle carries at most ${MAX_NODE_USERS} (the node refuses more): narrow their spec.nodeGroups or remove some`,
    );
  }
}

/**
 * The finished bundle, as it will be served, passes what the agent checks (size, every step's
 * schema); otherwise a RenderError naming the objects to change.
 */
export function checkServable(bundle: NodeGroupBundle): void {
  const group = bundle.nodeGroup;
  const text = canonicalJson(bundle);
  const size = Buffer.byteLength(text);
  if (size > MAX_RENDERED_BUNDLE_BYTES) {
    const largest = bundle.steps
      .map((s) => ({ s, bytes: Buffer.byteLength(canonicalJson(s)) }))
      .sort((a, b) => b.bytes - a.bytes)
      .slice(0, 5)
      .map(({ s, bytes }) => `${s.kind === "Script" ? s.spec.source : `step ${s.name}`} (${kib(bytes)})`);
    throw new RenderError(
      `NodeGroup/${group}`,
      `its bundle would be ${mib(size)}, over the ${mib(MAX_BUNDLE_BYTES)} a node accepts; the largest parts: ${largest.join(", ")}`,
    );
  }
  try {
    acceptBundle(text, `the renderer (node group ${group})`);
  } catch (err) {
    if (!(err instanceof BundleRejectedError)) throw err;
    // A step's spec the node would refuse: blame its NodeGroupConfiguration, or else the group.
    const stepName = /^step (\S+)/.exec(err.why)?.[1];
    const step = bundle.steps.find((s) => s.name === stepName);
    const object = step?.kind === "Script" ? step.spec.source : `NodeGroup/${group}`;
    throw new RenderError(object, `a node would refuse the bundle: ${err.why}`);
  }
}
