// Where peers' replica-agg endpoints come from: the same peer plane as recovery (docs/CONTRACTS.md §2,
// §10). Kubernetes: the EndpointSlices of DYN_EPP_PEER_SERVICE, port named `replica-agg`, eligible as
// for recovery (ready, serving, not terminating, not this pod). Static: every listed peer, whose
// endpoint is its host with the replica-agg port unless given as {url, replicaAgg}; a static peer
// is not probed, its SUB just keeps reconnecting until it answers.
import type { PeerDiscovery } from "@kv-epp/recovery";
import { parseEndpoint } from "@kv-epp/protocol";
import type { Logger } from "pino";
import type { KubeSources } from "../kube-sources.ts";
import type { AggPeer } from "./peers.ts";

export const REPLICA_AGG_PORT_NAME = "replica-agg";

export interface PeerSource {
  start(): Promise<void>;
  peers(): AggPeer[];
  /** Level-triggered: "look again". */
  onChange(cb: () => void): void;
  stop(): Promise<void>;
}

/** Static peers: a fixed list, minus any entry that is this replica itself. */
export function staticPeers(endpoints: readonly string[], self: { hosts: readonly string[]; port: number }): PeerSource {
  const list = endpoints
    .filter((e) => {
      const { host, port } = parseEndpoint(e);
      return !(port === self.port && self.hosts.includes(host));
    })
    .map((endpoint) => ({ id: endpoint, endpoint }));
  return { start: async () => {}, peers: () => list, onChange: () => {}, stop: async () => {} };
}

export function endpointSlicePeers(kube: KubeSources, o: {
  namespace: string;
  service: string;
  podIp?: string;
  logger: Logger;
}): PeerSource {
  const d: PeerDiscovery = kube.endpointSlices({ ...o, portName: REPLICA_AGG_PORT_NAME });
  return {
    start: () => d.start(),
    // Discovery names a peer ip:port (for recovery, an HTTP base URL); here it is a ZMTP endpoint.
    peers: () => d.peers().map((p) => ({ id: p.id, endpoint: `tcp://${p.id}` })),
    onChange: (cb) => void d.onChange(cb),
    stop: () => d.stop(),
  };
}
