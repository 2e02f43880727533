// Every source the EPP reads from the Kubernetes API server, built in this one module: the InferencePool's
// pods, llm-d's InferenceObjectives and InferenceModelRewrites, the peer Service's EndpointSlices (recovery
// and replica-agg) and the client configuration Lease-backed intents open with. main.ts imports it, and
// with it @kubernetes/client-node (~0.3 s to load), only when the configuration names one of
// them (usesKubernetes): static mode starts without the client.
import type { KubeConfig } from "@kubernetes/client-node";
import { defaultKubeConfig } from "@kv-epp/kube";
import type { PeerDiscovery } from "@kv-epp/recovery";
import { endpointSliceDiscovery, type EndpointSliceDiscoveryOptions } from "@kv-epp/recovery/kubernetes";
import { startPoolWorkers, type PoolWorkersOptions } from "./workers/kubernetes.ts";
import { startModelRewriteWatch, startObjectiveWatch, type ModelRewriteWatchOptions, type ObjectiveWatchOptions } from "./workers/llmd-resources.ts";

type Stoppable = { stop(): Promise<void> };
/** A source's options less the client configuration, which the sources share. */
type Unbound<T> = Omit<T, "kubeConfig">;

export type KubeSources = {
  /** The client configuration: the one given, else the process's, loaded on first use. */
  config(): KubeConfig;
  poolWorkers(o: Unbound<PoolWorkersOptions>): Promise<Stoppable>;
  objectives(o: Unbound<ObjectiveWatchOptions>): Stoppable;
  modelRewrites(o: Unbound<ModelRewriteWatchOptions>): Stoppable;
  endpointSlices(o: Unbound<EndpointSliceDiscoveryOptions>): PeerDiscovery;
};

export function kubeSources(given?: KubeConfig): KubeSources {
  let kubeConfig = given;
  const config = () => (kubeConfig ??= defaultKubeConfig());
  return {
    config,
    poolWorkers: (o) => startPoolWorkers({ ...o, kubeConfig: config() }),
    objectives: (o) => startObjectiveWatch({ ...o, kubeConfig: config() }),
    modelRewrites: (o) => startModelRewriteWatch({ ...o, kubeConfig: config() }),
    endpointSlices: (o) => endpointSliceDiscovery({ ...o, kubeConfig: config() }),
  };
}
