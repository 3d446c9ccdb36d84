// 000_configure_kubernetes_api_proxy: nginx (stream) on `listen`, balancing over the API
// servers. A 000_* step: those run before the update approval, so a changed set of API servers
// reaches the node without waiting for one (Deckhouse sorts its 001_configure_kubernetes_api_proxy
// before its approval step for the same reason).
import { arr, obj, str } from "../schema.ts";
import { ENDPOINT } from "../rules.ts";
import { builtinStep } from "./descriptor.ts";

export const apiProxy = builtinStep({
  name: "000_configure_kubernetes_api_proxy",
  kind: "KubernetesApiProxy",
  spec: obj({
    listen: str({ pattern: ENDPOINT, what: "host:port" }),
    upstreams: arr(str({ pattern: ENDPOINT, what: "host:port" }), { max: 64, unique: (u) => u }),
  }),
  units: { apiProxy: "kubernetes-api-proxy.service" },
  /** Where the proxy listens on every node: what the kubelet's kubeconfigs name. */
  listen: "127.0.0.1:6445",
});
