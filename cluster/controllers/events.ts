// Events on Nodes: one per thing that happened, and one per change of the reason a node waits
// (not one per pass: a node waiting an hour for a slot gets one Event, not hundreds).
import type { KubeClient } from "../../lib/kube/client.ts";
import { createEvent } from "../../lib/kube/api.ts";
import type { Logger } from "../../lib/log/log.ts";
import type { NodeEvent } from "./decide.ts";

export const COMPONENT = "bashible-controller";

export class EventRecorder {
  private readonly client: KubeClient;
  private readonly log: Logger;
  /** slot (node, or node/pod) → last message sent for it. */
  private readonly last = new Map<string, string>();
  private inFlight = 0;
  sent = 0;

  constructor(client: KubeClient, log: Logger) {
    this.client = client;
    this.log = log;
  }

  /** Sends the Event unless the same message was the last one for its slot. */
  emit(ev: NodeEvent, uid: string | undefined, slot = ev.node): void {
    const key = `${ev.reason}\n${ev.message}`;
    if (this.last.get(slot) === key) return;
    this.last.set(slot, key);
    this.log.info({ node: ev.node, reason: ev.reason }, ev.message);
    // Events are best effort and must not hold up a decision; a burst is bounded by the
    // number of nodes changing state, and each write is small.
    this.inFlight++;
    this.sent++;
    createEvent(
      this.client,
      {
        namespace: "default",
        involved: { kind: "Node", name: ev.node, uid, apiVersion: "v1" },
        reason: ev.reason,
        message: ev.message.slice(0, 1000),
        type: ev.type,
        component: COMPONENT,
      },
      { timeoutMs: 10_000 },
    )
      .catch((err: Error) =>
        this.log.warn({ node: ev.node, reason: ev.reason, err: err.message }, "cannot write Event"),
      )
      .finally(() => this.inFlight--);
  }

  /** Forgets what was said about a node (it finished or is gone), so the next wait is told again. */
  forget(node: string): void {
    for (const k of this.last.keys()) if (k === node || k.startsWith(`${node}/`)) this.last.delete(k);
  }

  get pending(): number {
    return this.inFlight;
  }
}
