// The test PKI is the product one (lib/pki.ts): tests issue what the standalone server issues.
export * from "../../lib/pki.ts";
