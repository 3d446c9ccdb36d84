// Bundle acceptance: every step's spec is checked against its kind's schema before anything
// runs, and a malformed one is a rejected bundle naming the step and the field.
import t from "tap";
import { makeBundle } from "../../scripts/lib/bundle.ts";
import { acceptBundle, BundleRejectedError } from "../../bundles/verify.ts";
import { bundleChecksum } from "../../bundles/checksum.ts";
import type { BundleStep } from "../../bundles/types.ts";

/** A bundle whose checksum is right for whatever (bad) content it carries. */
function raw(steps: unknown[], context?: unknown): string {
  const b = makeBundle([]) as unknown as Record<string, unknown>;
  b.steps = steps;
  if (context) b.context = context;
  b.checksum = bundleChecksum(b as never);
  return JSON.stringify(b);
}

const user = (over: Record<string, unknown> = {}) => ({
  name: "alice",
  uid: 1100,
  sshPublicKeys: ["ssh-ed25519 AAAA a"],
  isSudoer: false,
  extraGroups: [],
  ...over,
});
const users = (u: unknown) => ({ name: "000_add_node_users", kind: "NodeUsers", spec: { users: [u] } });

const cases: [string, unknown[], RegExp][] = [
  [
    "a string where a boolean belongs",
    [users(user({ isSudoer: "false" }))],
    /step 000_add_node_users \(NodeUsers\): spec\.users\[0\]\.isSudoer: expected a boolean, got the string "false"/,
  ],
  ["a system uid", [users(user({ uid: 999 }))], /spec\.users\[0\]\.uid: 999 is below the minimum 1001/],
  [
    "a user name that is a path",
    [users(user({ name: "../root" }))],
    /spec\.users\[0\]\.name: the string "\.\.\/root" is not a user name/,
  ],
  ["a missing field", [users({ name: "alice", uid: 1100 })], /spec\.users\[0\]\.sshPublicKeys: is missing/],
  ["an unknown field", [users(user({ shell: "/bin/zsh" }))], /spec\.users\[0\]\.shell: is not a known field/],
  ["a user listed twice", [{ ...users(user()), spec: { users: [user(), user()] } }], /'alice' is listed twice/],
  [
    "a NUL byte in a script",
    [{ name: "050_x", kind: "Script", spec: { script: "echo a\u0000rm -rf /", weight: 50, source: "x", bundles: [] } }],
    /spec\.script: contains a NUL byte/,
  ],
  [
    "a package name that is a path",
    [
      {
        name: "007_p",
        kind: "RegistryPackages",
        spec: { packages: [{ name: "../../etc", digest: `sha256:${"a".repeat(64)}`, repository: "r" }] },
      },
    ],
    /spec\.packages\[0\]\.name/,
  ],
  [
    "a digest that is not one",
    [
      {
        name: "007_p",
        kind: "RegistryPackages",
        spec: { packages: [{ name: "jq", digest: "sha256:zz", repository: "r" }] },
      },
    ],
    /spec\.packages\[0\]\.digest: .* is not sha256:<64 hex>/,
  ],
  ["an unknown kind", [{ name: "080_x", kind: "Teleport", spec: {} }], /step 080_x has unknown kind 'Teleport'/],
  ["a spec that is not an object", [{ name: "004_x", kind: "DeckhousePath", spec: "yes" }], /spec: expected an object/],
  [
    "a step out of order",
    [
      { name: "004_b", kind: "DeckhousePath", spec: {} },
      { name: "003_a", kind: "DeckhousePath", spec: {} },
    ],
    /not in name order/,
  ],
];

for (const [what, steps, message] of cases) {
  t.test(`${what} rejects the bundle and says where`, async (t) => {
    const err = (() => {
      try {
        acceptBundle(raw(steps), "test");
      } catch (e) {
        return e;
      }
    })();
    t.type(err, BundleRejectedError);
    t.match((err as Error).message, message);
  });
}

t.test("the context is checked too", async (t) => {
  const ctx = JSON.parse(JSON.stringify(makeBundle([]).context));
  ctx.nodeGroup.disruptions.approvalMode = "Whenever";
  t.throws(
    () => acceptBundle(raw([], ctx), "test"),
    /context\.nodeGroup\.disruptions\.approvalMode: must be one of Manual, Automatic, RollingUpdate/,
  );
});

t.test("a good bundle passes unchanged", async (t) => {
  const step: BundleStep = { name: "000_add_node_users", kind: "NodeUsers", spec: { users: [user() as never] } };
  const b = makeBundle([step]);
  t.same(acceptBundle(JSON.stringify(b), "test"), b);
});
