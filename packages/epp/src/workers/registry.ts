// The worker set, level-triggered: a source (static file or pod informer) hands over the whole desired
// set on every change and the registry reconciles toward it: one KV listener per worker rank for new
// workers, listeners closed and index entries dropped for workers that went away.
import { rankSources, workerKeyOf, type RankSource, type WorkerRef, type WorkerSpec } from "@kv-epp/protocol";
import { KvEventListener, type Heartbeat, type ListenerCounters as KvListenerCounters, type ListenerOptions, type ListenerSignal, type MalformedKind } from "@kv-epp/kv-events";
import type { Logger } from "pino";
import type { Candidate } from "@kv-epp/routing";

/**
 * One routable unit: a worker rank. `key` matches the index's workerKey; `endpoint` is the API server
 * serving the rank; `rankHeader` is the x-data-parallel-rank that server is told (undefined: none,
 * when it serves this rank alone).
 */

/** Summed over the live listeners; `heartbeatTimeouts`: publishers dropped for going silent (then redialed). */
export type ListenerCounters = {
  gaps: number;
  replays: number;
  restarts: number;
  heartbeatTimeouts: number;
  /** Connections to publishers closed for breaking ZMTP or sending a message over the size limit. */
  protocolErrors: number;
  /** Of those, messages over the size limit (--kv-max-message-bytes). */
  oversize: number;
};

/** A rank's source with the registry's topic filled in: what its listener was opened with. */
type OpenedSource = { kvEvents: string; replay: string | undefined; topic: string; bind: boolean };

type Entry = {
  spec: WorkerSpec;
  /** By dp rank. */
  listeners: Map<number, KvEventListener>;
  /** By dp rank: the source each listener follows, compared on reconcile (not the spec's wording). */
  sources: Map<number, OpenedSource>;
};

export type Sink = (worker: WorkerRef, signal: ListenerSignal) => void;

export type RegistryOptions = {
  topic: string;
  log: Logger;
  /** The listeners' ZMTP heartbeats; undefined: off. */
  heartbeat?: Heartbeat;
  /** The largest KV-event message a listener reads (undefined: kv-events' DEFAULT_KV_MAX_MESSAGE_SIZE). */
  maxMessageSize?: number;
  /** Called when a worker leaves, so its blocks leave the index. */
  onRemoved: (worker: WorkerRef) => void;
  onChanged?: (specs: WorkerSpec[]) => void;
  /** A KV-event message was skipped as malformed (counted by the caller). */
  onMalformed?: (kind: MalformedKind) => void;
  /** Events dropped from a decoded batch, and unknown fields skipped (counted by the caller). */
  onDropped?: ListenerOptions["onDropped"];
  onUnknownFields?: ListenerOptions["onUnknownFields"];
};

export class WorkerRegistry {
  private readonly entries = new Map<string, Entry>();
  /** Workers whose model server stopped answering (see markDown): listed, but not routable. */
  private readonly down = new Set<string>();
  /** Down workers whose blocks were dropped (see markDown). */
  private readonly blocksDropped = new Set<string>();
  private candidateList: Candidate[] = [];
  private sink: Sink | undefined;
  private readonly opts: RegistryOptions;

  constructor(opts: RegistryOptions) {
    this.opts = opts;
  }

  /**
   * Toward `desired`, rank by rank: a listener whose endpoint, replay endpoint and topic are unchanged
   * is kept (with the blocks it fed), whatever else the spec now says (a pod-only spec and the same
   * worker described by its intents open the same sources); only ranks whose source changed or went
   * away are closed and have their blocks dropped. Address and metrics URL are updated in place.
   */
  reconcile(desired: WorkerSpec[]): void {
    const want = new Map(desired.map((s) => [s.id, s]));
    let changed = false;
    for (const [id, entry] of this.entries) {
      const next = want.get(id);
      if (!next) {
        this.remove(id, entry);
        changed = true;
      } else if (this.guard(id, () => this.update(entry, next))) changed = true;
    }
    for (const spec of desired) {
      if (this.entries.has(spec.id)) continue;
      if (this.guard(spec.id, () => (this.add(spec), true))) changed = true;
    }
    if (!changed) return;
    for (const id of this.down) if (!this.entries.has(id)) this.down.delete(id);
    for (const id of this.blocksDropped) if (!this.entries.has(id)) this.blocksDropped.delete(id);
    this.rebuild();
    this.opts.onChanged?.(this.specs());
  }

  /**
   * A worker whose model server stopped answering (static mode has no pod informer to say so) leaves
   * the candidates. Its blocks leave the index only once its KV publisher is gone too (no listener
   * connected): a server too busy to answer /metrics still holds its cache, which vLLM never
   * re-announces, while a dead one lost it. Called again on every failed check, so a publisher that
   * goes away later is noticed then.
   */
  markDown(workerId: string): void {
    const e = this.entries.get(workerId);
    if (!e) return;
    if (!this.down.has(workerId)) {
      this.down.add(workerId);
      this.rebuild();
      this.opts.log.warn({ worker: workerId }, "worker down: not routable");
    }
    if (this.blocksDropped.has(workerId) || [...e.listeners.values()].some((l) => l.connected)) return;
    this.blocksDropped.add(workerId);
    for (const r of e.listeners.keys()) this.opts.onRemoved({ workerId, dpRank: r });
    this.opts.log.warn({ worker: workerId }, "worker down and its KV publisher gone: blocks dropped");
  }

