// The node side of the update handshake: announce something on the Node (an annotation) and
// wait until the cluster — the approval controller or a person — answers with another. Used for
// update approval (waiting-for-approval → approved) and disruption approval
// (disruption-required → disruption-approved). Waits on a watch of this one Node (lib/informer),
// never by polling.
import type { Logger } from "../../lib/log/log.ts";
import type { KubeClient } from "../../lib/kube/client.ts";
import { patchNode, type KubeObject } from "../../lib/kube/api.ts";
import { Backoff } from "../../lib/backoff.ts";
import { KubeError } from "../../lib/kube/errors.ts";
import { Informer } from "../../lib/informer.ts";
import { sleep } from "../../lib/sleep.ts";

export interface WaitOptions {
  timeoutMs: number;
  signal?: AbortSignal;
}

/**
 * How long the first read of the Node is retried while the API is out of reach (nothing listens,
 * the connection breaks or times out). The run itself can be why: adoption moves Deckhouse's API
 * proxy pod aside and the run's 000 step starts this agent's proxy a moment before the approval
 * is asked, through that very address. A status (403, 404…) or a TLS failure is an answer, and
 * fails at once.
 */
const UNREACHABLE_RETRY_MS = 60_000;

/** informer.start(), its first list retried on transport errors for UNREACHABLE_RETRY_MS (and within the wait). */
async function startWhenReachable(informer: Informer<KubeObject>, log: Logger, o: WaitOptions): Promise<void> {
  const deadline = Date.now() + Math.min(UNREACHABLE_RETRY_MS, o.timeoutMs);
  const backoff = new Backoff({ baseMs: 250, maxMs: 5000 });
  for (;;) {
    try {
      return await informer.start();
    } catch (err) {
      const transport = err instanceof KubeError && err.kind !== "status" && err.kind !== "tls";
      const delay = backoff.next();
      if (!transport || o.signal?.aborted || Date.now() + delay > deadline) throw err;
      log.warn({ err: (err as Error).message, retryInMs: delay }, "the API is out of reach; reading the Node again");
      await sleep(delay, o.signal);
    }
  }
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
  await startWhenReachable(informer, log, o);
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
