// llm-d's pool-scoped resources (InferenceObjective, InferenceModelRewrite) followed from the API server:
// which API group is followed, as llm-d's router decides (server/controller_config.go). What they say is
// read in objectives.ts and model-rewrites.ts, which static mode uses without the Kubernetes client.
import { CustomObjectsApi, type KubeConfig, type KubernetesListObject, type KubernetesObject } from "@kubernetes/client-node";
import { listWatch, statusOf, type ListWatch } from "@kv-epp/kube";
import type { Logger } from "pino";
import type { InferenceModelRewrite, ModelRewrites } from "./model-rewrites.ts";
import { objectivePriorities, type InferenceObjective } from "./objectives.ts";

/** In llm-d's order of preference; it ignores the older group when both are installed. */
const LLMD_GROUPS = ["llm-d.ai", "inference.networking.x-k8s.io"] as const;
const VERSION = "v1alpha2";

export type LlmdWatchOptions<T extends KubernetesObject> = {
  kubeConfig: KubeConfig;
  namespace: string;
  /** e.g. `inferenceobjectives`. */
  plural: string;
  log: Logger;
  /** The whole listed set, as the list-watch publishes it (never before a list succeeded). */
  onSnapshot: (items: T[]) => void;
  onError: (err: unknown) => void;
  backoff?: { initialMs: number; maxMs: number };
};

/**
 * Follows `plural` in the first group of LLMD_GROUPS whose list is answered. A 404 (CRD not installed)
 * or 403 (no RBAC for it) before the first list moves on to the next group, as llm-d's discovery does;
 * other errors are retried by the list-watch. Neither group listed: nothing is published.
 */
export function watchLlmdResource<T extends KubernetesObject>(o: LlmdWatchOptions<T>): { stop(): Promise<void> } {
  const custom = o.kubeConfig.makeApiClient(CustomObjectsApi);
  let current: ListWatch<T> | undefined;
  let stopped = false;
  const follow = (i: number) => {
    if (stopped) return;
    const group = LLMD_GROUPS[i];
    if (group === undefined) return o.log.info({ resource: o.plural, groups: LLMD_GROUPS }, "not listed in any group (no CRD, or no RBAC): not followed");
    const lw = listWatch<T>({
      kubeConfig: o.kubeConfig,
      path: `/apis/${group}/${VERSION}/namespaces/${o.namespace}/${o.plural}`,
      list: () => custom.listNamespacedCustomObject({ group, version: VERSION, namespace: o.namespace, plural: o.plural }) as Promise<KubernetesListObject<T>>,
      onSnapshot: o.onSnapshot,
      onError: (err) => o.onError(err),
      giveUpBeforeSync: (err) => statusOf(err) === 404 || statusOf(err) === 403,
      ...(o.backoff ? { backoff: o.backoff } : {}),
    });
    current = lw;
    lw.synced.then(
      (listed) => {
        if (!listed) return;
        if (i === 0) o.log.info({ resource: o.plural, group }, "followed");
        else o.log.warn({ resource: o.plural, group, replacement: LLMD_GROUPS[0] }, "followed in a deprecated API group");
      },
      (err) => {
        o.log.debug({ resource: o.plural, group, status: statusOf(err) }, "not listed");
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

export type ObjectiveWatchOptions = Omit<LlmdWatchOptions<InferenceObjective>, "plural" | "onSnapshot"> & {
  poolName: string;
  onPriorities: (priorities: Map<string, number>) => void;
};

/** Follows the pool's InferenceObjectives (watchLlmdResource). Never holds readiness: until listed, the static priorities hold. */
export function startObjectiveWatch(o: ObjectiveWatchOptions): { stop(): Promise<void> } {
  return watchLlmdResource<InferenceObjective>({ ...o, plural: "inferenceobjectives", onSnapshot: (items) => o.onPriorities(objectivePriorities(items, o.poolName)) });
}

export type ModelRewriteWatchOptions = Omit<LlmdWatchOptions<InferenceModelRewrite>, "plural" | "onSnapshot"> & { poolName: string; into: ModelRewrites; onChange?: () => void };

/** Follows the pool's InferenceModelRewrites (watchLlmdResource) into `into`. */
export function startModelRewriteWatch(o: ModelRewriteWatchOptions): { stop(): Promise<void> } {
  return watchLlmdResource<InferenceModelRewrite>({
    ...o,
    plural: "inferencemodelrewrites",
    onSnapshot: (items) => {
      o.into.setWatched(items, o.poolName);
      o.onChange?.();
    },
  });
}