  markUp(workerId: string): void {
    this.blocksDropped.delete(workerId);
    if (!this.down.delete(workerId)) return;
    this.rebuild();
    this.opts.log.info({ worker: workerId }, "worker back up");
  }

  private rebuild(): void {
    this.candidateList = [...this.entries.values()]
      .filter(({ spec }) => !this.down.has(spec.id))
      .flatMap(({ spec, listeners }) =>
        [...listeners.keys()].map((r) => ({ key: workerKeyOf(spec.id, r), workerId: spec.id, dpRank: r, ...serving(spec, r, listeners.size), ...(spec.role ? { role: spec.role } : {}) })),
      );
  }

  /**
   * Switches from buffering to applying: every listener (and every later one) delivers to the sink.
   * Called after recovery so buffered live events apply on top of the dump.
   */
  attach(sink: Sink): void {
    this.sink = sink;
    for (const e of this.entries.values()) e.listeners.forEach((l, r) => this.attachOne(e.spec.id, l, r));
  }

  candidates(): readonly Candidate[] {
    return this.candidateList;
  }

  specs(): WorkerSpec[] {
    return [...this.entries.values()].map((e) => e.spec);
  }

  has(worker: WorkerRef): boolean {
    const e = this.entries.get(worker.workerId);
    return e !== undefined && e.listeners.has(worker.dpRank);
  }

  /** The rank's replay endpoint, as its listener was opened with. */
  replayEndpoint(w: WorkerRef): string | undefined {
    return this.entries.get(w.workerId)?.sources.get(w.dpRank)?.replay;
  }

  /** The rank's listener counters (gaps, replays, resets...), while it has a listener. */
  listenerCounters(w: WorkerRef): Readonly<KvListenerCounters> | undefined {
    return this.entries.get(w.workerId)?.listeners.get(w.dpRank)?.counters;
  }

  connected(workerId: string, dpRank: number): boolean {
    return this.entries.get(workerId)?.listeners.get(dpRank)?.connected ?? false;
  }

  /** KV listeners with a live connection to their publisher, over every worker rank. */
  connectedListeners(): number {
    let n = 0;
    for (const e of this.entries.values()) for (const l of e.listeners.values()) if (l.connected) n++;
    return n;
  }

  /**
   * Resolves once every listener has finished its handshake (so its subscription is in place), or at
   * the deadline with the ones still connecting. A listener only buffers what it receives: events
   * published before it connected reach neither it nor a dump fetched earlier, so recovery waits here.
   */
  async waitConnected(timeoutMs: number): Promise<WorkerRef[]> {
    const pending = (): WorkerRef[] =>
      [...this.entries.values()].flatMap((e) =>
        [...e.listeners].filter(([, l]) => !l.connected).map(([dpRank]) => ({ workerId: e.spec.id, dpRank })));
    const deadline = Date.now() + timeoutMs;
    while (pending().length > 0 && Date.now() < deadline) await Bun.sleep(5);
    return pending();
  }

  counters(): ListenerCounters {
    const sum = { gaps: 0, replays: 0, restarts: 0, heartbeatTimeouts: 0, protocolErrors: 0, oversize: 0 };
    for (const e of this.entries.values())
      for (const l of e.listeners.values()) {
        const c = l.counters as Partial<ListenerCounters> | undefined;
        sum.gaps += c?.gaps ?? 0;
        sum.replays += c?.replays ?? 0;
        sum.restarts += c?.restarts ?? 0;
        sum.heartbeatTimeouts += l.socketCounters?.heartbeatTimeouts ?? 0;
        sum.protocolErrors += (l.socketCounters?.protocolErrors ?? 0) + (l.socketCounters?.oversize ?? 0);
        sum.oversize += l.socketCounters?.oversize ?? 0;
      }
    return sum;
  }

  async close(): Promise<void> {
    const all = [...this.entries.values()].flatMap((e) => [...e.listeners.values()]);
    this.entries.clear();
    this.candidateList = [];
    await Promise.allSettled(all.map((l) => l.close()));
  }

  /** One worker's change that fails (an endpoint no listener can open) is logged; the others still apply. */
  private guard(workerId: string, f: () => boolean): boolean {
    try {
      return f();
    } catch (err) {
      this.opts.log.error({ worker: workerId, err: String(err) }, "worker not (fully) applied");
      return true;
    }
  }

