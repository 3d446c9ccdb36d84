// Inputs from a directory (--config-dir): YAML or JSON files holding NodeGroup,
// NodeGroupConfiguration, NodeUser and Node objects and one ClusterContext document, any
// number per file. The directory is re-read when it changes.
import { watch as fsWatch, type FSWatcher } from "node:fs";
import { readdir, readFile } from "node:fs/promises";
import path from "node:path";
import { parseAllDocuments } from "yaml";
import type {
  ClusterContext,
  NodeGroupConfigurationObject,
  NodeGroupObject,
  NodeUserObject,
} from "../render/inputs.ts";
import type { Source, SourceSnapshot } from "./types.ts";

export const GROUP_LABEL = "node.deckhouse.io/group";

export class ConfigDirError extends Error {
  override name = "ConfigDirError";
}

interface Loaded {
  snapshot: SourceSnapshot;
  nodes: Map<string, string>;
}

/** Documents of a file; a `kind: List` (what `kubectl get -o json` writes) counts as its items. */
function parseObjects(file: string, text: string): Record<string, unknown>[] {
  let docs: unknown[];
  if (file.endsWith(".json")) {
    // JSON.parse is far lighter than the YAML parser for large dumps (thousands of Nodes).
    try {
      docs = [JSON.parse(text)];
    } catch (err) {
      throw new ConfigDirError(`${file}: ${(err as Error).message}`);
    }
  } else {
    docs = parseAllDocuments(text).map((doc) => {
      if (doc.errors.length) throw new ConfigDirError(`${file}: ${doc.errors[0]?.message}`);
      return doc.toJS();
    });
  }
  const out: Record<string, unknown>[] = [];
  for (const d of docs) {
    if (!d || typeof d !== "object") continue;
    const obj = d as Record<string, unknown>;
    if (
      obj.kind === "List" ||
      (typeof obj.kind === "string" && obj.kind.endsWith("List") && Array.isArray(obj.items))
    ) {
      out.push(...((obj.items as Record<string, unknown>[]) ?? []));
    } else out.push(obj);
  }
  return out;
}

export async function loadConfigDir(dir: string): Promise<Loaded> {
  let names: string[];
  try {
    names = (await readdir(dir)).filter((f) => /\.(ya?ml|json)$/.test(f)).sort();
  } catch (err) {
    throw new ConfigDirError(`cannot read config dir ${dir}: ${(err as Error).message}`);
  }
  const nodeGroups: NodeGroupObject[] = [];
  const configurations: NodeGroupConfigurationObject[] = [];
  const users: NodeUserObject[] = [];
  const nodes = new Map<string, string>();
  let context: ClusterContext | undefined;
  let contextFile = "";
  for (const name of names) {
    const file = path.join(dir, name);
    const text = await readFile(file, "utf8");
    for (const obj of parseObjects(file, text)) {
      const kind = obj.kind;
      const metaName = (obj.metadata as { name?: string } | undefined)?.name;
      if (kind !== "ClusterContext" && typeof metaName !== "string") {
        throw new ConfigDirError(`${file}: a ${String(kind)} without metadata.name`);
      }
      switch (kind) {
        case "NodeGroup":
          nodeGroups.push(obj as unknown as NodeGroupObject);
          break;
        case "NodeGroupConfiguration":
          configurations.push(obj as unknown as NodeGroupConfigurationObject);
          break;
        case "NodeUser":
          users.push(obj as unknown as NodeUserObject);
          break;
        case "Node": {
          const group = (obj.metadata as { labels?: Record<string, string> }).labels?.[GROUP_LABEL];
          if (group) nodes.set(metaName as string, group);
          break;
        }
        case "ClusterContext": {
          if (context) throw new ConfigDirError(`${file}: a second ClusterContext (the first is in ${contextFile})`);
          const { apiVersion: _a, kind: _k, ...rest } = obj;
          context = rest as unknown as ClusterContext;
          contextFile = file;
          break;
        }
        default:
          throw new ConfigDirError(
            `${file}: unknown kind '${String(kind)}' (expected NodeGroup, NodeGroupConfiguration, NodeUser, Node or ClusterContext)`,
          );
      }
    }
  }
  return { snapshot: { inputs: { nodeGroups, configurations, users, context } }, nodes };
}

export class DirectorySource implements Source {
  readonly dir: string;
  private loaded: Loaded | undefined;
  private watcher: FSWatcher | undefined;
  private timer: NodeJS.Timeout | undefined;
  private readonly onError: (err: Error) => void;

  constructor(dir: string, onError: (err: Error) => void) {
    this.dir = dir;
    this.onError = onError;
  }

  async start(onChange: () => void): Promise<void> {
    this.loaded = await loadConfigDir(this.dir);
    // Editors write in bursts (temp file, rename): settle for a moment before re-reading.
    this.watcher = fsWatch(this.dir, () => {
      clearTimeout(this.timer);
      this.timer = setTimeout(() => {
        loadConfigDir(this.dir).then(
          (l) => {
            this.loaded = l;
            onChange();
          },
          (err: Error) => this.onError(err),
        );
      }, 200);
    });
    onChange();
  }

  snapshot(): SourceSnapshot {
    if (!this.loaded) throw new Error("DirectorySource: snapshot before start");
    return this.loaded.snapshot;
  }

  async nodeGroupOf(node: string): Promise<string | undefined> {
    return this.loaded?.nodes.get(node);
  }

  stop(): void {
    clearTimeout(this.timer);
    this.watcher?.close();
  }
}
