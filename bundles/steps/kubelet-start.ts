// 069_start_kubelet: the kubelet runs and has its client certificate.
import { int, obj } from "../schema.ts";
import { builtinStep } from "./descriptor.ts";

export const kubeletStart = builtinStep({
  name: "069_start_kubelet",
  kind: "KubeletStart",
  spec: obj({
    /** How long to wait for /var/lib/kubelet/pki/kubelet-client-current.pem (TLS bootstrap). */
    clientCertTimeoutSeconds: int({ min: 1, max: 3600 }),
  }),
  units: {},
});
