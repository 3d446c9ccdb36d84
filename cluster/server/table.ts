// Server-side printing: what `kubectl get` shows when it asks for
// application/json;as=Table;v=v1;g=meta.k8s.io. Without it kubectl falls back to NAME + AGE.
import { CHECKSUM_ANNOTATION } from "../../bundles/types.ts";
import type { Entry } from "./store.ts";
import type { ResourceName } from "./resources.ts";

export const wantsTable = (accept: string | undefined): boolean =>
  !!accept && /as=Table/.test(accept) && /g=meta\.k8s\.io/.test(accept) && /v=v1(?!beta)/.test(accept);

const col = (name: string, type: string, description: string, format = "") => ({
  name,
  type,
  format,
  description,
  priority: 0,
});

const columns = (resource: ResourceName) => [
  col("Name", "string", "Node group", "name"),
  col("Checksum", "string", "Configuration checksum of the group"),
  ...(resource === "nodegroupbundles" ? [col("Steps", "integer", "Steps in the bundle")] : []),
];

function row(resource: ResourceName, e: Entry) {
  const meta = e.object.metadata;
  const checksum = meta.annotations?.[CHECKSUM_ANNOTATION] ?? "";
  const cells: unknown[] = [meta.name, checksum.slice(0, 16)];
  if (resource === "nodegroupbundles") cells.push((e.object.steps as unknown[] | undefined)?.length ?? 0);
  return {
    cells,
    object: { kind: "PartialObjectMetadata", apiVersion: "meta.k8s.io/v1", metadata: meta },
  };
}

export function table(resource: ResourceName, entries: Entry[], resourceVersion: string, withColumns = true) {
  return {
    kind: "Table",
    apiVersion: "meta.k8s.io/v1",
    metadata: { resourceVersion },
    ...(withColumns ? { columnDefinitions: columns(resource) } : { columnDefinitions: [] }),
    rows: entries.map((e) => row(resource, e)),
  };
}
