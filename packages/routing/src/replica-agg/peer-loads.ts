// What this replica knows of its peers' load: one LoadTable per peer, their sums in one shared
// WorkerTotals that the picker reads. Pure state (the caller passes the clock), so the rules below are
// unit-tested without sockets and the trace simulation can run the same code in virtual time.
//
// Rules (README.md in this folder):
// - A peer is followed by replica id and sequence. The first message after (re)connecting or a drop is
//   the baseline. seq below the expected one is a duplicate (ignored); above it is a gap: the message is
//   applied anyway (an undercount or a phantom entry at worst) and the table is approximate until the
//   next snapshot, which replaces it whole.
// - A new replica id is a restarted peer: its old table is dropped, it starts from zero.
// - Snapshots are the heartbeats. A followed peer with no snapshot for `timeoutMs` is dropped (its
//   load leaves the totals) until it is heard again, so no entry outlives its sender's last snapshot by
//   more than the timeout, whatever was lost.
// - A peer's request that came with its prefix keys is pending on its worker in this replica's
//   PendingPrefixes (when in-flight prefixes are on) until the peer frees it or its table is dropped or
//   replaced; a snapshot carries no keys, so a prefix lost with its delta stays lost (the index learns
//   the blocks within the events' lag anyway).
import { LoadTable, WorkerTotals, type LoadTotals, type LoadView } from "../load.ts";
import type { ReplicaSet } from "../home.ts";
import type { PendingPrefixes } from "../pending.ts";
import type { AggMessage } from "./codec.ts";

export type Receipt =
  | { kind: "applied"; via: "baseline" | "in_order" | "gap" | "restart"; missed: number; previous?: string }
  | { kind: "duplicate" }
  /** The message came from this replica itself (a peer list that names it): ignored. */
  | { kind: "self" };

type PeerState =
  | { kind: "waiting"; lastReplica?: string }
  | {
      kind: "following";
      replica: string;
      nextSeq: number;
      exact: boolean;
      snapshotAt: number;
      table: LoadTable;
      /** The peer's request id -> its entry in `pending`. */
      pendingIds: Map<number, number>;
    };

export type PeerStatus = {
  peer: string;
  state: PeerState["kind"];
  replica?: string;
  /** The table matches the peer's latest snapshot plus every delta since (no gap). */
  exact: boolean;
  requests: number;
};

export class PeerLoads implements LoadView {
  readonly totals = new WorkerTotals();
  private readonly peers = new Map<string, PeerState>();

  /** `pending`: where peers' requests with prefix keys are recorded as in flight (absent: keys are ignored). */
  constructor(
    private readonly selfReplica: string,
    private readonly pending?: PendingPrefixes,
  ) {}

  /** This replica and the peers followed now (heard, not dropped): the replicas a home share splits the workers among. */
  replicas(): ReplicaSet {
    const peers: string[] = [];
    for (const s of this.peers.values()) if (s.kind === "following") peers.push(s.replica);
    return { self: this.selfReplica, peers };
  }

  /** A peer from discovery; it contributes nothing until it is heard. */
  add(peer: string): void {
    if (!this.peers.has(peer)) this.peers.set(peer, { kind: "waiting" });
  }

  /** A peer that left discovery: its load is dropped and it is forgotten. Returns the requests dropped. */
  remove(peer: string): number {
    const n = this.drop(peer);
    this.peers.delete(peer);
    return n;
  }

  /** Drops a peer's load (it is followed again from its next message). Returns the requests dropped. */
  drop(peer: string): number {
    const s = this.peers.get(peer);
    if (!s || s.kind !== "following") return 0;
    const n = s.table.size;
    this.clearTable(s);
    this.peers.set(peer, { kind: "waiting", lastReplica: s.replica });
    return n;
  }

  receive(peer: string, m: AggMessage, now: number): Receipt {
    if (m.replica === this.selfReplica) return { kind: "self" };
    let s = this.peers.get(peer);
    let via: "baseline" | "in_order" | "gap" | "restart" = "in_order";
    let missed = 0;
    let previous: string | undefined;
    if (!s || s.kind === "waiting" || s.replica !== m.replica) {
      previous = s?.kind === "following" ? s.replica : s?.lastReplica;
      via = previous !== undefined && previous !== m.replica ? "restart" : "baseline";
      if (s?.kind === "following") this.clearTable(s);
      s = { kind: "following", replica: m.replica, nextSeq: m.seq, exact: false, snapshotAt: now, table: new LoadTable(this.totals), pendingIds: new Map() };
      this.peers.set(peer, s);
    } else if (m.seq < s.nextSeq) {
      return { kind: "duplicate" };
    } else if (m.seq > s.nextSeq) {
      via = "gap";
      missed = m.seq - s.nextSeq;
      s.exact = false;
    }
    s.nextSeq = m.seq + 1;
    if (m.kind === "snapshot") {
      s.table.clear();
      const live = new Set<number>();
      for (const e of m.entries) {
        s.table.add(e.id, { workerKey: e.workerKey, blocks: e.blocks, prefillBlocks: e.prefillBlocks });
        live.add(e.id);
      }
      // pending prefixes of requests the snapshot no longer has (their `freed` was lost) go
      for (const id of [...s.pendingIds.keys()]) if (!live.has(id)) this.unpend(s, id);
      s.exact = true;
      s.snapshotAt = now;
    } else {
      for (const o of m.ops) {
        if (o.op === "added") {
          if (s.table.add(o.entry.id, { workerKey: o.entry.workerKey, blocks: o.entry.blocks, prefillBlocks: o.entry.prefillBlocks }) && o.prefix && this.pending)
            s.pendingIds.set(o.entry.id, this.pending.add(o.entry.workerKey, o.prefix));
        } else if (o.op === "prefilled") s.table.prefilled(o.id);
        else {
          s.table.remove(o.id);
          this.unpend(s, o.id);
        }
      }
    }
    return { kind: "applied", via, missed, previous };
  }

  private unpend(s: Extract<PeerState, { kind: "following" }>, id: number): void {
    const pid = s.pendingIds.get(id);
    if (pid === undefined) return;
    s.pendingIds.delete(id);
    this.pending!.remove(pid);
  }

  private clearTable(s: Extract<PeerState, { kind: "following" }>): void {
    s.table.clear();
    for (const pid of s.pendingIds.values()) this.pending!.remove(pid);
    s.pendingIds.clear();
  }

  /** Drops every followed peer whose last snapshot is older than `timeoutMs`; returns them. */
  sweep(now: number, timeoutMs: number): { peer: string; requests: number; silentMs: number }[] {
    const dropped = [];
    for (const [peer, s] of this.peers) {
      if (s.kind !== "following" || now - s.snapshotAt <= timeoutMs) continue;
      dropped.push({ peer, requests: this.drop(peer), silentMs: now - s.snapshotAt });
    }
    return dropped;
  }

  status(): PeerStatus[] {
    return [...this.peers].map(([peer, s]) =>
      s.kind === "following"
        ? { peer, state: s.kind, replica: s.replica, exact: s.exact, requests: s.table.size }
        : { peer, state: s.kind, exact: false, requests: 0 },
    );
  }

  /** Requests attributed to peers, over all workers. */
  get requestCount(): number {
    let n = 0;
    for (const s of this.peers.values()) if (s.kind === "following") n += s.table.size;
    return n;
  }

  of(workerKey: string): LoadTotals {
    return this.totals.of(workerKey);
  }
}
