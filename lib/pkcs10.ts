// A reader of PKCS#10 certificate signing requests (RFC 2986) that returns only the identity a CSR
// asks for (subject CN and O, subjectAltName entries), so an approver can compare it with what a node
// may claim. The DER rules are strict: a CSR that two parsers could read differently is refused, not
// guessed at, because the approver must see exactly what the issued certificate will say.
// The signature is not checked: the API server verifies it before it stores a CSR.
import { SocketAddress } from "node:net";

export interface CsrInfo {
  /** Subject CN; the last one when there are several, as Go's pkix.Name reads it. */
  commonName: string | undefined;
  /** Subject O values, in order. */
  organizations: string[];
  /** SAN dNSName entries. */
  dnsNames: string[];
  /** SAN iPAddress entries: IPv4 dotted, IPv6 as Node's net.SocketAddress prints it ("fd00::5"). */
  ipAddresses: string[];
  /** SAN rfc822Name entries. */
  emailAddresses: string[];
  /** SAN uniformResourceIdentifier entries. */
  uris: string[];
  /** SAN entries of other kinds (otherName, x400Address, directoryName, ediPartyName, registeredID). */
  otherSanKinds: number;
}

/** The input is not a well-formed CSR; retrying will not change that. */
export class CsrParseError extends Error {
  override name = "CsrParseError";
  readonly permanent = true;
}

// A kubelet CSR is well under 2 KiB; the limit only stops a hostile object from costing much.
const MAX_DER = 16 * 1024;
const MAX_PEM = 32 * 1024; // base64 of MAX_DER plus line breaks and the two labels
// OIDs this module compares against are short; a long one costs BigInt work for nothing.
const MAX_OID = 128;

const BOOLEAN = 0x01;
const INTEGER = 0x02;
const BIT_STRING = 0x03;
const OCTET_STRING = 0x04;
const OID = 0x06;
const SEQUENCE = 0x30;
const SET = 0x31;
const ATTRIBUTES = 0xa0; // [0] IMPLICIT SET OF Attribute

const UTF8_STRING = 0x0c;
const PRINTABLE_STRING = 0x13;
const T61_STRING = 0x14;
const IA5_STRING = 0x16;
const UNIVERSAL_STRING = 0x1c;
const BMP_STRING = 0x1e;

const OID_CN = "2.5.4.3";
const OID_O = "2.5.4.10";
const OID_EXTENSION_REQUEST = "1.2.840.113549.1.9.14";
const OID_SAN = "2.5.29.17";

const SAN_EMAIL = 0x81;
const SAN_DNS = 0x82;
const SAN_URI = 0x86;
const SAN_IP = 0x87;
// otherName, x400Address, directoryName, ediPartyName (constructed) and registeredID (primitive).
const SAN_OTHER = new Set([0xa0, 0xa3, 0xa4, 0xa5, 0x88]);

/** One DER element: its tag, where it starts (`at`), and its content's bounds. */
interface Tlv {
  tag: number;
  at: number;
  start: number;
  end: number;
}

function fail(message: string): never {
  throw new CsrParseError(`malformed CSR: ${message}`);
}

const hex = (n: number) => `0x${n.toString(16).padStart(2, "0")}`;

/** The element at `at`, which must end by `limit` (the end of whatever contains it). */
function readTlv(der: Uint8Array, at: number, limit: number, what: string): Tlv {
  if (at >= limit) fail(`${what}: missing at offset ${at}`);
  const tag = der[at]!;
  if ((tag & 0x1f) === 0x1f) fail(`${what}: multi-byte tag at offset ${at} is not used by CSRs`);
  if (at + 1 >= limit) fail(`${what}: truncated before its length at offset ${at + 1}`);
  const first = der[at + 1]!;
  let start = at + 2;
  let length = first;
  if (first === 0x80) fail(`${what}: indefinite length at offset ${at + 1} is not DER`);
  if (first > 0x80) {
    const n = first & 0x7f;
    if (n > 4) fail(`${what}: a ${n}-octet length at offset ${at + 1} is too long`);
    start += n;
    if (start > limit) fail(`${what}: truncated inside its length at offset ${at + 1}`);
    length = 0;
    for (let i = at + 2; i < start; i++) length = length * 256 + der[i]!;
    // DER has one encoding per length; another one is a sign of a non-DER encoder or of tampering.
    if (der[at + 2] === 0 || length < 0x80) fail(`${what}: non-minimal length at offset ${at + 1}`);
  }
  const end = start + length;
  if (end > limit) fail(`${what}: ${length} content bytes at offset ${start} run past the end (truncated)`);
  return { tag, at, start, end };
}

