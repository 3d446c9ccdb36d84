// The node side of update approval: before a non-first run changes anything, announce
// update.node.deckhouse.io/waiting-for-approval and wait until the cluster (the approval
// controller, or a person) sets update.node.deckhouse.io/approved.
import type { Logger } from "../../lib/log/log.ts";
import type { KubeClient } from "../../lib/kube/client.ts";
import { getNode, patchNode } from "../../lib/kube/api.ts";
import { NODE_KEYS } from "../../bundles/names.ts";

export interface ApprovalOptions {
  timeoutMs: number;
  signal?: AbortSignal;
}

export async function waitForApproval(
  kube: KubeClient,
  nodeName: string,
  log: Logger,
  o: ApprovalOptions,
): Promise<boolean> {
  const node = await getNode(kube, nodeName);
  if (node.metadata.annotations?.[NODE_KEYS.approved] !== undefined) return true;
  await patchNode(kube, nodeName, { metadata: { annotations: { [NODE_KEYS.waitingForApproval]: "" } } });
  log.info(`waiting for ${NODE_KEYS.approved} on Node ${nodeName}`);
  const deadline = Date.now() + o.timeoutMs;
  let resourceVersion = node.metadata.resourceVersion;
  while (Date.now() < deadline && !o.signal?.aborted) {
    const left = Math.max(1, Math.ceil((deadline - Date.now()) / 1000));
    try {
      for await (const ev of kube.watch<{
        metadata: { annotations?: Record<string, string>; resourceVersion?: string };
      }>("/api/v1/nodes", {
        fieldSelector: `metadata.name=${nodeName}`,
        resourceVersion,
        timeoutSeconds: Math.min(left, 300),
        signal: o.signal,
      })) {
        resourceVersion = ev.object.metadata.resourceVersion ?? resourceVersion;
        if (ev.type !== "BOOKMARK" && ev.object.metadata.annotations?.[NODE_KEYS.approved] !== undefined) return true;
      }
    } catch (err) {
      log.warn(`approval watch broke (${(err as Error).message}); re-reading the Node`);
      const again = await getNode(kube, nodeName).catch(() => undefined);
      if (again?.metadata.annotations?.[NODE_KEYS.approved] !== undefined) return true;
      resourceVersion = again?.metadata.resourceVersion;
      await new Promise((r) => setTimeout(r, 1000));
    }
  }
  return false;
}
