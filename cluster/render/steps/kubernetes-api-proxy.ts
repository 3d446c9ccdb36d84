// 000_configure_kubernetes_api_proxy: with the kubelet, which reaches the API servers through it.
import { apiProxy } from "../../../bundles/steps/kubernetes-api-proxy.ts";
import { runsKubelet } from "./kubelet.ts";
import { checked, type SpecBuilder } from "./spec-builder.ts";

export const apiProxySpec: SpecBuilder<"KubernetesApiProxy"> = (i) =>
  runsKubelet(i)
    ? checked(apiProxy, { listen: apiProxy.listen, upstreams: [...i.context.apiserverEndpoints] }, "context")
    : undefined;
