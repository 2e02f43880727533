// In-memory discovery: one store per process (tests, the in-process demo); each participant connects
// as its own producer. Closing a connection (or expire()) ends that producer's lease and drops its
// records, as a dead pod's owned objects are garbage-collected.
import { randomUUID } from "node:crypto";
import { RecordExistsError, type Discovery, type DiscoveryRecord, type Query, type RecordKind, type RecordSpec, type Registration, type WatchHandle } from "./types.ts";

type Stored = { kind: RecordKind; name: string; payload: unknown; shared: boolean; host?: string; holders: string[] };
type Watcher = { kind: RecordKind; producer: string; deliver: () => void; close: () => void };

export class MemoryDiscoveryStore {
  private readonly records = new Map<string, Stored>();
  private readonly watchers = new Set<Watcher>();
  private readonly leases = new Map<string, AbortController>();

  /** A client for one producer (default: a random instance id). */
  connect(opts: { producer?: string } = {}): Discovery {
    const producer = opts.producer ?? `mem-${randomUUID()}`;
    const lease = new AbortController();
    this.leases.set(producer, lease);
    return new MemoryDiscovery(this, producer, lease);
  }

  /** Ends a producer's lease: what a crashed process leaves behind is removed. */
  expire(producer: string): void {
    this.leases.get(producer)?.abort(new Error(`lease of ${producer} ended`));
    this.leases.delete(producer);
    const touched = new Set<RecordKind>();
    for (const [key, r] of this.records) {
      if (!r.holders.includes(producer)) continue;
      r.holders = r.holders.filter((h) => h !== producer);
      if (r.holders.length === 0) this.records.delete(key);
      touched.add(r.kind);
    }
    for (const w of [...this.watchers]) if (w.producer === producer) w.close();
    for (const k of touched) this.changed(k);
  }

  snapshot(kind: RecordKind, host?: string): DiscoveryRecord[] {
    return [...this.records.values()]
      .filter((r) => r.kind === kind && (host === undefined || r.host === host))
      .map((r) => ({ kind: r.kind, name: r.name, payload: structuredClone(r.payload), producer: r.holders[0]! }));
  }

  add(producer: string, spec: RecordSpec): void {
    const key = `${spec.kind}/${spec.name}`;
    const existing = this.records.get(key);
    if (existing) {
      if (!(spec.shared && existing.shared)) throw new RecordExistsError(`${spec.kind} record ${spec.name} exists`);
      if (!existing.holders.includes(producer)) existing.holders.push(producer);
      return;
    }
    const stored: Stored = { kind: spec.kind, name: spec.name, payload: structuredClone(spec.payload), shared: spec.shared ?? false, holders: [producer] };
    if (spec.host !== undefined) stored.host = spec.host;
    this.records.set(key, stored);
    this.changed(spec.kind);
  }

  remove(reg: Registration): "removed" | "missing" {
    const key = `${reg.kind}/${reg.name}`;
    const r = this.records.get(key);
    if (!r || !r.holders.includes(reg.producer)) return "missing";
    r.holders = r.holders.filter((h) => h !== reg.producer);
    if (r.holders.length === 0) {
      this.records.delete(key);
      this.changed(r.kind);
    }
    return "removed";
  }

  watch(producer: string, q: Query, onSnapshot: (records: DiscoveryRecord[]) => void): WatchHandle {
    let scheduled = false;
    let closed = false;
    // Coalesced into one snapshot per microtask: a burst of changes gives one reconcile.
    const w: Watcher = {
      kind: q.kind,
      producer,
      deliver: () => {
        if (scheduled) return;
        scheduled = true;
        queueMicrotask(() => {
          scheduled = false;
          if (!closed) onSnapshot(this.snapshot(q.kind, q.host));
        });
      },
      close: () => {
        closed = true;
        this.watchers.delete(w);
      },
    };
    this.watchers.add(w);
    w.deliver();
    // The first snapshot is queued above, ahead of this continuation.
    return { ready: Promise.resolve().then(() => {}), close: w.close };
  }

  private changed(kind: RecordKind): void {
    for (const w of this.watchers) if (w.kind === kind) w.deliver();
  }
}

class MemoryDiscovery implements Discovery {
  constructor(
    private readonly store: MemoryDiscoveryStore,
    readonly producer: string,
    private readonly leaseController: AbortController,
  ) {}

  get lease(): AbortSignal {
    return this.leaseController.signal;
  }

  async register(spec: RecordSpec): Promise<Registration> {
    if (this.lease.aborted) throw new Error(`lease of ${this.producer} has ended`);
    this.store.add(this.producer, spec);
    return { kind: spec.kind, name: spec.name, producer: this.producer };
  }

  async unregister(reg: Registration): Promise<"removed" | "missing"> {
    return this.store.remove(reg);
  }

  async list(q: Query): Promise<DiscoveryRecord[]> {
    return this.store.snapshot(q.kind, q.host);
  }

  listAndWatch(q: Query, onSnapshot: (records: DiscoveryRecord[]) => void): WatchHandle {
    return this.store.watch(this.producer, q, onSnapshot);
  }

  async close(): Promise<void> {
    this.store.expire(this.producer);
  }
}
