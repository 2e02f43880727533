// InferenceObjectives, as llm-d's router keeps them (its InferenceObjectiveReconciler and
// server/controller_config.go): the objectives in the pool's namespace whose spec.poolRef names this
// pool give the priority of the objective a request names (x-llm-d-inference-objective). llm-d.ai is
// followed when it is served, else the older inference.networking.x-k8s.io (llm-d ignores the older one
// when both are installed; the watch is llmd-resources.ts); neither served: --objective-priorities alone.
import type { KubernetesObject } from "@kubernetes/client-node";
import { forPool, type PoolRef } from "./pool-ref.ts";

export type InferenceObjective = KubernetesObject & { spec?: { priority?: number | null; poolRef?: PoolRef } };

/** Objective name -> priority, for the objectives of `poolName` not being deleted; an unset priority is 0, as llm-d reads it. */
export function objectivePriorities(items: readonly InferenceObjective[], poolName: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const o of items) {
    if (!forPool(o, poolName)) continue;
    const p = o.spec?.priority;
    out.set(o.metadata!.name!, typeof p === "number" && Number.isInteger(p) ? p : 0);
  }
  return out;
}

/**
 * The priority lookup requests read (objective name -> priority), kept current: the watched
 * InferenceObjectives win, as in llm-d where the resource is the truth; `--objective-priorities` gives
 * the names no object of this pool gives (and everything when no InferenceObjective API is served).
 */
export class ObjectivePriorities {
  private merged: ReadonlyMap<string, number>;

  constructor(private readonly fallback: ReadonlyMap<string, number> = new Map()) {
    this.merged = fallback;
  }

  /** Replaces the watched objectives' priorities. */
  setWatched(watched: ReadonlyMap<string, number>): void {
    this.merged = new Map([...this.fallback, ...watched]);
  }

  /** The priorities now (a map replaced, never changed, when the watched set changes). */
  current(): ReadonlyMap<string, number> {
    return this.merged;
  }
}
