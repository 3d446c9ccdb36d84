// 003_install_ca_certificates: the cluster's (and the registry's) CAs in the OS trust store.
import { arr, obj, type Schema, SpecError, str } from "../schema.ts";
import { CERT_NAME } from "../rules.ts";
import { builtinStep } from "./descriptor.ts";

/** PEM text holding a certificate; `what` names it in the error. */
export const pemCertificate = (what: string): Schema<string> =>
  str({ max: 256 * 1024, pattern: /-----BEGIN CERTIFICATE-----/, what: `a PEM ${what} certificate` });

export const CA_CERTIFICATE = obj({
  /** Becomes the file name in the trust store (`bashible-<name>.crt`). */
  name: str({ pattern: CERT_NAME, what: "a certificate name (letters, digits, '.', '_', '-')" }),
  pem: {
    parse(v, field) {
      const text = pemCertificate("CA").parse(v, field);
      // A key has no business in a trust store; dropping it silently would keep it in the
      // stored bundle and hide a leak from whoever pasted it.
      if (/-----BEGIN [A-Z ]*PRIVATE KEY-----/.test(text)) {
        throw new SpecError(field, "carries a PRIVATE KEY block; refused (remove the key from the CA entry)");
      }
      return text;
    },
  },
});

export const caCertificates = builtinStep({
  name: "003_install_ca_certificates",
  kind: "CACertificates",
  spec: obj({ certificates: arr(CA_CERTIFICATE, { max: 256, unique: (c) => c.name }) }),
  units: {},
});
