// Deciding a CertificateSigningRequest: the approval subresource takes the whole object
// (metadata as it is, so labels, owners and finalizers stay), with resourceVersion as a
// compare-and-swap; the decision is a condition appended to the ones it has.
import type { KubeClient } from "../../lib/kube/client.ts";
import type { KubeObject } from "../../lib/kube/api.ts";
import { Backoff } from "../../lib/backoff.ts";

export const CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests";

export interface Csr extends KubeObject {
  spec: {
    request: string;
    signerName: string;
    username?: string;
    groups?: string[];
    usages?: string[];
    expirationSeconds?: number;
  };
  status?: { conditions?: { type: string; status?: string; message?: string }[]; certificate?: string };
}

export function isDecided(csr: Csr): boolean {
  if (csr.status?.certificate) return true;
  return (csr.status?.conditions ?? []).some((c) => c.type === "Approved" || c.type === "Denied");
}

export async function decideCsr(
  client: KubeClient,
  csr: Csr,
  decision: { approve: boolean; reason: string; message: string },
): Promise<void> {
  const condition = {
    type: decision.approve ? "Approved" : "Denied",
    status: "True",
    reason: decision.reason,
    message: decision.message,
    lastUpdateTime: new Date().toISOString(),
  };
  await client.request("PUT", `${CSRS}/${encodeURIComponent(csr.metadata.name)}/approval`, {
    body: {
      apiVersion: "certificates.k8s.io/v1",
      kind: "CertificateSigningRequest",
      metadata: csr.metadata,
      spec: csr.spec,
      status: { conditions: [...(csr.status?.conditions ?? []), condition] },
    },
  });
}

/**
 * Another pass for a CSR whose decision failed or waits, 5 s doubling to 5 minutes per CSR: no
 * watch event may come to bring it back.
 */
export class CsrRetries {
  private readonly timers = new Map<string, { timer: NodeJS.Timeout; backoff: Backoff }>();
  private readonly pass: () => void;
  private readonly stopped: () => boolean;

  constructor(pass: () => void, stopped: () => boolean) {
    this.pass = pass;
    this.stopped = stopped;
  }

  later(name: string): void {
    if (this.stopped()) return;
    const previous = this.timers.get(name);
    if (previous) clearTimeout(previous.timer);
    const backoff = previous?.backoff ?? new Backoff({ baseMs: 5_000, maxMs: 300_000 });
    const timer = setTimeout(this.pass, backoff.next());
    timer.unref();
    this.timers.set(name, { timer, backoff });
  }

  forget(name: string): void {
    const r = this.timers.get(name);
    if (r) clearTimeout(r.timer);
    this.timers.delete(name);
  }

  clear(): void {
    for (const r of this.timers.values()) clearTimeout(r.timer);
    this.timers.clear();
  }
}
