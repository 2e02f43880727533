// Watches a Service's EndpointSlices through the API server, as a client would, and keeps the number
// of ready endpoints after every change: a watch sees every version, so a moment with no ready
// endpoint cannot fall between two samples.
import { DiscoveryV1Api, type KubeConfig, type V1EndpointSlice } from "@kubernetes/client-node";
import { listWatch, type ListWatch } from "@kv-epp/kube";

export class ReadyEndpointsWatch {
  /** Ready endpoint count after each slice version seen, in order. */
  readonly history: number[] = [];
  /** Watch failures: the history has a hole after any of them. */
  readonly errors: unknown[] = [];
  private slices: ListWatch<V1EndpointSlice> | undefined;

  private constructor() {}

  static async start(kc: KubeConfig, namespace: string, service: string): Promise<ReadyEndpointsWatch> {
    const labelSelector = `kubernetes.io/service-name=${service}`;
    const api = kc.makeApiClient(DiscoveryV1Api);
    const watch = new ReadyEndpointsWatch();
    watch.slices = listWatch<V1EndpointSlice>({
      kubeConfig: kc,
      path: `/apis/discovery.k8s.io/v1/namespaces/${namespace}/endpointslices`,
      labelSelector,
      list: () => api.listNamespacedEndpointSlice({ namespace, labelSelector }),
      onSnapshot: (slices) => {
        let ready = 0;
        for (const slice of slices) for (const e of slice.endpoints ?? []) if (e.conditions?.ready) ready++;
        watch.history.push(ready);
      },
      onError: (err) => watch.errors.push(err),
    });
    await watch.slices.synced;
    return watch;
  }

  get min(): number {
    return Math.min(...this.history);
  }

  stop(): Promise<void> {
    return this.slices?.stop() ?? Promise.resolve();
  }
}
