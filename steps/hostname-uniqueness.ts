// HostnameUniqueness (064_check_hostname_uniqueness): while a machine joins (the bootstrap token
// is there and the kubelet has no client certificate of its own yet), no Node may already carry
// its name: a second machine under one name would take over the first one's Node object. Asked
// of the API server with the agent's credentials (the bootstrap token): 404 is the answer wanted,
// an existing Node stops the run with what to do. A cluster that does not let bootstrap tokens
// read Nodes (403) cannot be asked: reported as a problem, the join goes on (kubeadm grants its
// tokens `get nodes` as kubeadm:get-nodes; the e2e cluster grants it the same way).
import { PATHS } from "../bundles/paths.ts";
import { isForbidden, isNotFound } from "../lib/kube/errors.ts";
import { RefusedError } from "../lib/errors.ts";
import type { Step } from "./types.ts";

export class NodeNameTakenError extends RefusedError {
  override name = "NodeNameTakenError";
}

const step: Step<"HostnameUniqueness"> = {
  kind: "HostnameUniqueness",
  async plan(_spec, host, ctx) {
    const joining = (await host.exists(PATHS.bootstrapToken)) && !(await host.exists(PATHS.kubeletClientPem));
    if (!joining || !ctx.kube) return { changes: [], problems: [] };
    const name = ctx.nodeName;
    try {
      await ctx.kube.request("GET", `/api/v1/nodes/${encodeURIComponent(name)}`);
    } catch (err) {
      if (isNotFound(err)) return { changes: [], problems: [] };
      if (isForbidden(err)) {
        return {
          changes: [],
          problems: [
            {
              subject: `Node ${name}`,
              message:
                "cannot check that no other Node has this name: the bootstrap token may not read Nodes (403); grant group system:bootstrappers `get` on nodes (as kubeadm's kubeadm:get-nodes does)",
            },
          ],
        };
      }
      throw err;
    }
    throw new NodeNameTakenError(
      `a Node named '${name}' already exists in the cluster: names must be unique. Give this machine another hostname (or --node-name) and run bootstrap.sh again; if that Node was this machine, delete it (kubectl delete node ${name}) and run ${PATHS.cleanupScript} first`,
    );
  },
};

export default step;
