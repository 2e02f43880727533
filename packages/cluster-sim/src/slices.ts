// Watches a Service's EndpointSlices through the API server, as a client would, and keeps the number
// of ready endpoints after every change: a watch sees every version, so a moment with no ready
// endpoint cannot fall between two samples.
import { DiscoveryV1Api, makeInformer, type KubeConfig, type V1EndpointSlice } from "@kubernetes/client-node";

export class ReadyEndpointsWatch {
  /** Ready endpoint count after each slice version seen, in order. */
  readonly history: number[] = [];
  /** Watch failures: the history has a hole after any of them. */
  readonly errors: unknown[] = [];
  private readonly slices = new Map<string, V1EndpointSlice>();

  private constructor(private readonly stopInformer: () => Promise<void>) {}

  static async start(kc: KubeConfig, namespace: string, service: string): Promise<ReadyEndpointsWatch> {
    const selector = `kubernetes.io/service-name=${service}`;
    const api = kc.makeApiClient(DiscoveryV1Api);
    const informer = makeInformer<V1EndpointSlice>(
      kc,
      `/apis/discovery.k8s.io/v1/namespaces/${namespace}/endpointslices`,
      () => api.listNamespacedEndpointSlice({ namespace, labelSelector: selector }),
      selector,
    );
    const watch = new ReadyEndpointsWatch(() => informer.stop());
    const record = (s: V1EndpointSlice, gone = false) => {
      const name = s.metadata?.name ?? "";
      if (gone) watch.slices.delete(name);
      else watch.slices.set(name, s);
      let ready = 0;
      for (const slice of watch.slices.values()) for (const e of slice.endpoints ?? []) if (e.conditions?.ready) ready++;
      watch.history.push(ready);
    };
    informer.on("add", (s) => record(s));
    informer.on("update", (s) => record(s));
    informer.on("delete", (s) => record(s, true));
    informer.on("error", (err) => watch.errors.push(err));
    await informer.start();
    return watch;
  }

  get min(): number {
    return Math.min(...this.history);
  }

  stop(): Promise<void> {
    return this.stopInformer();
  }
}
