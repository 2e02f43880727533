// InferenceObjectives, as llm-d's router keeps them (its InferenceObjectiveReconciler and
// server/controller_config.go): the objectives in the pool's namespace whose spec.poolRef names this
// pool give the priority of the objective a request names (x-llm-d-inference-objective). llm-d.ai is
// followed when it is served, else the older inference.networking.x-k8s.io (llm-d ignores the older one
// when both are installed); neither served: --objective-priorities alone.
import { CustomObjectsApi, type KubeConfig, type KubernetesListObject, type KubernetesObject } from "@kubernetes/client-node";
import { listWatch, statusOf, type ListWatch } from "@kv-epp/kube";
import type { Logger } from "pino";

/** In llm-d's order of preference. */
export const OBJECTIVE_GROUPS = ["llm-d.ai", "inference.networking.x-k8s.io"] as const;
const VERSION = "v1alpha2";
/** The group a poolRef names by default (the CRD's default), and the only one this EPP's pool has. */
const POOL_GROUP = "inference.networking.k8s.io";

export type InferenceObjective = KubernetesObject & {
  spec?: { priority?: number | null; poolRef?: { group?: string; kind?: string; name?: string } };
};

/** Objective name -> priority, for the objectives of `poolName` not being deleted; an unset priority is 0, as llm-d reads it. */
export function objectivePriorities(items: readonly InferenceObjective[], poolName: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const o of items) {
    const ref = o.spec?.poolRef;
    if (o.metadata?.deletionTimestamp || !o.metadata?.name || ref?.name !== poolName || (ref.group ?? POOL_GROUP) !== POOL_GROUP) continue;
    const p = o.spec?.priority;
    out.set(o.metadata.name, typeof p === "number" && Number.isInteger(p) ? p : 0);
  }
  return out;
}

/**
 * The priority lookup requests read (objective name -> priority), kept current: the watched
 * InferenceObjectives win, as in llm-d where the resource is the truth; `--objective-priorities` gives
 * the names no object of this pool gives (and everything when no InferenceObjective API is served).
 */
export class ObjectivePriorities implements ReadonlyMap<string, number> {
  private merged: Map<string, number>;

  constructor(private readonly fallback: ReadonlyMap<string, number> = new Map()) {
    this.merged = new Map(fallback);
  }

  /** Replaces the watched objectives' priorities. */
  setWatched(watched: ReadonlyMap<string, number>): void {
    this.merged = new Map([...this.fallback, ...watched]);
  }

  get(name: string): number | undefined {
    return this.merged.get(name);
  }
  has(name: string): boolean {
    return this.merged.has(name);
  }
  get size(): number {
    return this.merged.size;
  }
  forEach(f: (priority: number, name: string, map: ReadonlyMap<string, number>) => void, thisArg?: unknown): void {
    this.merged.forEach((v, k) => f.call(thisArg, v, k, this));
  }
  entries(): MapIterator<[string, number]> {
    return this.merged.entries();
  }
  keys(): MapIterator<string> {
    return this.merged.keys();
  }
  values(): MapIterator<number> {
    return this.merged.values();
  }
  [Symbol.iterator](): MapIterator<[string, number]> {
    return this.merged.entries();
  }
}

export type ObjectiveWatchOptions = {
  kubeConfig: KubeConfig;
  namespace: string;
  poolName: string;
  log: Logger;
  onPriorities: (priorities: Map<string, number>) => void;
  onError: (err: unknown) => void;
  backoff?: { initialMs: number; maxMs: number };
};

/**
 * Follows the first group of OBJECTIVE_GROUPS whose list is answered. A 404 (CRD not installed) or 403
 * (no RBAC for it) before the first list moves on to the next group, as llm-d's discovery does; other
 * errors are retried by the list-watch. Never holds readiness: until listed, the static priorities hold.
 */
export function startObjectiveWatch(o: ObjectiveWatchOptions): { stop(): Promise<void> } {
  const custom = o.kubeConfig.makeApiClient(CustomObjectsApi);
  let current: ListWatch<InferenceObjective> | undefined;
  let stopped = false;
  const follow = (i: number) => {
    const group = OBJECTIVE_GROUPS[i];
    if (group === undefined || stopped) {
      if (!stopped) o.log.info({ groups: OBJECTIVE_GROUPS }, "no InferenceObjective API listed (not installed, or no RBAC): --objective-priorities only");
      return;
    }
    const lw = listWatch<InferenceObjective>({
      kubeConfig: o.kubeConfig,
      path: `/apis/${group}/${VERSION}/namespaces/${o.namespace}/inferenceobjectives`,
      list: () =>
        custom.listNamespacedCustomObject({ group, version: VERSION, namespace: o.namespace, plural: "inferenceobjectives" }) as Promise<KubernetesListObject<InferenceObjective>>,
      onSnapshot: (items) => o.onPriorities(objectivePriorities(items, o.poolName)),
      onError: (err) => o.onError(err),
      giveUpBeforeSync: (err) => statusOf(err) === 404 || statusOf(err) === 403,
      ...(o.backoff ? { backoff: o.backoff } : {}),
    });
    current = lw;
    lw.synced.then(
      (listed) => {
        if (!listed) return;
        if (i === 0) o.log.info({ group }, "InferenceObjectives followed");
        else o.log.warn({ group, replacement: OBJECTIVE_GROUPS[0] }, "InferenceObjectives followed in a deprecated API group");
      },
      (err) => {
        o.log.debug({ group, status: statusOf(err) }, "InferenceObjective API not listed");
        follow(i + 1);
      },
    );
  };
  follow(0);
  return {
    async stop() {
      stopped = true;
      await current?.stop();
    },
  };
}
