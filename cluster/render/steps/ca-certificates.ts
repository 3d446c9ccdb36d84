// 003_install_ca_certificates: the cluster CA, and the registry's CA when the context has one.
import type { SpecBuilder } from "./spec-builder.ts";

export const caCertificatesSpec: SpecBuilder<"CACertificates"> = (i) => {
  const certificates = [{ name: "kubernetes-ca", pem: i.context.clusterCA }];
  if (i.context.registry?.ca) certificates.push({ name: "registry-ca", pem: i.context.registry.ca });
  return { certificates };
};
