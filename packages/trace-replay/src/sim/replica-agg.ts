// Replica-agg in virtual time, with the EPP's own code: each replica's ActiveLoad reports its changes,
// epp's AggOutbox numbers them as delta messages (one per change: the EPP batches per event-loop turn,
// which at these rates is one change), each peer receives them `lagMs` later into epp's PeerLoads
// (same dup/gap/restart/timeout rules), a snapshot of each replica's active set goes out every
// `heartbeatMs`, and silent peers are swept against `timeoutMs`. `loss` drops messages at random, so
// gaps, phantoms until the next snapshot and timeouts happen as they would on a lossy link. With
// `peerPending`, a replica's requests carry their prefix keys to a PendingPrefixes per peer replica,
// as the EPP's do with in-flight prefixes on (the `added` op's prefix).
import { ActiveLoad, AggOutbox, combinedPending, PeerLoads, opOf, sumLoad, type AggMessage, type LoadView, type PendingPrefixes, type PendingView, type ReplicaSet } from "@kv-epp/routing";
import type { EventQueue } from "./event-queue.ts";

export type AggSimOptions = {
  /** virtual ms from a change on one replica to its peers applying it (measured on loopback: p50 0.2, max 3) */
  lagMs: number;
  /** snapshot period (the EPP's --replica-agg-heartbeat-ms) */
  heartbeatMs: number;
  /** the EPP's --replica-agg-timeout-ms */
  timeoutMs: number;
  /** probability that a message is lost on its way to one peer */
  loss: number;
};

export const DEFAULT_AGG_SIM: AggSimOptions = { lagMs: 1, heartbeatMs: 1000, timeoutMs: 3000, loss: 0 };

export type AggSimStats = { messages: number; lost: number; gaps: number; timeouts: number };

export class SimReplicaAgg {
  readonly stats: AggSimStats = { messages: 0, lost: 0, gaps: 0, timeouts: 0 };
  private readonly outboxes: AggOutbox[];
  private readonly peers: PeerLoads[];
  private running = true;

  constructor(
    private readonly queue: EventQueue,
    private readonly loads: readonly ActiveLoad[],
    private readonly o: AggSimOptions,
    private readonly random: () => number,
    /** Per replica, where its peers' prefixes go (the EPP keeps them apart from its own); absent: not carried. */
    private readonly peerPending?: readonly PendingPrefixes[],
  ) {
    this.outboxes = loads.map((_, r) => new AggOutbox(`replica-${r}`));
    this.peers = loads.map((_, r) => new PeerLoads(`replica-${r}`, peerPending?.[r]));
    loads.forEach((load, r) => load.observe((c) => this.send(r, this.outboxes[r]!.delta([opOf(c)]))));
    this.heartbeat();
  }

  /** The in-flight prefixes replica r's picker reads: its own requests' and its peers' as received. */
  pendingView(r: number): PendingView | undefined {
    return combinedPending([this.loads[r]!.pending, this.peerPending?.[r]]);
  }

  /** What replica r's picker reads: its own load plus its peers' as received. */
  view(r: number): LoadView {
    return sumLoad(this.loads[r]!, this.peers[r]!);
  }

  /** Replica r and the peers it follows now, as the EPP's replica-agg reports them to its picker. */
  replicas(r: number): ReplicaSet {
    return this.peers[r]!.replicas();
  }

  /** No more picks: heartbeats stop so the event queue can drain. */
  stop(): void {
    this.running = false;
  }

  private heartbeat(): void {
    if (!this.running) return;
    const now = this.queue.now;
    this.loads.forEach((load, r) => this.send(r, this.outboxes[r]!.snapshot(load)));
    for (const s of this.peers) this.stats.timeouts += s.sweep(now, this.o.timeoutMs).length;
    this.queue.schedule(now + this.o.heartbeatMs, () => this.heartbeat());
  }

  private send(from: number, m: AggMessage): void {
    this.peers.forEach((peers, to) => {
      if (to === from) return;
      this.stats.messages++;
      if (this.o.loss > 0 && this.random() < this.o.loss) {
        this.stats.lost++;
        return;
      }
      // Same lag for every message of a link and FIFO at equal times: delivery stays in order, as on TCP.
      this.queue.schedule(this.queue.now + this.o.lagMs, (t) => {
        const r = peers.receive(`replica-${from}`, m, t);
        if (r.kind === "applied" && r.via === "gap") this.stats.gaps++;
      });
    });
  }
}
