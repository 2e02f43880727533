// The worker set, level-triggered: a source (static file or pod informer) hands over the whole desired
// set on every change and the registry reconciles toward it: one KV listener per worker rank for new
// workers, listeners closed and index entries dropped for workers that went away.
import type { WorkerRef } from "@kv-epp/index-wasm";
import { KvEventListener, type ListenerSignal } from "@kv-epp/kv-events";
import type { Logger } from "pino";

/** A model-server pod (or static entry). Ranks r publish KV events on kvEvents port + r. */
export type WorkerSpec = {
  id: string;
  /** ip:port the gateway is told to call. */
  address: string;
  kvEvents: string;
  replay?: string;
  dpSize: number;
  /** vLLM Prometheus endpoint, scraped for running/waiting/KV usage. */
  metricsUrl: string;
  /** Per-rank KV sources stated by attachment intents (@kv-epp/intents); overrides port + r. */
  ranks?: RankSource[];
};

/** One rank's KV source; `topic` overrides the registry's topic. */
export type RankSource = { dpRank: number; kvEvents: string; replay?: string; topic?: string };

/** One routable unit: a worker rank. `key` matches the index's workerKey; `ranks` is the worker's dpSize. */
export type Candidate = { key: string; workerId: string; dpRank: number; endpoint: string; ranks: number };

export type ListenerCounters = { gaps: number; replays: number; restarts: number };

type Entry = { spec: WorkerSpec; listeners: Map<number, KvEventListener> }; // by dp rank

export type Sink = (worker: WorkerRef, signal: ListenerSignal) => void;

export function workerKeyOf(workerId: string, dpRank: number): string {
  return `${workerId}\u0000${dpRank}`;
}

/** A worker's ranks: as its intents state them, else ranks 0..dpSize-1 on port + r. */
export function rankSources(spec: WorkerSpec): RankSource[] {
  return (
    spec.ranks ??
    Array.from({ length: spec.dpSize }, (_, r) => ({
      dpRank: r,
      kvEvents: rankEndpoint(spec.kvEvents, r),
      replay: spec.replay ? rankEndpoint(spec.replay, r) : undefined,
    }))
  );
}

/** tcp://host:port + rank. */
export function rankEndpoint(endpoint: string, rank: number): string {
  const m = /^(tcp:\/\/.+):(\d+)$/.exec(endpoint);
  if (!m) return endpoint;
  return `${m[1]}:${Number(m[2]) + rank}`;
}

export class WorkerRegistry {
  readonly #entries = new Map<string, Entry>();
  /** Workers whose model server stopped answering (see markDown): listed, but not routable. */
  readonly #down = new Set<string>();
  #candidates: Candidate[] = [];
  #sink: Sink | undefined;

  constructor(
    private readonly opts: {
      topic: string;
      log: Logger;
      /** Called when a worker leaves, so its blocks leave the index. */
      onRemoved: (worker: WorkerRef) => void;
      onChanged?: (specs: WorkerSpec[]) => void;
    },
  ) {}

