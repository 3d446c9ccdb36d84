// 004_add_deckhouse_paths: /opt/deckhouse/bin first on PATH.
import { obj } from "../schema.ts";
import { builtinStep } from "./descriptor.ts";

export const deckhousePath = builtinStep({
  name: "004_add_deckhouse_paths",
  kind: "DeckhousePath",
  spec: obj({}),
  units: {},
});
