// Which node group a bootstrap token is for, read from the caller's identity the way the API
// server passes it on (the token's auth-extra-groups): the bundle server scopes what the token
// may read by it, and the kubelet client approver records it as the group the node's name
// belongs to. One rule, both sides.
//   system:bootstrappers:d8-node-manager:<group>   → <group> (the extra group our tokens carry)
//   system:bootstrap:<id> in system:bootstrappers:d8-node-manager, nothing more
//                                                   → ask label node-manager.deckhouse.io/node-group
//                                                     of kube-system/bootstrap-token-<id> (tokens
//                                                     Deckhouse's own hook made)

/** Deckhouse's extra group for node bootstrap tokens (its RBAC binds this group). */
export const BOOTSTRAP_GROUP = "system:bootstrappers:d8-node-manager";
/** Our tokens also carry `<BOOTSTRAP_GROUP>:<node group>`, which scopes them without a lookup. */
export const BOOTSTRAP_GROUP_PREFIX = `${BOOTSTRAP_GROUP}:`;
/** The user name of a bootstrap token: `system:bootstrap:<token id>`. */
export const BOOTSTRAP_USER_PREFIX = "system:bootstrap:";

export interface TokenScope {
  /** Groups named by the caller's extra groups. */
  groups: Set<string>;
  /** Set when only the token Secret's label can tell (a token Deckhouse's hook made). */
  lookupTokenId?: string;
}

export function tokenScope(user: string, groups: readonly string[]): TokenScope {
  const named = new Set<string>();
  for (const g of groups) if (g.startsWith(BOOTSTRAP_GROUP_PREFIX)) named.add(g.slice(BOOTSTRAP_GROUP_PREFIX.length));
  if (!named.size && user.startsWith(BOOTSTRAP_USER_PREFIX) && groups.includes(BOOTSTRAP_GROUP)) {
    return { groups: named, lookupTokenId: user.slice(BOOTSTRAP_USER_PREFIX.length) };
  }
  return { groups: named };
}