/** The elements inside a constructed one; they must fill it exactly. */
function children(der: Uint8Array, parent: Tlv, what: string): Tlv[] {
  const out: Tlv[] = [];
  for (let pos = parent.start; pos < parent.end; ) {
    const child = readTlv(der, pos, parent.end, what);
    out.push(child);
    pos = child.end;
  }
  return out;
}

function expect(t: Tlv | undefined, tag: number, what: string): Tlv {
  if (t === undefined) fail(`${what}: missing`);
  if (t.tag !== tag) fail(`${what}: expected tag ${hex(tag)}, got ${hex(t.tag)} at offset ${t.at}`);
  return t;
}

function noMore(rest: Tlv[], what: string): void {
  const extra = rest[0];
  if (extra !== undefined) fail(`${what}: unexpected element (tag ${hex(extra.tag)}) at offset ${extra.at}`);
}

function readOid(der: Uint8Array, t: Tlv, what: string): string {
  const len = t.end - t.start;
  if (len === 0) fail(`${what}: empty OID at offset ${t.at}`);
  if (len > MAX_OID) fail(`${what}: ${len}-byte OID at offset ${t.at} is over the ${MAX_OID}-byte limit`);
  const arcs: bigint[] = [];
  let arc = 0n;
  let fresh = true;
  for (let i = t.start; i < t.end; i++) {
    const b = der[i]!;
    if (fresh && b === 0x80) fail(`${what}: non-minimal OID arc at offset ${i}`);
    arc = (arc << 7n) | BigInt(b & 0x7f);
    fresh = (b & 0x80) === 0;
    if (fresh) {
      arcs.push(arc);
      arc = 0n;
    }
  }
  if (!fresh) fail(`${what}: OID at offset ${t.at} ends inside an arc`);
  // The first encoded value packs the first two arcs as 40 * a + b, with a in 0..2.
  const first = arcs[0]!;
  const head = first < 40n ? [0n, first] : first < 80n ? [1n, first - 40n] : [2n, first - 80n];
  return [...head, ...arcs.slice(1)].join(".");
}

const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

