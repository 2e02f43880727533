// A controllable discovery double over the in-memory store: fail the k-th registration, pause the k-th
// (the caller can then be abandoned), fail the next n withdrawals, end the lease on demand. Every call
// is recorded in order.
import type { Discovery, DiscoveryRecord, Query, RecordSpec, Registration, WatchHandle } from "../src/index.ts";

type Resolvers = ReturnType<typeof Promise.withResolvers<void>>;
type Pause = { k: number; reached: Resolvers; release: Resolvers };

export class ControllableDiscovery implements Discovery {
  readonly calls: string[] = [];
  private registrations = 0;
  private failAt = new Map<number, Error>();
  private pauses = new Map<number, Pause>();
  private unregisterFailures = 0;
  private readonly leaseController = new AbortController();

  constructor(private readonly inner: Discovery) {
    inner.lease.addEventListener("abort", () => this.leaseController.abort(inner.lease.reason), { once: true });
  }

  get producer(): string {
    return this.inner.producer;
  }

  get lease(): AbortSignal {
    return this.leaseController.signal;
  }

  /** The k-th register call (1-based) throws. */
  failRegistration(k: number, err = new Error(`injected failure of registration ${k}`)): this {
    this.failAt.set(k, err);
    return this;
  }

  /** The k-th register call waits until released; `reached` settles when it is in flight. */
  pauseRegistration(k: number): { reached: Promise<void>; release: () => void } {
    const p: Pause = { k, reached: Promise.withResolvers(), release: Promise.withResolvers() };
    this.pauses.set(k, p);
    return { reached: p.reached.promise, release: () => p.release.resolve() };
  }

  /** The next n unregister calls throw (a flaky store). */
  failUnregisters(n: number): this {
    this.unregisterFailures = n;
    return this;
  }

  endLease(): void {
    this.leaseController.abort(new Error("lease ended"));
  }

  async register(spec: RecordSpec, opts?: { signal?: AbortSignal }): Promise<Registration> {
    const k = ++this.registrations;
    this.calls.push(`register ${spec.name}`);
    const pause = this.pauses.get(k);
    if (pause) {
      pause.reached.resolve();
      await pause.release.promise;
    }
    const reg = await this.inner.register(spec, opts);
    // A failure after the write: the record half-landed, as a timed-out request may leave it.
    const err = this.failAt.get(k);
    if (err) throw err;
    return reg;
  }

  async unregister(reg: Registration): Promise<"removed" | "missing"> {
    this.calls.push(`unregister ${reg.name}`);
    if (this.unregisterFailures > 0) {
      this.unregisterFailures--;
      throw new Error("injected transient withdrawal failure");
    }
    return this.inner.unregister(reg);
  }

  list(q: Query): Promise<DiscoveryRecord[]> {
    return this.inner.list(q);
  }

  listAndWatch(q: Query, onSnapshot: (records: DiscoveryRecord[]) => void): WatchHandle {
    return this.inner.listAndWatch(q, onSnapshot);
  }

  close(): Promise<void> {
    return this.inner.close();
  }
}
