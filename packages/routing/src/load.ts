// Active load: requests routed and not finished, per worker rank. This replica's own requests live in
// an ActiveLoad (leases taken at routing, released when the response ends or the stream breaks); the
// requests its peers routed live in one LoadTable per peer (replica-agg). The picker reads the
// sum through a LoadView. A lease may also carry the request's prefix keys into this replica's
// PendingPrefixes (pending.ts), which leave with the lease.
import type { PendingPrefixes, PrefixKeys } from "./pending.ts";

/** A routed request as the load tables hold it. */
export type LoadEntry = {
  readonly workerKey: string;
  /** The request's blocks: what it adds to the worker's decode load. */
  readonly blocks: number;
  /** Blocks still to prefill (request blocks - overlap, see RoutedRequest); 0 once the first response byte came back. */
  prefillBlocks: number;
};

/** One worker's in-flight totals: what the cost function reads. */
export type LoadTotals = {
  /** Requests in flight on the worker. */
  readonly requests: number;
  /** Blocks those requests hold (the decode load term). */
  readonly blocks: number;
  /** Blocks of requests on the worker that have not finished their prefill. */
  readonly prefillBlocks: number;
  /** Requests on the worker with prefill blocks and no first token yet (the ones its queue may hold). */
  readonly prefillRequests: number;
};

/** Per-worker totals, by worker key (a live view: read the totals at once, do not keep them). */
export interface LoadView {
  of(workerKey: string): LoadTotals;
}

type Totals = { -readonly [K in keyof LoadTotals]: LoadTotals[K] };

const NONE: LoadTotals = Object.freeze({ requests: 0, blocks: 0, prefillBlocks: 0, prefillRequests: 0 });

/** Sums of entries per worker, optionally shared by several tables (one per peer). */
export class WorkerTotals implements LoadView {
  private readonly byWorker = new Map<string, Totals>();

  add(e: LoadEntry, sign: 1 | -1): void {
    let t = this.byWorker.get(e.workerKey);
    if (!t) this.byWorker.set(e.workerKey, (t = { requests: 0, blocks: 0, prefillBlocks: 0, prefillRequests: 0 }));
    t.requests += sign;
    t.blocks += sign * e.blocks;
    t.prefillBlocks += sign * e.prefillBlocks;
    if (e.prefillBlocks > 0) t.prefillRequests += sign;
    if (t.requests <= 0) this.byWorker.delete(e.workerKey);
  }

  prefillDone(e: LoadEntry): void {
    const t = this.byWorker.get(e.workerKey);
    if (!t || e.prefillBlocks === 0) return;
    t.prefillBlocks -= e.prefillBlocks;
    t.prefillRequests -= 1;
  }

  of(workerKey: string): LoadTotals {
    return this.byWorker.get(workerKey) ?? NONE;
  }

  /** Every worker with load, for metrics. */
  workers(): IterableIterator<[string, Readonly<Totals>]> {
    return this.byWorker.entries();
  }
}

/** Entries by request id, with their per-worker totals kept in step (and in a shared parent's). */
export class LoadTable implements LoadView {
  private readonly entryByRank = new Map<number, LoadEntry>();
  private readonly totals = new WorkerTotals();

  constructor(private readonly parent?: WorkerTotals) {}

  /** False when the id is already there (the entry is left as it was). */
  add(id: number, e: LoadEntry): boolean {
    if (this.entryByRank.has(id)) return false;
    this.entryByRank.set(id, e);
    this.totals.add(e, 1);
    this.parent?.add(e, 1);
    return true;
  }

  prefilled(id: number): boolean {
    const e = this.entryByRank.get(id);
    if (!e || e.prefillBlocks === 0) return false;
    this.totals.prefillDone(e);
    this.parent?.prefillDone(e);
    e.prefillBlocks = 0;
    return true;
  }

  remove(id: number): boolean {
    const e = this.entryByRank.get(id);
    if (!e) return false;
    this.entryByRank.delete(id);
    this.totals.add(e, -1);
    this.parent?.add(e, -1);
    return true;
  }

  clear(): void {
    for (const id of [...this.entryByRank.keys()]) this.remove(id);
  }

  get size(): number {
    return this.entryByRank.size;
  }

  entries(): IterableIterator<[number, Readonly<LoadEntry>]> {
    return this.entryByRank.entries();
  }

  of(workerKey: string): LoadTotals {
    return this.totals.of(workerKey);
  }
}

export type Lease = {
  readonly id: number;
  readonly workerKey: string;
  readonly blocks: number;
  /** The request's first response bytes came back: its prefill is over (idempotent). */
  prefilled(): void;
  /** The request ended (idempotent). */
  release(): void;
};

/**
 * A change to this replica's own load, as replica-agg publishes it. `prefix`: the request's prefix keys
 * as this replica's PendingPrefixes records them (only with in-flight prefixes on), so peers count
 * them as pending on the same worker.
 */
export type LoadChange =
  | { kind: "added"; id: number; entry: Readonly<LoadEntry>; prefix?: PrefixKeys }
  | { kind: "prefilled"; id: number }
  | { kind: "freed"; id: number };

/** This replica's own routing decisions. */
export class ActiveLoad implements LoadView {
  private readonly table = new LoadTable();
  private readonly observers: ((c: LoadChange) => void)[] = [];
  private nextId = 1;

  /** `pending`: where leases given a prefix record it until they are released (absent: prefixes are ignored). */
  constructor(readonly pending?: PendingPrefixes) {}

  acquire(workerKey: string, blocks: number, prefillBlocks = 0, prefix?: PrefixKeys): Lease {
    const id = this.nextId++;
    const entry: LoadEntry = { workerKey, blocks, prefillBlocks };
    this.table.add(id, entry);
    const pending = prefix && prefix.length > 0 ? this.pending : undefined;
    this.emit(pending ? { kind: "added", id, entry, prefix } : { kind: "added", id, entry });
    const pendingId = pending?.add(workerKey, prefix!);
    let released = false;
    return {
      id,
      workerKey,
      blocks,
      prefilled: () => {
        if (!released && this.table.prefilled(id)) this.emit({ kind: "prefilled", id });
      },
      release: () => {
        if (released) return;
        released = true;
        this.table.remove(id);
        if (pendingId !== undefined) pending!.remove(pendingId);
        this.emit({ kind: "freed", id });
      },
    };
  }

  /** Told of every change, in order (replica-agg's publisher). */
  observe(cb: (c: LoadChange) => void): void {
    this.observers.push(cb);
  }

  /** The requests in flight now, for a full snapshot. */
  entries(): IterableIterator<[number, Readonly<LoadEntry>]> {
    return this.table.entries();
  }

  of(workerKey: string): LoadTotals {
    return this.table.of(workerKey);
  }

  get inflight(): number {
    return this.table.size;
  }

  private emit(c: LoadChange): void {
    for (const cb of this.observers) cb(c);
  }
}

/** The sum of several views: this replica's own load plus what its peers attributed. */
export function sumLoad(...views: LoadView[]): LoadView {
  return {
    of(k) {
      const t: Totals = { requests: 0, blocks: 0, prefillBlocks: 0, prefillRequests: 0 };
      for (const v of views) {
        const l = v.of(k);
        t.requests += l.requests;
        t.blocks += l.blocks;
        t.prefillBlocks += l.prefillBlocks;
        t.prefillRequests += l.prefillRequests;
      }
      return t;
    },
  };
}
