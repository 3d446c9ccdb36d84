// The three resources of bashible.deckhouse.io/v1alpha1 and their discovery documents.
import { API_GROUP, API_VERSION } from "../../bundles/types.ts";

export const RESOURCES = {
  nodegroupbundles: { kind: "NodeGroupBundle", singular: "nodegroupbundle" },
  bashibles: { kind: "Bashible", singular: "bashible" },
  bootstrap: { kind: "Bootstrap", singular: "bootstrap" },
} as const;

export type ResourceName = keyof typeof RESOURCES;
export const RESOURCE_NAMES = Object.keys(RESOURCES) as ResourceName[];
export const isResource = (s: string): s is ResourceName => Object.hasOwn(RESOURCES, s);

const groupVersion = { groupVersion: API_VERSION, version: "v1alpha1" };

export const apiGroup = {
  kind: "APIGroup",
  apiVersion: "v1",
  name: API_GROUP,
  versions: [groupVersion],
  preferredVersion: groupVersion,
};

export const apiGroupList = { kind: "APIGroupList", apiVersion: "v1", groups: [apiGroup] };

export const apiResourceList = {
  kind: "APIResourceList",
  apiVersion: "v1",
  groupVersion: API_VERSION,
  resources: RESOURCE_NAMES.map((name) => ({
    name,
    singularName: RESOURCES[name].singular,
    namespaced: false,
    kind: RESOURCES[name].kind,
    verbs: ["get", "list", "watch"],
  })),
};
