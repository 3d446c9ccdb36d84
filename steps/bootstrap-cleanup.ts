// BootstrapCleanup (098_cleanup): once the kubelet has credentials of its own (kubelet.conf and
// its client certificate), the bootstrap token is no longer needed, and a token lying on a
// node's disk is a credential anyone who reads the disk can join a node with. Removed, as
// Deckhouse's 098_cleanup removes its bootstrap-token and ca.crt: the token, the CA copy
// bootstrap.sh fetched with, the curl header file holding the token, and bootstrap.sh's copy of
// itself (it carries the token too). From then on the agent talks to the API with the kubelet's
// certificate (its credentials are reloaded when these files change). The kubelet's own
// bootstrap kubeconfig is 064's and stays (the kubelet reads it only without a certificate).
import { PATHS } from "../bundles/paths.ts";
import { bootstrapCleanup } from "../bundles/steps/after-bootstrap.ts";
import { planAbsent } from "../host/file-plan.ts";
import type { Primitive, Step } from "./types.ts";

const step: Step<"BootstrapCleanup"> = {
  kind: "BootstrapCleanup",
  async plan(_spec, host) {
    const own = (await host.exists(PATHS.kubeletKubeconfig)) && (await host.exists(PATHS.kubeletClientPem));
    if (!own) return { changes: [], problems: [] };
    const changes: Primitive[] = [];
    for (const f of bootstrapCleanup.files) {
      const c = await planAbsent(host, f, { secret: true });
      if (c) changes.push({ ...c, summary: `${c.summary} (bootstrap only: the kubelet has its own credentials)` });
    }
    return { changes, problems: [] };
  },
};

export default step;
