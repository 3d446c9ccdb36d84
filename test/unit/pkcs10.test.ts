// The CSR reader against requests openssl makes (the real encoder, not ours), and against hand-built
// DER for what openssl will not produce: the malformed shapes an approver must refuse.
import t from "tap";
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { SocketAddress } from "node:net";
import os from "node:os";
import path from "node:path";
import { CsrParseError, parseCsr } from "../../lib/pkcs10.ts";

const dir = mkdtempSync(path.join(os.tmpdir(), "bashible-pkcs10-"));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));

// Our own config, so the host's openssl.cnf cannot add extensions of its own.
const conf = path.join(dir, "openssl.cnf");
writeFileSync(conf, "[req]\ndistinguished_name = dn\n[dn]\n[dir_sect]\nCN = directory\n");

const EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"];
const RSA = ["-newkey", "rsa:2048"];

let seq = 0;
function openssl(args: string[]): Buffer {
  return execFileSync("openssl", args, { env: { ...process.env, OPENSSL_CONF: conf }, stdio: "pipe" });
}

/** A CSR made by openssl: its PEM text, and its DER as openssl converts it. */
function makeCsr(key: string[], subj: string, exts: string[] = [], extra: string[] = []) {
  const n = seq++;
  const file = path.join(dir, `req-${n}.pem`);
  const keyFile = path.join(dir, `key-${n}.pem`);
  const addext = exts.flatMap((e) => ["-addext", e]);
  openssl([
    "req",
    "-new",
    "-config",
    conf,
    "-nodes",
    ...key,
    "-keyout",
    keyFile,
    "-subj",
    subj,
    ...addext,
    ...extra,
    "-out",
    file,
  ]);
  return { pem: readFileSync(file, "utf8"), der: openssl(["req", "-in", file, "-outform", "DER"]) };
}

const EMPTY = { dnsNames: [], ipAddresses: [], emailAddresses: [], uris: [], otherSanKinds: 0 };

t.test("a kubelet serving CSR (ECDSA P-256)", async (t) => {
  const { pem, der } = makeCsr(EC, "/O=system:nodes/CN=system:node:worker-1", [
    "subjectAltName=DNS:worker-1,IP:10.0.0.5,IP:fd00::5",
  ]);
  const want = {
    ...EMPTY,
    commonName: "system:node:worker-1",
    organizations: ["system:nodes"],
    dnsNames: ["worker-1"],
    ipAddresses: ["10.0.0.5", "fd00::5"],
  };
  t.same(parseCsr(pem), want);
  t.same(parseCsr(der), want, "DER bytes read the same");
  t.same(parseCsr(new Uint8Array(der)), want, "a plain Uint8Array too");
  t.same(parseCsr(`\n\n  ${pem.replaceAll("\n", "\r\n")}  \n`), want, "surrounding whitespace and CRLF");
  t.same(parseCsr(Buffer.from(pem)), want, "PEM as bytes, as a CSR object's spec.request holds it");
});

t.test("an RSA 2048 CSR with several O values, email and URI SANs", async (t) => {
  const { pem, der } = makeCsr(RSA, "/O=system:nodes/O=team-a/O=team-b/CN=svc", [
    "subjectAltName=email:ops@example.com,URI:spiffe://cluster.local/ns/a/sa/b,email:root@example.org",
  ]);
  const want = {
    ...EMPTY,
    commonName: "svc",
    organizations: ["system:nodes", "team-a", "team-b"],
    emailAddresses: ["ops@example.com", "root@example.org"],
    uris: ["spiffe://cluster.local/ns/a/sa/b"],
  };
  t.same(parseCsr(pem), want);
  t.same(parseCsr(der), want);
});

t.test("a CSR without extensions has no SANs", async (t) => {
  const { pem } = makeCsr(EC, "/CN=plain");
  t.same(parseCsr(pem), { ...EMPTY, commonName: "plain", organizations: [] });
  t.same(parseCsr(makeCsr(EC, "/O=only-org").pem), { ...EMPTY, commonName: undefined, organizations: ["only-org"] });
});

t.test("a UTF-8 subject round-trips", async (t) => {
  const { pem } = makeCsr(EC, "/O=équipe/CN=système", [], ["-utf8"]);
  const info = parseCsr(pem);
  t.equal(info.commonName, "système");
  t.same(info.organizations, ["équipe"]);
});

