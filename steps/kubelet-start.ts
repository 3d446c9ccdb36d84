// KubeletStart (069_start_kubelet): the kubelet has joined, i.e. holds its client certificate
// (/var/lib/kubelet/pki/kubelet-client-current.pem, written by TLS bootstrap). 064 configured and
// (re)started it; this step waits for the certificate, up to the bundle's timeout, and when it
// does not come says what to check. Steps between 064 and 069 (NodeGroupConfiguration scripts of
// weight 65–68) run before this wait, as in Deckhouse; a restart they ask for with
// kubelet-need-restart happens at the end of the run.
import { PATHS } from "../bundles/paths.ts";
import { UNITS } from "../bundles/steps/index.ts";
import type { Host } from "../host/host.ts";
import { sleep } from "../lib/sleep.ts";
import type { ScriptChange, Step } from "./types.ts";
import { unitState } from "./lib/units.ts";

const PEM = PATHS.kubeletClientPem;

/** The client certificate did not appear in time; waiting longer in this run would not help more than the next run. */
export class KubeletNotJoinedError extends Error {
  override name = "KubeletNotJoinedError";
  readonly permanent = true;
}

export const pollIntervalMs = { value: 1000 };

async function describeKubelet(host: Host): Promise<string> {
  try {
    const s = await unitState(host, UNITS.kubelet);
    return s.active ? `${UNITS.kubelet} is running` : `${UNITS.kubelet} is NOT running`;
  } catch (err) {
    return `${UNITS.kubelet}: state unknown (${(err as Error).message})`;
  }
}

export function notJoinedMessage(seconds: number, kubelet: string, group: string): string {
  return [
    `the kubelet has no client certificate after ${seconds} s (${PEM}); ${kubelet}. Check:`,
    "the kubelet's log (journalctl -u kubelet): it names the API server it tried and the error;",
    "its certificate signing request (kubectl get csr): the bashible controllers approve a bootstrap CSR only for a name no other machine holds and a token of this group (a Denied CSR says why), kube-controller-manager signs it (csrsigning);",
    `the bootstrap token in ${PATHS.bootstrapToken}: bootstrap tokens expire after 4 h, a fresh one comes with bootstrap.sh from Secret d8-cloud-instance-manager/manual-bootstrap-for-${group};`,
    "the clock (timedatectl): a skewed clock makes certificates look expired or not yet valid;",
    "the API servers through the local proxy (curl -k https://127.0.0.1:6445/healthz, journalctl -u kubernetes-api-proxy)",
  ].join(" ");
}

const step: Step<"KubeletStart", ScriptChange> = {
  kind: "KubeletStart",
  async plan(spec, host, ctx) {
    if (await host.exists(PEM)) return { changes: [], problems: [] };
    return {
      changes: [
        {
          kind: "script",
          name: ctx.stepName,
          summary: `wait up to ${spec.clientCertTimeoutSeconds} s for the kubelet's client certificate (TLS bootstrap: ${PEM})`,
        },
      ],
      problems: [],
    };
  },
  async applyOwn(_change, spec, host, ctx) {
    const deadline = Date.now() + spec.clientCertTimeoutSeconds * 1000;
    while (!(await host.exists(PEM))) {
      if (Date.now() >= deadline) {
        throw new KubeletNotJoinedError(
          notJoinedMessage(spec.clientCertTimeoutSeconds, await describeKubelet(host), ctx.nodeGroup),
        );
      }
      await sleep(Math.min(pollIntervalMs.value, Math.max(0, deadline - Date.now())), ctx.signal);
      if (ctx.signal?.aborted) throw new Error("stopped while waiting for the kubelet's client certificate");
    }
    ctx.log.info({ pem: PEM }, "the kubelet has its client certificate");
  },
};

export default step;
