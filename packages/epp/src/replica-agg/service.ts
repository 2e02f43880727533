// replica-agg wired together: this replica's load published on --replica-agg-port, one SUB per
// peer from peer discovery, peers' load summed into a LoadView for the picker, metrics.
import { formatEndpoint, parseEndpoint, parseWorkerKey } from "@kv-epp/protocol";
import type { Logger } from "pino";
import type { ReplicaAggConfig } from "../config.ts";
import type { KubeSources } from "../kube-sources.ts";
import type { Metrics } from "../metrics.ts";
import { PeerLoads, type ActiveLoad, type LoadView, type PeerStatus, type ReplicaSet, type PendingPrefixes } from "@kv-epp/routing";
import { endpointSlicePeers, staticPeers, type PeerSource } from "./discovery.ts";
import { AggPublisher, newReplicaId } from "./publisher.ts";
import { AggSubscribers } from "./peers.ts";

export type ReplicaAgg = {
  readonly replica: string;
  /** The bound endpoint (port 0 resolved). */
  readonly endpoint: string;
  /** Load attributed to peers. */
  readonly peers: LoadView;
  /** This replica's id and the peers followed now (the latency cost's home share). */
  replicas(): ReplicaSet;
  status(): PeerStatus[];
  updateGauges(): void;
  stop(): Promise<void>;
};

export async function startReplicaAgg(o: {
  config: Extract<ReplicaAggConfig, { mode: "on" }>;
  listen: string;
  port: number;
  podIp?: string;
  load: ActiveLoad;
  /** Where peers' requests with prefix keys are recorded as in flight (absent: their keys are ignored). */
  pending?: PendingPrefixes;
  metrics: Metrics;
  log: Logger;
  kube: () => KubeSources;
}): Promise<ReplicaAgg> {
  const { config, metrics, log } = o;
  const replica = newReplicaId();
  const publisher = await AggPublisher.bind({
    endpoint: formatEndpoint(o.listen, o.port),
    replica,
    load: o.load,
    heartbeatMs: config.heartbeatMs,
    log,
    onSent: (m, bytes) => {
      metrics.aggMessages.inc({ direction: "sent", kind: m.kind });
      metrics.aggBytes.inc({ direction: "sent" }, bytes);
    },
  });
  // Peers' requests count as in flight where they were routed, as this replica's own do.
  const state = new PeerLoads(replica, o.pending);
  const subscribers = new AggSubscribers({
    state,
    timeoutMs: config.timeoutMs,
    log,
    events: {
      received: (m, bytes) => {
        metrics.aggMessages.inc({ direction: "received", kind: m.kind });
        metrics.aggBytes.inc({ direction: "received" }, bytes);
      },
      sequence: (kind, n) => metrics.aggSequenceErrors.inc({ kind }, n),
      dropped: (reason) => metrics.aggPeerDrops.inc({ reason }),
      malformed: () => metrics.ioErrors.inc({ where: "replica_agg" }),
    },
  });
  // The bound port (port 0 resolved), so a static peer list naming this replica is recognised.
  const source = peerSource({ ...o, port: parseEndpoint(publisher.endpoint).port });
  const reconcile = () => subscribers.reconcile(source.peers());
  source.onChange(reconcile);
  // Discovery may wait on the API server; publishing and routing do not wait for it.
  void source.start().then(reconcile, (err) => {
    metrics.ioErrors.inc({ where: "replica_agg" });
    log.error({ err: String(err) }, "replica-agg: peer discovery failed, routing on this replica's own load");
  });
  log.info({ replica, endpoint: publisher.endpoint, heartbeatMs: config.heartbeatMs, timeoutMs: config.timeoutMs, peers: config.peers.mode }, "replica-agg publishing");

  return {
    replica,
    endpoint: publisher.endpoint,
    peers: state,
    replicas: () => state.replicas(),
    status: () => state.status(),
    updateGauges() {
      metrics.aggPeers.set(subscribers.known);
      metrics.aggRefusedSubscribers.set(publisher.refusedSubscribers);
      metrics.aggPeersConnected.set(subscribers.connected);
      metrics.aggPeerRequests.set(state.requestCount);
      metrics.aggPeerBlocks.reset();
      for (const [key, t] of state.totals.workers()) {
        const w = parseWorkerKey(key);
        metrics.aggPeerBlocks.set({ worker: w.workerId, dp_rank: String(w.dpRank) }, t.blocks);
      }
    },
    async stop() {
      await source.stop().catch(() => {});
      await subscribers.close();
      await publisher.close();
    },
  };
}

function peerSource(o: { config: Extract<ReplicaAggConfig, { mode: "on" }>; listen: string; port: number; podIp?: string; log: Logger; kube: () => KubeSources }): PeerSource {
  const s = o.config.peers;
  switch (s.mode) {
    case "none":
      return staticPeers([], { hosts: [], port: o.port });
    case "static":
      return staticPeers(s.endpoints, { hosts: [o.listen, ...(o.podIp ? [o.podIp] : [])], port: o.port });
    case "kubernetes":
      return endpointSlicePeers(o.kube(), { namespace: s.namespace, service: s.peerService, podIp: o.podIp, logger: o.log });
  }
}