t.test("IPv6 SANs print as Node prints them; other SAN kinds are counted", async (t) => {
  const ips = ["::1", "2001:DB8:0:0:1:0:0:1", "::ffff:10.0.0.1", "1:0:0:1:0:0:0:1", "fe80::abcd:0:0:1"];
  const { pem } = makeCsr(EC, "/CN=x", [
    `subjectAltName=${ips.map((ip) => `IP:${ip}`).join(",")},RID:1.2.3.4,otherName:1.3.6.1.4.1.311.20.2.3;UTF8:u@x,dirName:dir_sect,DNS:x`,
  ]);
  const info = parseCsr(pem);
  t.same(
    info.ipAddresses,
    ips.map((ip) => new SocketAddress({ address: ip, family: "ipv6" }).address),
  );
  t.same(info.ipAddresses.slice(0, 2), ["::1", "2001:db8::1:0:0:1"], "compressed, lowercase");
  t.equal(info.otherSanKinds, 3);
  t.same(info.dnsNames, ["x"]);
});

t.test("malformed input is refused with CsrParseError", async (t) => {
  const { pem, der } = makeCsr(EC, "/CN=x", ["subjectAltName=DNS:x"]);
  const certFile = path.join(dir, "cert.pem");
  openssl([
    "req",
    "-x509",
    "-new",
    "-config",
    conf,
    "-nodes",
    ...EC,
    "-keyout",
    path.join(dir, "cert.key"),
    "-subj",
    "/CN=x",
    "-out",
    certFile,
  ]);
  t.throws(() => parseCsr(readFileSync(certFile, "utf8")), {
    name: "CsrParseError",
    message: /PEM label is "CERTIFICATE"/,
  });
  t.throws(() => parseCsr(""), CsrParseError);
  t.throws(() => parseCsr(" \n"), /empty input/);
  t.throws(() => parseCsr(new Uint8Array()), /empty input/);
  t.throws(() => parseCsr("hello"), /not a PEM block/);
  t.throws(() => parseCsr(pem.replace("MI", "M!I")), /not valid base64/);
  t.throws(() => parseCsr(pem + pem), /more than one PEM block/);
  t.throws(() => parseCsr(Buffer.from(` \n${pem}`.replace("CERTIFICATE REQUEST", "X"))), /PEM label is "X"/);
  t.throws(() => parseCsr(Buffer.concat([der, Buffer.from([0])])), /1 trailing byte\(s\) after the CSR/);
  t.throws(() => parseCsr(Buffer.alloc(70 * 1024, 0x30)), /over the 16384-byte limit/);
  // A run of END markers after a real block: refused, and found without backtracking.
  t.throws(() => parseCsr(`${pem.trim()}\n${"-----END ".repeat(3000)}`), CsrParseError);
  for (let n = 0; n < der.length; n++) {
    const err = catchErr(() => parseCsr(der.subarray(0, n)));
    if (!(err instanceof CsrParseError)) t.fail(`truncated to ${n} bytes: ${String(err)}`);
  }
  for (let i = 0; i < 500; i++) {
    const err = catchErr(() => parseCsr(randomBytes(1 + (i % 200))));
    if (!(err instanceof CsrParseError)) t.fail(`random bytes: ${String(err)}`);
  }
  // A corrupted byte anywhere either still parses or is refused cleanly; never a crash of another kind.
  for (let i = 0; i < der.length; i++) {
    for (const mask of [0x01, 0x80, 0xff]) {
      const bad = Buffer.from(der);
      bad[i] = bad[i]! ^ mask;
      const err = catchErr(() => parseCsr(bad));
      if (err !== undefined && !(err instanceof CsrParseError)) t.fail(`byte ${i} ^ ${mask}: ${String(err)}`);
    }
  }
});

function catchErr(fn: () => unknown): unknown {
  try {
    fn();
    return undefined;
  } catch (err) {
    return err;
  }
}

