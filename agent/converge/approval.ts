// The node side of the update handshake: announce something on the Node (an annotation) and
// wait until the cluster — the approval controller or a person — answers with another. Used for
// update approval (waiting-for-approval → approved) and disruption approval
// (disruption-required → disruption-approved). Waits on a watch of this one Node (lib/informer),
// never by polling.
import type { Logger } from "../../lib/log/log.ts";
import type { KubeClient } from "../../lib/kube/client.ts";
import { patchNode, type KubeObject } from "../../lib/kube/api.ts";
import { Informer } from "../../lib/informer.ts";

export interface WaitOptions {
  timeoutMs: number;
  signal?: AbortSignal;
}

/**
 * Sets `announce` (merge patch of annotations; null deletes) unless `granted` already holds,
 * then waits for `granted`. Resolves true when granted, false on timeout or abort. Fails closed:
 * when the Node cannot be read, it throws.
 */
export async function announceAndWait(
  kube: KubeClient,
  nodeName: string,
  log: Logger,
  announce: Record<string, string | null>,
  granted: (node: KubeObject) => boolean,
  o: WaitOptions,
): Promise<boolean> {
  let resolveGranted!: (v: boolean) => void;
  const result = new Promise<boolean>((r) => (resolveGranted = r));
  const informer = new Informer<KubeObject>({
    client: kube,
    path: "/api/v1/nodes",
    fieldSelector: `metadata.name=${nodeName}`,
    log,
    trim: (n) => ({ metadata: n.metadata }),
    onEvent: () => {
      const node = informer.objects.get(nodeName);
      if (node && granted(node)) resolveGranted(true);
    },
  });
  await informer.start();
  try {
    const node = informer.objects.get(nodeName);
    if (!node) throw new Error(`Node ${nodeName} not found; cannot ask for approval`);
    if (granted(node)) return true;
    await patchNode(kube, nodeName, { metadata: { annotations: announce } });
    const timer = setTimeout(() => resolveGranted(false), o.timeoutMs);
    const onAbort = () => resolveGranted(false);
    o.signal?.addEventListener("abort", onAbort, { once: true });
    try {
      return await result;
    } finally {
      clearTimeout(timer);
      o.signal?.removeEventListener("abort", onAbort);
    }
  } finally {
    informer.stop();
  }
}

export const hasAnnotation = (key: string) => (node: KubeObject) => node.metadata.annotations?.[key] !== undefined;
