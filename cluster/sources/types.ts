// What a source hands the server: the renderer's inputs plus which group each node belongs to
// (for authorization). A source calls onChange whenever any of it changed.
import type { RenderInputs } from "../render/inputs.ts";

export interface SourceSnapshot {
  /** undefined context = not known yet (nothing can render). */
  inputs: Omit<RenderInputs, "context"> & { context: RenderInputs["context"] | undefined };
}

export interface Source {
  start(onChange: () => void): Promise<void>;
  snapshot(): SourceSnapshot;
  /** The group of a node (label node.deckhouse.io/group), or undefined when unknown. */
  nodeGroupOf(node: string): Promise<string | undefined>;
  /** The node group a bootstrap token was made for (its Secret's label), if the source knows tokens. */
  tokenGroupOf?(tokenId: string): Promise<string | undefined>;
  /** Re-reads the inputs afresh (Kubernetes sources: a quorum list), when it can. */
  resync?(): Promise<void>;
  stop(): void;
}