// Hand-built DER, for shapes openssl does not make. The signature is junk: it is not checked.
function tlv(tag: number, ...parts: Uint8Array[]): Buffer {
  const body = Buffer.concat(parts);
  const n = body.length;
  const len = n < 0x80 ? [n] : n < 0x100 ? [0x81, n] : [0x82, n >> 8, n & 0xff];
  return Buffer.concat([Buffer.from([tag, ...len]), body]);
}
const bytes = (...b: number[]) => Buffer.from(b);
const OID_CN = tlv(0x06, bytes(0x55, 0x04, 0x03));
const OID_EXT_REQ = tlv(0x06, bytes(0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x0e));
const OID_SAN = tlv(0x06, bytes(0x55, 0x1d, 0x11));
const rdn = (type: Buffer, value: Buffer) => tlv(0x31, tlv(0x30, type, value));
const san = (...names: Buffer[]) => tlv(0x30, OID_SAN, tlv(0x04, tlv(0x30, ...names)));
const extReq = (...exts: Buffer[]) => tlv(0x30, OID_EXT_REQ, tlv(0x31, tlv(0x30, ...exts)));
function request(names: Buffer[], attrs: Buffer[]): Buffer {
  const spki = tlv(0x30, tlv(0x30, tlv(0x06, bytes(0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01))), tlv(0x03, bytes(0)));
  const info = tlv(0x30, tlv(0x02, bytes(0)), tlv(0x30, ...names), spki, tlv(0xa0, ...attrs));
  return tlv(
    0x30,
    info,
    tlv(0x30, tlv(0x06, bytes(0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02))),
    tlv(0x03, bytes(0, 1)),
  );
}

t.test("hand-built requests: string kinds, SAN edge cases, DER strictness", async (t) => {
  const ok = request(
    [rdn(OID_CN, tlv(0x0c, Buffer.from("first"))), rdn(OID_CN, tlv(0x13, Buffer.from("last")))],
    [extReq(san(tlv(0x87, bytes(192, 168, 0, 1)), tlv(0x88, bytes(0x2a))))],
  );
  t.same(parseCsr(ok), {
    ...EMPTY,
    commonName: "last",
    organizations: [],
    ipAddresses: ["192.168.0.1"],
    otherSanKinds: 1,
  });

  const cn = (value: Buffer) => parseCsr(request([rdn(OID_CN, value)], [])).commonName;
  t.equal(cn(tlv(0x1e, Buffer.from("\u00fe\u{1f600}", "utf16le").swap16())), "\u00fe\u{1f600}", "BMPString");
  t.equal(cn(tlv(0x1c, bytes(0, 0, 0, 0x78, 0, 1, 0xf6, 0))), "x\u{1f600}", "UniversalString");
  t.equal(cn(tlv(0x14, bytes(0x63, 0xe9))), "c\u00e9", "T61String as Latin-1");
  t.equal(cn(tlv(0x16, Buffer.from("ia5"))), "ia5", "IA5String");
  t.throws(() => cn(tlv(0x0c, bytes(0xc3, 0x28))), /invalid UTF-8/);
  t.throws(() => cn(tlv(0x1e, bytes(0xd8, 0x3d))), /lone surrogate/);
  t.throws(() => cn(tlv(0x13, Buffer.from("a@b"))), /PrintableString/);
  t.throws(() => cn(tlv(0x04, Buffer.from("x"))), /expected a string/);

  const withSan = (...names: Buffer[]) => parseCsr(request([], [extReq(san(...names))]));
  t.throws(() => withSan(tlv(0x87, bytes(1, 2, 3, 4, 5))), /IP address of 5 bytes/);
  t.throws(() => withSan(tlv(0x89, bytes(1))), /unexpected tag 0x89/);
  t.throws(() => withSan(tlv(0x82, bytes(0xe9))), /dNSName .* not ASCII/);
  t.throws(() => parseCsr(request([], [extReq(san(), san())])), /subjectAltName extension appears twice/);
  t.throws(() => parseCsr(request([], [extReq(san()), extReq(san())])), /extensionRequest attribute appears twice/);
  t.same(withSan(tlv(0x82, Buffer.from("a".repeat(300)))).dnsNames, ["a".repeat(300)], "two-octet length");

  // Indefinite and non-minimal lengths, patched into the outermost SEQUENCE's header.
  const long = request([rdn(OID_CN, tlv(0x0c, Buffer.from("x".repeat(200))))], []);
  t.equal(long[1], 0x82);
  t.throws(() => parseCsr(Buffer.concat([bytes(0x30, 0x80), long.subarray(4), bytes(0, 0)])), /indefinite length/);
  t.throws(() => parseCsr(Buffer.concat([bytes(0x30, 0x83, 0), long.subarray(2)])), /non-minimal length/);
  t.throws(() => parseCsr(Buffer.concat([bytes(0x30, 0x85), long.subarray(2)])), /5-octet length/);
});
