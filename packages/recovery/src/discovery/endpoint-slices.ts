import { DiscoveryV1Api, type KubeConfig, type V1EndpointSlice } from "@kubernetes/client-node";
import { DEFAULT_BACKOFF, listWatch, type ListWatch } from "@kv-epp/kube";
import { hostPort } from "@kv-epp/protocol";
import type { Logger } from "pino";
import type { Peer } from "../types.ts";
import { ChangeListeners, type PeerDiscovery, sortedPeers } from "./types.ts";

// Peers from the EndpointSlices of the peer Service (docs/CONTRACTS.md §8 rule 2, §9): a list-watch keeps the slices
// of `kubernetes.io/service-name=<service>` cached, and the eligible set is recomputed from that cache on
// every change. Eligible = ready && serving && !terminating, never this pod's own IP. The selection-http port
// is resolved by port name from each slice, since a Service may map it to any container port.

const SELECTION_PORT_NAME = "selection-http";

export type EndpointSliceDiscoveryOptions = {
  kubeConfig: KubeConfig;
  namespace: string;
  /** The peer Service name (DYN_EPP_PEER_SERVICE). */
  service: string;
  /** This replica's IP (POD_IP), excluded from the candidates. */
  podIp?: string;
  portName?: string;
  /** Pause before relisting after an API error, doubling per consecutive failure (default 1000 ms). */
  retryMs?: number;
  logger: Logger;
};

/** The eligible peers of a set of slices: the pure part of discovery, tested on its own. */
export function peersFromSlices(slices: readonly V1EndpointSlice[], podIp: string | undefined, portName = SELECTION_PORT_NAME): Peer[] {
  const peers: Peer[] = [];
  for (const slice of slices) {
    const port = slice.ports?.find((p) => p.name === portName)?.port;
    if (port === undefined || port === null) continue;
    for (const ep of slice.endpoints ?? []) {
      const c = ep.conditions ?? {};
      // ready must be explicitly true: a peer of unknown readiness may hold no index (it would answer 503).
      // serving defaults to ready and terminating to false, as the EndpointSlice API documents.
      const serving = c.serving ?? c.ready;
      if (c.ready !== true || serving !== true || c.terminating === true) continue;
      const ip = ep.addresses[0];
      if (ip === undefined || (podIp !== undefined && ep.addresses.includes(podIp))) continue;
      const id = hostPort(ip, port);
      peers.push({ id, url: `http://${id}` });
    }
  }
  return sortedPeers(peers);
}

export function endpointSliceDiscovery(opts: EndpointSliceDiscoveryOptions): PeerDiscovery {
  const log = opts.logger.child({ component: "peer-discovery", service: opts.service });
  const labelSelector = `kubernetes.io/service-name=${opts.service}`;
  const api = opts.kubeConfig.makeApiClient(DiscoveryV1Api);
  const listeners = new ChangeListeners();
  let current: Peer[] = [];
  let slices: ListWatch<V1EndpointSlice> | null = null;
  let started: Promise<void> | null = null;

  // Until the first successful list the eligible set is unknown, not empty: deciding "no peers, bootstrap
  // empty" on an API error would throw away a peer's index, so start() waits for that list (the list-watch
  // retries it). Later changes are published when the eligible set differs.
  const sync = async () => {
    let first = true;
    slices = listWatch<V1EndpointSlice>({
      kubeConfig: opts.kubeConfig,
      path: `/apis/discovery.k8s.io/v1/namespaces/${opts.namespace}/endpointslices`,
      labelSelector,
      list: () => api.listNamespacedEndpointSlice({ namespace: opts.namespace, labelSelector }),
      backoff: { initialMs: opts.retryMs ?? DEFAULT_BACKOFF.initialMs, maxMs: DEFAULT_BACKOFF.maxMs },
      onSnapshot: (items) => {
        const next = peersFromSlices(items, opts.podIp, opts.portName);
        const changed = next.map((p) => p.id).join("\n") !== current.map((p) => p.id).join("\n");
        current = next;
        if (first) {
          first = false;
          log.info({ peers: next.map((p) => p.id) }, "peer EndpointSlices synced");
        } else if (changed) {
          log.info({ peers: next.map((p) => p.id) }, "eligible peers changed");
          listeners.emit();
        }
      },
      onError: (err, { attempt, synced }) =>
        log.warn({ err: String(err), attempt }, synced ? "EndpointSlice watch failed, restarting" : "listing peer EndpointSlices failed, retrying"),
    });
    await slices.synced;
  };

  return {
    description: `EndpointSlices of Service ${opts.namespace}/${opts.service}`,
    start() {
      started ??= sync();
      return started;
    },
    peers: () => current,
    onChange: (cb) => listeners.add(cb),
    async stop() {
      started ??= Promise.resolve();
      await slices?.stop();
    },
  };
}
