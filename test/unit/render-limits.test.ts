// The renderer refuses to make a bundle the node would refuse: more NodeUsers than one bundle
// carries, a bundle over the node's size limit, a spec its schema refuses. The error names the
// limit and the objects to change; a bundle it does make passes the agent's own check.
import t from "tap";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { loadConfigDir } from "../../cluster/sources/directory.ts";
import { renderGroup, serialize } from "../../cluster/render/render.ts";
import { RenderError } from "../../cluster/render/errors.ts";
import type { NodeGroupConfigurationObject, NodeUserObject, RenderInputs } from "../../cluster/render/inputs.ts";
import { MAX_NODE_USERS } from "../../bundles/steps/node-users.ts";
import { acceptBundle, MAX_BUNDLE_BYTES } from "../../bundles/verify.ts";

const EXAMPLE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../examples/cluster");
const base = (await loadConfigDir(EXAMPLE)).snapshot.inputs as RenderInputs;
const NOW = Date.parse("2026-01-01T00:00:00Z");

const user = (i: number, keys = 1): NodeUserObject => ({
  metadata: { name: `user${i}` },
  spec: {
    uid: 2000 + i,
    sshPublicKeys: Array.from({ length: keys }, (_, k) => `ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI${i}x${k} u${i}`),
    isSudoer: false,
    nodeGroups: ["*"],
  },
});
const bigNgc = (i: number): NodeGroupConfigurationObject => ({
  metadata: { name: `big-${String(i).padStart(2, "0")}.sh` },
  // 250 kB each: under the 256 KiB a script may have, 40 of them over what a bundle may.
  spec: { content: `# ${"x".repeat(250_000 - 3)}\n`, nodeGroups: ["*"], bundles: ["*"], weight: 200 },
});
const render = (patch: Partial<RenderInputs>) => {
  const i = { ...structuredClone(base), ...patch };
  return renderGroup(i.nodeGroups[0]!, i, NOW);
};
const error = (f: () => unknown): RenderError | undefined => {
  try {
    f();
  } catch (e) {
    if (e instanceof RenderError) return e;
    throw e;
  }
  return undefined;
};

t.test(`${MAX_NODE_USERS} NodeUsers render; one more is refused on the NodeGroup, naming the limit`, async (t) => {
  const users = Array.from({ length: MAX_NODE_USERS }, (_, i) => user(i));
  const ok = render({ users });
  t.ok(acceptBundle(serialize(ok.bundle), "test"), "the node accepts what was rendered");
  const err = error(() => render({ users: [...users, user(MAX_NODE_USERS)] }));
  t.equal(err?.object, "NodeGroup/worker");
  t.match(err?.message, `1001 NodeUsers select node group worker; a bundle carries at most ${MAX_NODE_USERS}`);
});

t.test("40 NodeGroupConfigurations of 250 kB make a bundle over 8 MiB: refused, the largest named", async (t) => {
  const err = error(() => render({ configurations: Array.from({ length: 40 }, (_, i) => bigNgc(i)) }));
  t.equal(err?.object, "NodeGroup/worker");
  t.match(err?.message, /its bundle would be 9\.\d MiB, over the 8\.0 MiB a node accepts/);
  t.match(err?.message, /the largest parts: NodeGroupConfiguration\/big-\d\d\.sh \(245 KiB\)/);
  const fits = render({ configurations: Array.from({ length: 30 }, (_, i) => bigNgc(i)) });
  const size = Buffer.byteLength(serialize(fits.bundle));
  t.ok(size < MAX_BUNDLE_BYTES, `30 of them fit (${size} bytes)`);
  t.ok(acceptBundle(serialize(fits.bundle), "test"));
});

t.test("a spec the node's schema refuses is refused at render, on the object it came from", async (t) => {
  // The CRD does not cap a user's keys; one bundle carries at most 256 per user.
  const err = error(() => render({ users: [user(1, 257)] }));
  t.equal(err?.object, "NodeGroup/worker");
  t.match(
    err?.message,
    /a node would refuse the bundle: step 000_add_node_users \(NodeUsers\): spec\.users\[0\]\.sshPublicKeys: has 257 items; at most 256 allowed/,
  );
});
