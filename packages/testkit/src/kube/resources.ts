// The resource types the fake API server knows by kind. Any other group/version/plural reached
// through a URL (or any other kind given to upsert) is registered on first use as a namespaced
// custom resource, so CustomObjectsApi works for objects the table does not list.

export type KubeObject = {
  apiVersion?: string;
  kind?: string;
  metadata?: KubeMeta;
  [field: string]: unknown;
};

export type KubeMeta = {
  name?: string;
  generateName?: string;
  namespace?: string;
  uid?: string;
  resourceVersion?: string;
  generation?: number;
  creationTimestamp?: string;
  deletionTimestamp?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  finalizers?: string[];
  ownerReferences?: { apiVersion: string; kind: string; name: string; uid: string; controller?: boolean }[];
  [field: string]: unknown;
};

export type ResourceType = {
  group: string; // "" for core
  version: string;
  plural: string;
  kind: string;
  namespaced: boolean;
};

const BUILTIN: ResourceType[] = [
  { group: "", version: "v1", plural: "pods", kind: "Pod", namespaced: true },
  { group: "", version: "v1", plural: "configmaps", kind: "ConfigMap", namespaced: true },
  { group: "", version: "v1", plural: "services", kind: "Service", namespaced: true },
  { group: "", version: "v1", plural: "secrets", kind: "Secret", namespaced: true },
  { group: "", version: "v1", plural: "events", kind: "Event", namespaced: true },
  { group: "", version: "v1", plural: "namespaces", kind: "Namespace", namespaced: false },
  { group: "discovery.k8s.io", version: "v1", plural: "endpointslices", kind: "EndpointSlice", namespaced: true },
  { group: "coordination.k8s.io", version: "v1", plural: "leases", kind: "Lease", namespaced: true },
  { group: "apps", version: "v1", plural: "deployments", kind: "Deployment", namespaced: true },
  { group: "inference.networking.k8s.io", version: "v1", plural: "inferencepools", kind: "InferencePool", namespaced: true },
];

export const apiVersionOf = (r: ResourceType): string => (r.group === "" ? r.version : `${r.group}/${r.version}`);

export function splitApiVersion(apiVersion: string): { group: string; version: string } {
  const slash = apiVersion.indexOf("/");
  return slash < 0 ? { group: "", version: apiVersion } : { group: apiVersion.slice(0, slash), version: apiVersion.slice(slash + 1) };
}

export class ResourceTable {
  private readonly byPlural = new Map<string, ResourceType>(); // `${group}/${plural}`
  constructor() {
    for (const r of BUILTIN) this.add(r);
  }

  add(r: ResourceType): ResourceType {
    this.byPlural.set(`${r.group}/${r.plural}`, r);
    return r;
  }

  all(): ResourceType[] {
    return [...this.byPlural.values()];
  }

  /** Resolves a URL's group/version/plural, registering an unknown one as a custom resource. */
  fromPath(group: string, version: string, plural: string, kindHint?: string): ResourceType {
    const known = this.byPlural.get(`${group}/${plural}`);
    if (known) return known;
    return this.add({ group, version, plural, kind: kindHint ?? guessKind(plural), namespaced: true });
  }

  /** Resolves a kind ("Pod", "pods", "InferencePool"), optionally pinned by apiVersion. */
  fromKind(kind: string, apiVersion?: string): ResourceType {
    const gv = apiVersion ? splitApiVersion(apiVersion) : undefined;
    const lower = kind.toLowerCase();
    for (const r of this.byPlural.values()) {
      if (gv && r.group !== gv.group) continue;
      if (r.kind.toLowerCase() === lower || r.plural === lower) return r;
    }
    if (!gv) throw new Error(`fake kube api: unknown kind ${kind} (give apiVersion to register it)`);
    return this.add({ ...gv, plural: `${lower}s`, kind, namespaced: true });
  }
}

function guessKind(plural: string): string {
  const singular = plural.endsWith("s") ? plural.slice(0, -1) : plural;
  return singular.charAt(0).toUpperCase() + singular.slice(1);
}
