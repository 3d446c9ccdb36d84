// The step catalogue: bundle step kind → module. Modules load on demand, so a converge only
// loads the steps its bundle names.
import type { StepKind } from "../bundles/types.ts";
import type { Step } from "./types.ts";

type Loader<K extends StepKind> = () => Promise<{ default: Step<K> }>;

export const STEPS: Partial<{ [K in StepKind]: Loader<K> }> = {
  NodeUsers: () => import("./node-users.ts"),
  CACertificates: () => import("./ca-certificates.ts"),
  DeckhousePath: () => import("./deckhouse-path.ts"),
  RegistryPackages: () => import("./registry-packages.ts"),
  Script: () => import("./script.ts"),
};

export async function loadStep<K extends StepKind>(kind: K): Promise<Step<K>> {
  const load = STEPS[kind] as Loader<K> | undefined;
  if (!load) throw new Error(`unknown step kind '${kind}'`);
  return (await load()).default;
}
