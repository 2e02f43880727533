// Kubernetes mode: the InferencePool (inference.networking.k8s.io/v1) gives the pod selector and the
// target port; a pod informer keeps the worker set (Running, has an IP, Ready, not terminating).
import { CoreV1Api, CustomObjectsApi, KubeConfig, makeInformer, type V1Pod } from "@kubernetes/client-node";
import type { Logger } from "pino";
import type { WorkerSpec } from "./registry.ts";

export type PoolWorkersOptions = {
  kubeConfig: KubeConfig;
  poolName: string;
  namespace: string;
  kvEventsPort: number;
  kvReplayPort?: number;
  dpSize: number;
  log: Logger;
  onWorkers: (specs: WorkerSpec[]) => void;
  onError: (err: unknown) => void;
  signal?: AbortSignal;
};

type InferencePool = {
  spec?: {
    selector?: { matchLabels?: Record<string, string> } | Record<string, string>;
    targetPorts?: { number: number }[];
    targetPortNumber?: number;
  };
};

export function loadKubeConfig(): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromDefault(); // KUBECONFIG, ~/.kube/config, or the in-cluster service account
  return kc;
}

/** v1 uses {matchLabels}; v1alpha2 used a plain label map. */
export function poolSelector(pool: InferencePool): string {
  const sel = pool.spec?.selector ?? {};
  const labels = (typeof (sel as { matchLabels?: unknown }).matchLabels === "object"
    ? (sel as { matchLabels: Record<string, string> }).matchLabels
    : sel) as Record<string, string>;
  const parts = Object.entries(labels).map(([k, v]) => `${k}=${v}`);
  if (parts.length === 0) throw new Error("InferencePool has an empty selector");
  return parts.join(",");
}

export function poolTargetPort(pool: InferencePool): number {
  const p = pool.spec?.targetPorts?.[0]?.number ?? pool.spec?.targetPortNumber;
  if (!p) throw new Error("InferencePool has no targetPorts[0].number");
  return p;
}

export function isServingPod(pod: V1Pod): boolean {
  if (pod.metadata?.deletionTimestamp) return false;
  if (pod.status?.phase !== "Running" || !pod.status.podIP) return false;
  return (pod.status.conditions ?? []).some((c) => c.type === "Ready" && c.status === "True");
}

export function podWorker(pod: V1Pod, o: Pick<PoolWorkersOptions, "kvEventsPort" | "kvReplayPort" | "dpSize">, port: number): WorkerSpec {
  const ip = pod.status!.podIP!;
  const host = ip.includes(":") ? `[${ip}]` : ip;
  return {
    id: pod.metadata!.name!,
    address: `${host}:${port}`,
    kvEvents: `tcp://${host}:${o.kvEventsPort}`,
    replay: o.kvReplayPort ? `tcp://${host}:${o.kvReplayPort}` : undefined,
    dpSize: o.dpSize,
    metricsUrl: `http://${host}:${port}/metrics`,
  };
}

/** Resolves once the pool is read and the pod informer has listed (the initial worker set is known). */
export async function startPoolWorkers(o: PoolWorkersOptions): Promise<{ stop(): Promise<void> }> {
  const custom = o.kubeConfig.makeApiClient(CustomObjectsApi);
  const core = o.kubeConfig.makeApiClient(CoreV1Api);
  // The pool may not exist yet (applied after the EPP): wait for it rather than crash-loop.
  let labelSelector: string;
  let port: number;
  for (let attempt = 1; ; attempt++) {
    try {
      const pool = (await custom.getNamespacedCustomObject({
        group: "inference.networking.k8s.io",
        version: "v1",
        namespace: o.namespace,
        plural: "inferencepools",
        name: o.poolName,
      })) as InferencePool;
      labelSelector = poolSelector(pool);
      port = poolTargetPort(pool);
      break;
    } catch (err) {
      o.signal?.throwIfAborted();
      if (attempt === 1) o.onError(err);
      o.log.warn({ pool: o.poolName, namespace: o.namespace, attempt, err: String(err) }, "inference pool not readable yet, retrying");
      await Bun.sleep(Math.min(2000 * attempt, 10_000));
      o.signal?.throwIfAborted();
    }
  }
  o.log.info({ pool: o.poolName, namespace: o.namespace, selector: labelSelector, port }, "inference pool read");

  const informer = makeInformer<V1Pod>(
    o.kubeConfig,
    `/api/v1/namespaces/${o.namespace}/pods`,
    () => core.listNamespacedPod({ namespace: o.namespace, labelSelector }),
    labelSelector,
  );
  // Level-triggered: every change recomputes the whole set from the informer's cache.
  const publish = () => o.onWorkers(informer.list(o.namespace).filter(isServingPod).map((p) => podWorker(p, o, port)));
  informer.on("add", publish);
  informer.on("update", publish);
  informer.on("delete", publish);
  let stopped = false;
  let retry: ReturnType<typeof setTimeout> | undefined;
  informer.on("error", (err) => {
    o.onError(err);
    // The informer stops on a watch error; restart it after a pause (its relist reconciles).
    if (!stopped) retry = setTimeout(() => void informer.start().catch(o.onError), 1000);
  });
  await informer.start();
  publish();
  return {
    stop: async () => {
      stopped = true;
      if (retry) clearTimeout(retry);
      await informer.stop();
    },
  };
}
