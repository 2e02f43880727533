// What this replica knows of its siblings' load: one LoadTable per sibling, their sums in one shared
// WorkerTotals that the picker reads. Pure state (the caller passes the clock), so the rules below are
// unit-tested without sockets and the trace simulation can run the same code in virtual time.
//
// Rules (README.md in this folder):
// - A sibling is followed by replica id and sequence. The first message after (re)connecting or a drop is
//   the baseline. seq below the expected one is a duplicate (ignored); above it is a gap: the message is
//   applied anyway (an undercount or a phantom entry at worst) and the table is approximate until the
//   next snapshot, which replaces it whole.
// - A new replica id is a restarted sibling: its old table is dropped, it starts from zero.
// - Snapshots are the heartbeats. A followed sibling with no snapshot for `timeoutMs` is dropped (its
//   load leaves the totals) until it is heard again, so no entry outlives its sender's last snapshot by
//   more than the timeout, whatever was lost.
import { LoadTable, WorkerTotals, type LoadView } from "../picker/load.ts";
import type { AggMessage } from "./codec.ts";

export type Receipt =
  | { kind: "applied"; via: "baseline" | "in_order" | "gap" | "restart"; missed: number; previous?: string }
  | { kind: "duplicate" }
  /** The message came from this replica itself (a peer list that names it): ignored. */
  | { kind: "self" };

type SiblingState =
  | { kind: "waiting"; lastReplica?: string }
  | { kind: "following"; replica: string; nextSeq: number; exact: boolean; snapshotAt: number; table: LoadTable };

export type SiblingStatus = {
  sibling: string;
  state: SiblingState["kind"];
  replica?: string;
  /** The table matches the sibling's latest snapshot plus every delta since (no gap). */
  exact: boolean;
  requests: number;
};

export class SiblingLoads implements LoadView {
  readonly totals = new WorkerTotals();
  readonly #siblings = new Map<string, SiblingState>();

  constructor(private readonly selfReplica: string) {}

  /** A sibling from discovery; it contributes nothing until it is heard. */
  add(sibling: string): void {
    if (!this.#siblings.has(sibling)) this.#siblings.set(sibling, { kind: "waiting" });
  }

  /** A sibling that left discovery: its load is dropped and it is forgotten. Returns the requests dropped. */
  remove(sibling: string): number {
    const n = this.drop(sibling);
    this.#siblings.delete(sibling);
    return n;
  }

  /** Drops a sibling's load (it is followed again from its next message). Returns the requests dropped. */
  drop(sibling: string): number {
    const s = this.#siblings.get(sibling);
    if (!s || s.kind !== "following") return 0;
    const n = s.table.size;
    s.table.clear();
    this.#siblings.set(sibling, { kind: "waiting", lastReplica: s.replica });
    return n;
  }

  receive(sibling: string, m: AggMessage, now: number): Receipt {
    if (m.replica === this.selfReplica) return { kind: "self" };
    let s = this.#siblings.get(sibling);
    let via: "baseline" | "in_order" | "gap" | "restart" = "in_order";
    let missed = 0;
    let previous: string | undefined;
    if (!s || s.kind === "waiting" || s.replica !== m.replica) {
      previous = s?.kind === "following" ? s.replica : s?.lastReplica;
      via = previous !== undefined && previous !== m.replica ? "restart" : "baseline";
      if (s?.kind === "following") s.table.clear();
      s = { kind: "following", replica: m.replica, nextSeq: m.seq, exact: false, snapshotAt: now, table: new LoadTable(this.totals) };
      this.#siblings.set(sibling, s);
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
      for (const e of m.entries) s.table.add(e.id, { workerKey: e.workerKey, blocks: e.blocks, prefillBlocks: e.prefillBlocks });
      s.exact = true;
      s.snapshotAt = now;
    } else {
      for (const o of m.ops) {
        if (o.op === "added") s.table.add(o.entry.id, { workerKey: o.entry.workerKey, blocks: o.entry.blocks, prefillBlocks: o.entry.prefillBlocks });
        else if (o.op === "prefilled") s.table.prefilled(o.id);
        else s.table.remove(o.id);
      }
    }
    return { kind: "applied", via, missed, previous };
  }

  /** Drops every followed sibling whose last snapshot is older than `timeoutMs`; returns them. */
  sweep(now: number, timeoutMs: number): { sibling: string; requests: number; silentMs: number }[] {
    const dropped = [];
    for (const [sibling, s] of this.#siblings) {
      if (s.kind !== "following" || now - s.snapshotAt <= timeoutMs) continue;
      dropped.push({ sibling, requests: this.drop(sibling), silentMs: now - s.snapshotAt });
    }
    return dropped;
  }

  status(): SiblingStatus[] {
    return [...this.#siblings].map(([sibling, s]) =>
      s.kind === "following"
        ? { sibling, state: s.kind, replica: s.replica, exact: s.exact, requests: s.table.size }
        : { sibling, state: s.kind, exact: false, requests: 0 },
    );
  }

  /** Requests attributed to siblings, over all workers. */
  get requestCount(): number {
    let n = 0;
    for (const s of this.#siblings.values()) if (s.kind === "following") n += s.table.size;
    return n;
  }

  blocks(workerKey: string): number {
    return this.totals.blocks(workerKey);
  }

  requests(workerKey: string): number {
    return this.totals.requests(workerKey);
  }

  prefillBlocks(workerKey: string): number {
    return this.totals.prefillBlocks(workerKey);
  }
}