// PrintableString's alphabet, plus '*' and '&', which Go's crypto/x509 also accepts because real
// CSRs carry them.
const PRINTABLE = /^[A-Za-z0-9 '()+,\-./:=?*&]*$/;

function isAscii(bytes: Uint8Array): boolean {
  return bytes.every((b) => b < 0x80);
}

function readString(der: Uint8Array, t: Tlv, what: string): string {
  const bytes = der.subarray(t.start, t.end);
  const latin1 = () => Buffer.from(bytes).toString("latin1");
  switch (t.tag) {
    case UTF8_STRING:
      try {
        return utf8.decode(bytes);
      } catch {
        return fail(`${what}: invalid UTF-8 at offset ${t.at}`);
      }
    case PRINTABLE_STRING:
      if (!PRINTABLE.test(latin1())) fail(`${what}: PrintableString at offset ${t.at} has a forbidden character`);
      return latin1();
    case IA5_STRING:
      if (!isAscii(bytes)) fail(`${what}: IA5String at offset ${t.at} is not ASCII`);
      return latin1();
    case T61_STRING:
      // Teletex in practice holds Latin-1, which is how Go and OpenSSL read it.
      return latin1();
    case BMP_STRING:
      return utf16be(bytes, t, what);
    case UNIVERSAL_STRING:
      return utf32be(bytes, t, what);
    default:
      return fail(`${what}: expected a string, got tag ${hex(t.tag)} at offset ${t.at}`);
  }
}

function utf16be(bytes: Uint8Array, t: Tlv, what: string): string {
  if (bytes.length % 2 !== 0) fail(`${what}: BMPString at offset ${t.at} has an odd length`);
  const swapped = Buffer.alloc(bytes.length);
  let high = false; // the previous unit was a high surrogate, so this one must be a low one
  for (let i = 0; i < bytes.length; i += 2) {
    const unit = (bytes[i]! << 8) | bytes[i + 1]!;
    const isHigh = unit >= 0xd800 && unit <= 0xdbff;
    const isLow = unit >= 0xdc00 && unit <= 0xdfff;
    // A lone surrogate would come out as U+FFFD or a broken string; either hides what was sent.
    if (high !== isLow) fail(`${what}: BMPString at offset ${t.at} has a lone surrogate`);
    high = isHigh;
    swapped[i] = bytes[i + 1]!;
    swapped[i + 1] = bytes[i]!;
  }
  if (high) fail(`${what}: BMPString at offset ${t.at} has a lone surrogate`);
  return swapped.toString("utf16le");
}

function utf32be(bytes: Uint8Array, t: Tlv, what: string): string {
  if (bytes.length % 4 !== 0) fail(`${what}: UniversalString at offset ${t.at} is not a multiple of 4 bytes`);
  let out = "";
  for (let i = 0; i < bytes.length; i += 4) {
    const cp = ((bytes[i]! << 24) | (bytes[i + 1]! << 16) | (bytes[i + 2]! << 8) | bytes[i + 3]!) >>> 0;
    if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      fail(`${what}: UniversalString at offset ${t.at} has an invalid code point`);
    out += String.fromCodePoint(cp);
  }
  return out;
}

function formatIp(bytes: Uint8Array, t: Tlv): string {
  if (bytes.length === 4) return bytes.join(".");
  if (bytes.length !== 16) fail(`subjectAltName: IP address of ${bytes.length} bytes at offset ${t.at}`);
  const groups: string[] = [];
  for (let i = 0; i < 16; i += 2) groups.push(((bytes[i]! << 8) | bytes[i + 1]!).toString(16));
  // Node's own formatter, so the result compares equal to addresses normalized the same way.
  return new SocketAddress({ address: groups.join(":"), family: "ipv6" }).address;
}

function readName(der: Uint8Array, name: Tlv, info: CsrInfo): void {
  for (const rdn of children(der, name, "subject")) {
    expect(rdn, SET, "subject RDN");
    for (const atv of children(der, rdn, "subject attribute")) {
      expect(atv, SEQUENCE, "subject attribute");
      const [type, value, ...rest] = children(der, atv, "subject attribute");
      const oid = readOid(der, expect(type, OID, "subject attribute type"), "subject attribute type");
      if (value === undefined) fail(`subject attribute ${oid}: missing value`);
      noMore(rest, `subject attribute ${oid}`);
      if (oid === OID_CN) info.commonName = readString(der, value, "subject CN");
      else if (oid === OID_O) info.organizations.push(readString(der, value, "subject O"));
    }
  }
}

function readAttributes(der: Uint8Array, attributes: Tlv, info: CsrInfo): void {
  let seen = false;
  for (const attr of children(der, attributes, "attribute")) {
    expect(attr, SEQUENCE, "attribute");
    const [type, values, ...rest] = children(der, attr, "attribute");
    const oid = readOid(der, expect(type, OID, "attribute type"), "attribute type");
    const set = expect(values, SET, `attribute ${oid} values`);
    noMore(rest, `attribute ${oid}`);
    const items = children(der, set, `attribute ${oid} value`);
    if (oid !== OID_EXTENSION_REQUEST) continue;
    // Two sets of requested extensions could disagree; which one a CA honours is not ours to guess.
    if (seen) fail("the extensionRequest attribute appears twice");
    seen = true;
    if (items.length !== 1) fail(`the extensionRequest attribute has ${items.length} values, want 1`);
    readExtensions(der, expect(items[0], SEQUENCE, "extensionRequest"), info);
  }
}

function readExtensions(der: Uint8Array, extensions: Tlv, info: CsrInfo): void {
  let seenSan = false;
  for (const ext of children(der, extensions, "extension")) {
    expect(ext, SEQUENCE, "extension");
    const parts = children(der, ext, "extension");
    const id = readOid(der, expect(parts[0], OID, "extension ID"), "extension ID");
    let i = 1;
    const critical = parts[i];
    if (critical?.tag === BOOLEAN) {
      const v = critical.end - critical.start === 1 ? der[critical.start] : undefined;
      if (v !== 0x00 && v !== 0xff) fail(`extension ${id}: invalid BOOLEAN at offset ${critical.at}`);
      i++;
    }
    const value = expect(parts[i], OCTET_STRING, `extension ${id} value`);
    noMore(parts.slice(i + 1), `extension ${id}`);
    if (id !== OID_SAN) continue;
    if (seenSan) fail("the subjectAltName extension appears twice");
    seenSan = true;
    readSan(der, value, info);
  }
}

function readSan(der: Uint8Array, octets: Tlv, info: CsrInfo): void {
  const names = expect(readTlv(der, octets.start, octets.end, "subjectAltName"), SEQUENCE, "subjectAltName");
  if (names.end !== octets.end) fail(`subjectAltName: trailing bytes at offset ${names.end}`);
  for (const gn of children(der, names, "subjectAltName entry")) {
    const bytes = der.subarray(gn.start, gn.end);
    const ia5 = (kind: string) => {
      if (!isAscii(bytes)) fail(`subjectAltName ${kind} at offset ${gn.at} is not ASCII`);
      return Buffer.from(bytes).toString("latin1");
    };
    if (gn.tag === SAN_DNS) info.dnsNames.push(ia5("dNSName"));
    else if (gn.tag === SAN_IP) info.ipAddresses.push(formatIp(bytes, gn));
    else if (gn.tag === SAN_EMAIL) info.emailAddresses.push(ia5("rfc822Name"));
    else if (gn.tag === SAN_URI) info.uris.push(ia5("uniformResourceIdentifier"));
    else if (SAN_OTHER.has(gn.tag)) info.otherSanKinds++;
    else fail(`subjectAltName: unexpected tag ${hex(gn.tag)} at offset ${gn.at}`);
  }
}

const PEM_LABEL = "CERTIFICATE REQUEST";

function fromPem(text: string): Uint8Array {
  if (text.length > MAX_PEM) fail(`${text.length} characters of PEM is over the ${MAX_PEM}-character limit`);
  const pem = text.trim();
  if (pem === "") fail("empty input");
  // Found with indexOf, not one regular expression over the whole text: a hostile request with a
  // long run of "-----END " makes a lazy pattern backtrack quadratically (seconds per parse).
  const firstLine = pem.indexOf("\n");
  const header = (firstLine < 0 ? pem : pem.slice(0, firstLine)).trimEnd();
  const lastLine = pem.lastIndexOf("\n");
  const footer = (lastLine < 0 ? "" : pem.slice(lastLine + 1)).trim();
  const label = (line: string, kind: "BEGIN" | "END") =>
    line.startsWith(`-----${kind} `) && line.endsWith("-----") && line.length >= kind.length + 11
      ? line.slice(kind.length + 6, -5)
      : undefined;
  const begin = label(header, "BEGIN");
  const end = firstLine < 0 || lastLine <= firstLine ? undefined : label(footer, "END");
  if (begin === undefined || end === undefined)
    fail("not a PEM block (expected -----BEGIN CERTIFICATE REQUEST----- ... -----END ...-----)");
  const body = pem.slice(firstLine + 1, lastLine);
  if (begin !== PEM_LABEL) fail(`PEM label is "${begin}", want "${PEM_LABEL}"`);
  if (end !== begin) fail(`PEM END label "${end}" does not match BEGIN label "${begin}"`);
  if (body.includes("-----")) fail("more than one PEM block");
  const b64 = body.replace(/\s+/g, "");
  // Buffer's base64 decoder skips characters it does not know; checking first keeps garbage out.
  if (b64 === "" || b64.length % 4 !== 0 || !/^[A-Za-z0-9+/]*={0,2}$/.test(b64)) fail("PEM body is not valid base64");
  return Buffer.from(b64, "base64");
}

// A Kubernetes CSR's spec.request holds PEM as bytes; DER always starts with 0x30, never with
// whitespace or '-', so the two cannot be confused.
function isPemBytes(bytes: Uint8Array): boolean {
  let i = 0;
  while (bytes[i] === 0x20 || (bytes[i]! >= 0x09 && bytes[i]! <= 0x0d)) i++;
  return bytes[i] === 0x2d;
}

/**
 * Parses a PEM "CERTIFICATE REQUEST" (the whole PEM text, possibly with surrounding whitespace, as a
 * string or as bytes) or DER bytes. Throws CsrParseError on anything malformed.
 */
export function parseCsr(input: string | Uint8Array): CsrInfo {
  return read(input).info;
}

/**
 * The DER of the CSR's subjectPublicKeyInfo (the key the certificate will carry), after the same
 * checks as parseCsr. Throws CsrParseError on anything malformed.
 */
export function csrPublicKeyInfo(input: string | Uint8Array): Uint8Array {
  return read(input).publicKeyInfo;
}

function read(input: string | Uint8Array): { info: CsrInfo; publicKeyInfo: Uint8Array } {
  let der: Uint8Array;
  if (typeof input === "string") der = fromPem(input);
  else if (isPemBytes(input)) {
    if (input.length > MAX_PEM) fail(`${input.length} bytes of PEM is over the ${MAX_PEM}-byte limit`);
    der = fromPem(Buffer.from(input).toString("utf8"));
  } else der = input;
  if (der.length === 0) fail("empty input");
  if (der.length > MAX_DER) fail(`${der.length} bytes of DER is over the ${MAX_DER}-byte limit`);

  const csr = expect(readTlv(der, 0, der.length, "CertificationRequest"), SEQUENCE, "CertificationRequest");
  if (csr.end !== der.length) fail(`${der.length - csr.end} trailing byte(s) after the CSR`);
  const [reqInfo, sigAlg, sig, ...extra] = children(der, csr, "CertificationRequest");
  const cri = expect(reqInfo, SEQUENCE, "certificationRequestInfo");
  expect(sigAlg, SEQUENCE, "signatureAlgorithm");
  const signature = expect(sig, BIT_STRING, "signature");
  if (signature.start === signature.end) fail("signature: empty BIT STRING");
  noMore(extra, "CertificationRequest");

  const [version, subject, spki, attributes, ...more] = children(der, cri, "certificationRequestInfo");
  const v = expect(version, INTEGER, "version");
  if (v.end - v.start !== 1 || der[v.start] !== 0) fail("version: only v1 (0) is defined");
  const info: CsrInfo = {
    commonName: undefined,
    organizations: [],
    dnsNames: [],
    ipAddresses: [],
    emailAddresses: [],
    uris: [],
    otherSanKinds: 0,
  };
  readName(der, expect(subject, SEQUENCE, "subject"), info);
  const key = expect(spki, SEQUENCE, "subjectPKInfo");
  readAttributes(der, expect(attributes, ATTRIBUTES, "attributes"), info);
  noMore(more, "certificationRequestInfo");
  return { info, publicKeyInfo: der.slice(key.at, key.end) };
}