  reconcile(desired: WorkerSpec[]): void {
    const want = new Map(desired.map((s) => [s.id, s]));
    let changed = false;
    for (const [id, entry] of this.#entries) {
      const next = want.get(id);
      if (next && sameSpec(next, entry.spec)) continue;
      this.#remove(id, entry);
      changed = true;
    }
    for (const spec of desired) {
      if (this.#entries.has(spec.id)) continue;
      this.#add(spec);
      changed = true;
    }
    if (!changed) return;
    for (const id of this.#down) if (!this.#entries.has(id)) this.#down.delete(id);
    this.#rebuild();
    this.opts.onChanged?.(this.specs());
  }

  /**
   * A worker that stopped answering (static mode has no pod informer to say so) leaves the candidates
   * and the index: whatever it held is gone if it restarts, and its events say so when it is back.
   */
  markDown(workerId: string): void {
    const e = this.#entries.get(workerId);
    if (!e || this.#down.has(workerId)) return;
    this.#down.add(workerId);
    this.#rebuild();
    for (const r of e.listeners.keys()) this.opts.onRemoved({ workerId, dpRank: r });
    this.opts.log.warn({ worker: workerId }, "worker down: not routable, blocks dropped");
  }

  markUp(workerId: string): void {
    if (!this.#down.delete(workerId)) return;
    this.#rebuild();
    this.opts.log.info({ worker: workerId }, "worker back up");
  }

  #rebuild(): void {
    this.#candidates = [...this.#entries.values()]
      .filter(({ spec }) => !this.#down.has(spec.id))
      .flatMap(({ spec, listeners }) =>
        [...listeners.keys()].map((r) => ({
          key: workerKeyOf(spec.id, r),
          workerId: spec.id,
          dpRank: r,
          endpoint: spec.address,
          ranks: listeners.size,
        })),
      );
  }

  /**
   * Switches from buffering to applying: every listener (and every later one) delivers to the sink.
   * Called after recovery so buffered live events apply on top of the dump.
   */
  attach(sink: Sink): void {
    this.#sink = sink;
    for (const e of this.#entries.values()) e.listeners.forEach((l, r) => this.#attachOne(e.spec.id, l, r));
  }

  candidates(): readonly Candidate[] {
    return this.#candidates;
  }

  specs(): WorkerSpec[] {
    return [...this.#entries.values()].map((e) => e.spec);
  }

  has(worker: WorkerRef): boolean {
    const e = this.#entries.get(worker.workerId);
    return e !== undefined && e.listeners.has(worker.dpRank);
  }

  connected(workerId: string, dpRank: number): boolean {
    return this.#entries.get(workerId)?.listeners.get(dpRank)?.connected ?? false;
  }

  /**
   * Resolves once every listener has finished its handshake (so its subscription is in place), or at
   * the deadline with the ones still connecting. A listener only buffers what it receives: events
   * published before it connected reach neither it nor a dump fetched earlier, so recovery waits here.
   */
  async waitConnected(timeoutMs: number): Promise<WorkerRef[]> {
    const pending = (): WorkerRef[] =>
      [...this.#entries.values()].flatMap((e) =>
        [...e.listeners].filter(([, l]) => !l.connected).map(([dpRank]) => ({ workerId: e.spec.id, dpRank })));
    const deadline = Date.now() + timeoutMs;
    while (pending().length > 0 && Date.now() < deadline) await Bun.sleep(5);
    return pending();
  }

  counters(): ListenerCounters {
    const sum = { gaps: 0, replays: 0, restarts: 0 };
    for (const e of this.#entries.values())
      for (const l of e.listeners.values()) {
        const c = l.counters as Partial<ListenerCounters> | undefined;
        sum.gaps += c?.gaps ?? 0;
        sum.replays += c?.replays ?? 0;
        sum.restarts += c?.restarts ?? 0;
      }
    return sum;
  }

  async close(): Promise<void> {
    const all = [...this.#entries.values()].flatMap((e) => [...e.listeners.values()]);
    this.#entries.clear();
    this.#candidates = [];
    await Promise.allSettled(all.map((l) => l.close()));
  }

  #add(spec: WorkerSpec): void {
    const listeners = new Map<number, KvEventListener>();
    for (const src of rankSources(spec)) {
      const l = new KvEventListener({
        workerId: spec.id,
        dpRank: src.dpRank,
        endpoint: src.kvEvents,
        replayEndpoint: src.replay,
        topic: src.topic ?? this.opts.topic,
        logger: this.opts.log,
      });
      // Started now (subscribe first): until a sink is attached the listener buffers live events.
      l.start();
      if (this.#sink) this.#attachOne(spec.id, l, src.dpRank);
      listeners.set(src.dpRank, l);
    }
    this.#entries.set(spec.id, { spec, listeners });
    this.opts.log.info({ worker: spec.id, address: spec.address, kvEvents: spec.kvEvents, ranks: spec.dpSize }, "worker added");
  }

  #attachOne(workerId: string, l: KvEventListener, dpRank: number): void {
    const sink = this.#sink!;
    const worker: WorkerRef = { workerId, dpRank };
    l.attach((signal) => sink(worker, signal));
  }

  #remove(id: string, entry: Entry): void {
    this.#entries.delete(id);
    for (const l of entry.listeners.values())
      void l.close().catch((err) => this.opts.log.warn({ worker: id, err: String(err) }, "listener close failed"));
    for (const r of entry.listeners.keys()) this.opts.onRemoved({ workerId: id, dpRank: r });
    this.opts.log.info({ worker: id }, "worker removed");
  }
}

function sameSpec(a: WorkerSpec, b: WorkerSpec): boolean {
  return (
    a.address === b.address &&
    a.kvEvents === b.kvEvents &&
    a.replay === b.replay &&
    a.dpSize === b.dpSize &&
    a.metricsUrl === b.metricsUrl &&
    JSON.stringify(a.ranks) === JSON.stringify(b.ranks)
  );
}
