// Local mode's bundle source (`--bundle FILE`): the daemon reads the file on every tick, so what
// one read keeps in memory is what the resident process grows by; and the 8 MiB limit holds for
// files that say how big they are and for those that do not.
import t, { type Test } from "tap";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { FileBundleSource } from "../../agent/converge/source.ts";
import { BundleRejectedError, MAX_BUNDLE_BYTES } from "../../bundles/verify.ts";

async function dir(t: Test): Promise<string> {
  const d = await mkdtemp(path.join(os.tmpdir(), "bundle-source-"));
  t.teardown(() => rm(d, { recursive: true, force: true }));
  return d;
}

t.test("a small bundle file is read into a buffer the size of the file, not of the limit", async (t) => {
  const file = path.join(await dir(t), "b.json");
  await writeFile(file, '{"checksum":"x"}');
  const got = await new FileBundleSource(file).fetch();
  if ("notModified" in got) throw new Error("a first read cannot be 'not modified'");
  t.equal(got.raw.toString(), '{"checksum":"x"}');
  // The allocation behind the bytes is what stays resident between ticks.
  t.ok(got.raw.buffer.byteLength <= got.raw.length + 1, `allocated ${got.raw.buffer.byteLength} bytes`);
  t.ok("notModified" in (await new FileBundleSource(file).fetch(got.etag)), "the same bytes are 'not modified'");
});

t.test("a file of exactly the limit is read whole; one byte more is refused", async (t) => {
  const d = await dir(t);
  const at = path.join(d, "at.json");
  await writeFile(at, Buffer.alloc(MAX_BUNDLE_BYTES, 0x20));
  const got = await new FileBundleSource(at).fetch();
  t.equal("raw" in got && got.raw.length, MAX_BUNDLE_BYTES);
  const over = path.join(d, "over.json");
  await writeFile(over, Buffer.alloc(MAX_BUNDLE_BYTES + 1, 0x20));
  await t.rejects(new FileBundleSource(over).fetch(), BundleRejectedError);
  await t.rejects(new FileBundleSource(over).fetch(), /larger than the 8388608-byte limit/);
});

t.test("a file without a size (a character device that never ends) is refused after the limit", async (t) => {
  // /dev/zero reports size 0 and never reaches end of file: only the limit ends the read.
  await t.rejects(
    new FileBundleSource("/dev/zero").fetch(),
    /file \/dev\/zero rejected: larger than the 8388608-byte limit/,
  );
});