  private add(spec: WorkerSpec): void {
    const entry: Entry = { spec, listeners: new Map(), sources: new Map() };
    try {
      for (const [r, src] of this.sourcesOf(spec)) this.open(entry, r, src);
    } catch (err) {
      // No half-opened worker: listeners already started for its other ranks are closed again.
      for (const r of [...entry.listeners.keys()]) this.closeRank(spec.id, entry, r);
      throw err;
    }
    this.entries.set(spec.id, entry);
    this.opts.log.info({ worker: spec.id, address: spec.address, kvEvents: spec.kvEvents, ranks: entry.listeners.size, ...(spec.role ? { role: spec.role } : {}) }, "worker added");
  }

  /** Brings an existing worker to `next`; true when anything visible (ranks, address, metrics) changed. */
  private update(entry: Entry, next: WorkerSpec): boolean {
    const prev = entry.spec;
    const id = prev.id;
    entry.spec = next;
    const want = this.sourcesOf(next);
    const closed: number[] = [];
    for (const [r, src] of entry.sources) {
      const w = want.get(r);
      if (w && sameSource(w, src)) continue;
      this.closeRank(id, entry, r);
      closed.push(r);
    }
    const opened: number[] = [];
    for (const [r, src] of want) {
      if (entry.listeners.has(r)) continue;
      this.open(entry, r, src);
      opened.push(r);
    }
    const moved = prev.address !== next.address || prev.metricsUrl !== next.metricsUrl || JSON.stringify(prev.servers) !== JSON.stringify(next.servers);
    // A relabelled pod changes candidate sets, not listeners: its blocks stay.
    const relabelled = prev.role !== next.role;
    if (relabelled) this.opts.log.info({ worker: id, role: next.role ?? null }, "worker role changed");
    if (closed.length > 0 || opened.length > 0)
      this.opts.log.info({ worker: id, closed, opened, ranks: entry.listeners.size }, "worker ranks changed");
    if (moved) this.opts.log.info({ worker: id, address: next.address, metricsUrl: next.metricsUrl }, "worker address updated");
    return moved || relabelled || closed.length > 0 || opened.length > 0 || prev.dpSize !== next.dpSize || prev.dpStartRank !== next.dpStartRank;
  }

  private sourcesOf(spec: WorkerSpec): Map<number, OpenedSource> {
    return new Map(
      rankSources(spec).map((s) => [s.dpRank, { kvEvents: s.kvEvents, replay: s.replay || undefined, topic: s.topic ?? this.opts.topic, bind: s.bind === true }]),
    );
  }

  private open(entry: Entry, dpRank: number, src: OpenedSource): void {
    const l = new KvEventListener({
      workerId: entry.spec.id,
      dpRank,
      endpoint: src.kvEvents,
      bind: src.bind,
      replayEndpoint: src.replay,
      topic: src.topic,
      logger: this.opts.log,
      socket: { heartbeat: this.opts.heartbeat, maxMessageSize: this.opts.maxMessageSize },
      onMalformed: this.opts.onMalformed,
      onDropped: this.opts.onDropped,
      onUnknownFields: this.opts.onUnknownFields,
    });
    // Started now (subscribe first): until a sink is attached the listener buffers live events.
    l.start();
    if (this.sink) this.attachOne(entry.spec.id, l, dpRank);
    entry.listeners.set(dpRank, l);
    entry.sources.set(dpRank, src);
  }

  /** Closes one rank's listener and drops that rank's blocks (its source changed or went away). */
  private closeRank(id: string, entry: Entry, dpRank: number): void {
    const l = entry.listeners.get(dpRank);
    entry.listeners.delete(dpRank);
    entry.sources.delete(dpRank);
    void l?.close().catch((err) => this.opts.log.warn({ worker: id, rank: dpRank, err: String(err) }, "listener close failed"));
    this.opts.onRemoved({ workerId: id, dpRank });
  }

  private attachOne(workerId: string, l: KvEventListener, dpRank: number): void {
    const sink = this.sink!;
    const worker: WorkerRef = { workerId, dpRank };
    l.attach((signal) => sink(worker, signal));
  }

  private remove(id: string, entry: Entry): void {
    this.entries.delete(id);
    for (const r of [...entry.listeners.keys()]) this.closeRank(id, entry, r);
    this.opts.log.info({ worker: id }, "worker removed");
  }
}

/** The API server of a worker's rank, and the rank header it is told. */
export function serving(spec: WorkerSpec, dpRank: number, listened: number): { endpoint: string; rankHeader: number | undefined } {
  const server = spec.servers?.find((s) => s.ranks.includes(dpRank));
  if (server) {
    // The rank among the server's own engines, which is how its API server numbers them.
    return { endpoint: server.address, rankHeader: server.ranks.length > 1 ? server.ranks.indexOf(dpRank) : undefined };
  }
  // Internal DP load balancing, every rank behind one API server that numbers them globally: tell vLLM
  // which rank the decision was for (also when this EPP follows only one of them, a rank other than 0).
  return { endpoint: spec.address, rankHeader: listened > 1 || dpRank > 0 ? dpRank : undefined };
}

function sameSource(a: OpenedSource, b: OpenedSource): boolean {
  return a.kvEvents === b.kvEvents && a.replay === b.replay && a.topic === b.topic && a.bind === b.bind;
}
