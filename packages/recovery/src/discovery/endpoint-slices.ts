import { DiscoveryV1Api, type KubeConfig, makeInformer, type V1EndpointSlice } from "@kubernetes/client-node";
import type { Logger } from "pino";
import type { Peer } from "../types.ts";
import { ChangeListeners, type PeerDiscovery, sortedPeers } from "./types.ts";

// Peers from the EndpointSlices of the peer Service (docs/CONTRACTS.md §8 rule 2, §9): an informer keeps the slices
// of `kubernetes.io/service-name=<service>` cached, and the eligible set is recomputed from that cache on
// every change. Eligible = ready && serving && !terminating, never this pod's own IP. The selection-http port
// is resolved by port name from each slice, since a Service may map it to any container port.

export const SELECTION_PORT_NAME = "selection-http";

export type EndpointSliceDiscoveryOptions = {
  kubeConfig: KubeConfig;
  namespace: string;
  /** The peer Service name (DYN_EPP_PEER_SERVICE). */
  service: string;
  /** This replica's IP (POD_IP), excluded from the candidates. */
  podIp?: string;
  portName?: string;
  /** Delay before restarting the informer after an API error (default 1000 ms). */
  retryMs?: number;
  logger: Logger;
};

function hostPort(ip: string, port: number): string {
  return ip.includes(":") ? `[${ip}]:${port}` : `${ip}:${port}`;
}

/** The eligible peers of a set of slices: the pure part of discovery, tested on its own. */
export function peersFromSlices(slices: readonly V1EndpointSlice[], podIp: string | undefined, portName = SELECTION_PORT_NAME): Peer[] {
  const peers: Peer[] = [];
  for (const slice of slices) {
    const port = slice.ports?.find((p) => p.name === portName)?.port;
    if (port === undefined || port === null) continue;
    for (const ep of slice.endpoints ?? []) {
      const c = ep.conditions ?? {};
      // ready must be explicitly true: a sibling of unknown readiness may hold no index (it would answer 503).
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
  const informer = makeInformer<V1EndpointSlice>(
    opts.kubeConfig,
    `/apis/discovery.k8s.io/v1/namespaces/${opts.namespace}/endpointslices`,
    () => api.listNamespacedEndpointSlice({ namespace: opts.namespace, labelSelector }),
    labelSelector,
  );
  const listeners = new ChangeListeners();
  const retryMs = opts.retryMs ?? 1000;
  let current: Peer[] = [];
  let started: Promise<void> | null = null;
  let synced = false;
  let stopped = false;
  let lastError: unknown = null;
  let retry: ReturnType<typeof setTimeout> | null = null;

  const recompute = () => {
    // Events replayed by the initial list are not changes: the first eligible set is published by sync().
    if (!synced) return;
    const next = peersFromSlices(informer.list(opts.namespace), opts.podIp, opts.portName);
    const changed = next.map((p) => p.id).join("\n") !== current.map((p) => p.id).join("\n");
    current = next;
    if (changed) {
      log.info({ peers: next.map((p) => p.id) }, "eligible peers changed");
      listeners.emit();
    }
  };
  informer.on("add", recompute);
  informer.on("update", recompute);
  informer.on("delete", recompute);
  informer.on("error", (err) => {
    lastError = err;
    // The client's ListWatch stops on a non-410 error; restart it after a delay (only once synced, the
    // initial sync loop below does its own retries).
    if (!synced || stopped) return;
    log.warn({ err: String(err) }, "EndpointSlice watch failed, restarting");
    retry = setTimeout(() => void informer.start().catch((e) => log.warn({ err: String(e) }, "EndpointSlice watch restart failed")), retryMs);
  });

  // Until the first successful list the eligible set is unknown, not empty: deciding "no peers, bootstrap
  // empty" on an API error would throw away a sibling's index, so the initial sync retries instead.
  const sync = async () => {
    for (let attempt = 1; !stopped; attempt++) {
      lastError = null;
      try {
        await informer.start();
      } catch (err) {
        lastError = err;
      }
      if (lastError === null) break;
      log.warn({ err: String(lastError), attempt }, "listing peer EndpointSlices failed, retrying");
      await informer.stop().catch(() => {});
      await new Promise((r) => setTimeout(r, retryMs));
    }
    current = peersFromSlices(informer.list(opts.namespace), opts.podIp, opts.portName);
    synced = true;
    log.info({ peers: current.map((p) => p.id) }, "peer EndpointSlices synced");
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
      stopped = true;
      if (retry !== null) clearTimeout(retry);
      await informer.stop().catch(() => {});
    },
  };
}
