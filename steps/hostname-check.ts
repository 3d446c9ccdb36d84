// HostnameCheck (004_check_hostname): the name this node registers as (the kubelet's
// --hostname-override, the hostname unless --node-name or $NODE_NAME say otherwise) must be one
// Kubernetes accepts, or the run stops there, before the container runtime and the kubelet are
// set up: a kubelet with a bad name never registers. Deckhouse checks `hostname`; this checks the name actually used.
import { hostnameCheck } from "../bundles/steps/hostname.ts";
import { RefusedError } from "../lib/errors.ts";
import type { Step } from "./types.ts";

export class BadHostnameError extends RefusedError {
  override name = "BadHostnameError";
}

const step: Step<"HostnameCheck"> = {
  kind: "HostnameCheck",
  async plan(_spec, _host, ctx) {
    if (!hostnameCheck.pattern.test(ctx.nodeName)) {
      throw new BadHostnameError(
        `the node name '${ctx.nodeName}' cannot be a Kubernetes Node's: it must have at most 63 characters, only lowercase letters, digits, '-' and '.', and start and end with a letter or digit; rename the machine (hostnamectl set-hostname) or pass --node-name`,
      );
    }
    return { changes: [], problems: [] };
  },
};

export default step;
