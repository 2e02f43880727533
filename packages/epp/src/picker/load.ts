// Active load from the EPP's own routing decisions: each routed request holds a lease on its worker
// for its blocks until the response ends or the ext_proc stream breaks.

export type Lease = { readonly workerKey: string; readonly blocks: number; release(): void };

type WorkerLoad = { requests: number; blocks: number };

export class ActiveLoad {
  readonly #byWorker = new Map<string, WorkerLoad>();
  #inflight = 0;

  acquire(workerKey: string, blocks: number): Lease {
    const load = this.#byWorker.get(workerKey) ?? { requests: 0, blocks: 0 };
    load.requests += 1;
    load.blocks += blocks;
    this.#byWorker.set(workerKey, load);
    this.#inflight += 1;
    let released = false;
    return {
      workerKey,
      blocks,
      release: () => {
        if (released) return;
        released = true;
        this.#inflight -= 1;
        const l = this.#byWorker.get(workerKey);
        if (!l) return;
        l.requests -= 1;
        l.blocks -= blocks;
        if (l.requests <= 0) this.#byWorker.delete(workerKey);
      },
    };
  }

  /** Blocks held by requests in flight on the worker (the decode load term). */
  blocks(workerKey: string): number {
    return this.#byWorker.get(workerKey)?.blocks ?? 0;
  }

  requests(workerKey: string): number {
    return this.#byWorker.get(workerKey)?.requests ?? 0;
  }

  get inflight(): number {
    return this.#inflight;
  }
}
