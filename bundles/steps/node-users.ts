// 000_add_node_users: local users from NodeUser objects (docs/steps.md, NodeUsers).
import { arr, bool, type Infer, int, obj, opt, str } from "../schema.ts";
import { MAX_NODE_USER_UID, MIN_NODE_USER_UID, USER_NAME } from "../rules.ts";
import { builtinStep } from "./descriptor.ts";

export const NODE_USER = obj({
  name: str({ pattern: USER_NAME, what: "a user name (lower-case letters, digits, '_' and '-', at most 32)" }),
  uid: int({ min: MIN_NODE_USER_UID, max: MAX_NODE_USER_UID }),
  sshPublicKeys: arr(str({ max: 16 * 1024, pattern: /^[^\r\n]+$/, what: "a single-line SSH public key" }), {
    max: 256,
  }),
  /** /etc/shadow format; a secret. */
  passwordHash: opt(str({ max: 1024, pattern: /^[^:\r\n]*$/, what: "one /etc/shadow field (no ':' or newline)" })),
  isSudoer: bool(),
  extraGroups: arr(str({ pattern: USER_NAME, what: "a group name" }), { max: 64 }),
});
export type NodeUserSpec = Infer<typeof NODE_USER>;

/** NodeUsers one bundle carries: the node refuses more, so the server renders no more. */
export const MAX_NODE_USERS = 1000;

export const nodeUsers = builtinStep({
  name: "000_add_node_users",
  kind: "NodeUsers",
  spec: obj({ users: arr(NODE_USER, { max: MAX_NODE_USERS, unique: (u) => u.name }) }),
  units: {},
});
