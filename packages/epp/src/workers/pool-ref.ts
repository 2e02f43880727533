// Which of llm-d's pool-scoped objects (InferenceObjective, InferenceModelRewrite) name this EPP's pool, as
// llm-d's reconcilers check their poolRef. Apart from the watches (llmd-resources.ts) so that what reads
// the objects never loads the Kubernetes client.
import type { KubernetesObject } from "@kubernetes/client-node";

/** The group a poolRef names by default (the CRDs' default), and the only one this EPP's pool has. */
const POOL_GROUP = "inference.networking.k8s.io";

export type PoolRef = { group?: string; kind?: string; name?: string };

/** The object names `poolName` (its group defaulted as the CRD does) and is not being deleted. */
export function forPool(o: KubernetesObject & { spec?: { poolRef?: PoolRef | null } }, poolName: string): boolean {
  const ref = o.spec?.poolRef;
  return !o.metadata?.deletionTimestamp && !!o.metadata?.name && ref?.name === poolName && (ref.group ?? POOL_GROUP) === POOL_GROUP;
}
