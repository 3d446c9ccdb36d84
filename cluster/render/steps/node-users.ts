// 000_add_node_users: the NodeUsers selecting the group (checked by the renderer, one by one).
import type { SpecBuilder } from "./spec-builder.ts";

export const nodeUsersSpec: SpecBuilder<"NodeUsers"> = (i) => ({ users: i.users });
