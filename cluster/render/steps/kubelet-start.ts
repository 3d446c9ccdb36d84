// 069_start_kubelet: with the kubelet.
import { runsKubelet } from "./kubelet.ts";
import type { SpecBuilder } from "./spec-builder.ts";

/** How long the step waits for the kubelet's client certificate (TLS bootstrap). */
export const CLIENT_CERT_TIMEOUT_SECONDS = 300;

export const kubeletStartSpec: SpecBuilder<"KubeletStart"> = (i) =>
  runsKubelet(i) ? { clientCertTimeoutSeconds: CLIENT_CERT_TIMEOUT_SECONDS } : undefined;
