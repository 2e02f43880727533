// One KvIndex per "<model>:<tenant>" key. Turns KV listener signals into index events (in arrival
// order), and is the index side of recovery: a DumpSource for /dump and a DumpTarget whose staging is
// a fresh KvIndex per model, swapped in whole on commit so a failed attempt leaves nothing behind.
import { KvIndex, computeBlockHashes, type StoredBatchBuilder, type WorkerRef } from "@kv-epp/index-wasm";
import { isGpuMedium, type BlockStored, type KvEvent, type ListenerSignal } from "@kv-epp/kv-events";
import { type DumpModel, type DumpSource, type DumpStaging, type DumpTarget, toRouterEvents } from "@kv-epp/recovery";
import { storedBlockExtras } from "./event-identity.ts";
import { RankGroups } from "./kv-groups.ts";
import type { Metrics } from "./metrics.ts";
import type { Logger } from "pino";

export type Indexer = { key: string; blockSize: number; index: KvIndex };

export type IndexersOptions = {
  /**
   * The blocks a worker rank can really hold (its vLLM num_gpu_blocks, else a configured bound); undefined:
   * no bound. A rank the index sees above it is reset: only lost removals or a hostile publisher get there.
   */
  rankCapacity?: (w: WorkerRef) => number | undefined;
  /**
   * Told when a model's index drops blocks on its own rather than by an event (a rank over its capacity,
   * or every rank when a trapped index is replaced: `worker` null), so whatever tracks those ranks' views
   * (their stream cursors) knows they no longer match the workers.
   */
  onViewLost?: (key: string, worker: WorkerRef | null) => void;
};

export function indexerKey(model: string, tenant: string): string {
  return `${model}:${tenant}`;
}

/** A request's model resolved: its index, and the LoRA adapter its blocks are named with (null: the base model). */
export type Resolved = { indexer: Indexer; loraName: string | null };

/** Adapter names learned from events, at most (a stream naming ever new adapters must not grow this without bound). */
export const MAX_ADAPTERS = 4096;
/** Unknown model names logged, at most (each once). */
const MAX_LOGGED_UNKNOWN = 1024;

export class Indexers implements DumpSource, DumpTarget {
  readonly #byKey = new Map<string, Indexer>();
  /** Model name (as requests carry it) -> indexer key. */
  readonly #byModel = new Map<string, string>();
  /** LoRA adapter name (a request's `model`) -> the key of the index holding the base model's workers. */
  readonly #adapters = new Map<string, string>();
  readonly #loggedUnknown = new Set<string>();
  /** Per worker rank: its KV cache groups, and the block size of its indexed group's events. */
  readonly #ranks = new Map<string, RankState>();
  /** Index keys whose block size the workers' events have confirmed or replaced (it is fixed from then on). */
  readonly #adopted = new Set<string>();
  /** Worker ranks whose block size is not their index's (logged once each). */
  readonly #loggedBlockSize = new Set<string>();
  /** Worker ranks whose batches named another data_parallel_rank (logged once each). */
  readonly #loggedMismatch = new Set<string>();
  #default: string | undefined;

  constructor(
    private readonly metrics: Metrics,
    private readonly log?: Logger,
    private readonly opts: IndexersOptions = {},
  ) {}

  /** Declares an adapter of a registered model (from config); events' lora_name add more. */
  registerAdapter(name: string, model: string): void {
    const key = this.#byModel.get(model);
    if (key !== undefined && !this.#byModel.has(name)) this.#adapters.set(name, key);
  }

  /** Adapter names known, per indexer key (GET /workers, tests). */
  adapters(): Map<string, string> {
    return new Map(this.#adapters);
  }

  /**
   * A request's model: a served model's own index; an adapter's name: the index of the model it
   * adapts, scored in the adapter's identity; absent or unknown: the default model (an unknown name is
   * logged once), as requests were always routed.
   */
  resolve(model?: string): Resolved | undefined {
    let key = model !== undefined ? this.#byModel.get(model) : undefined;
    let loraName: string | null = null;
    if (key === undefined && model !== undefined) {
      key = this.#adapters.get(model);
      if (key !== undefined) loraName = model;
      else this.#unknownModel(model);
    }
    const indexer = this.#sound(this.#byKey.get(key ?? this.#default ?? ""));
    return indexer ? { indexer, loraName } : undefined;
  }

  /** The LoRA adapter a request's model names, or null (the picker's IndexLookup). */
  adapterOf(model?: string): string | null {
    return model !== undefined && !this.#byModel.has(model) && this.#adapters.has(model) ? model : null;
  }

  #unknownModel(model: string): void {
    if (this.#loggedUnknown.has(model) || this.#loggedUnknown.size >= MAX_LOGGED_UNKNOWN) return;
    this.#loggedUnknown.add(model);
    this.log?.warn({ model, fallback: this.#default }, "request names an unknown model or adapter: scored as the default model");
  }

  /**
   * The socket decides whose blocks these are (it is the rank's endpoint); a batch naming another rank
   * means the ports or the start rank are configured wrong, which routing cannot repair: counted, and
   * logged once per rank.
   */
  #rankMismatch(worker: WorkerRef, sent: number): void {
    this.metrics.rankMismatches.inc();
    const key = rankKey(worker);
    if (this.#loggedMismatch.has(key) || this.#loggedMismatch.size >= MAX_LOGGED_UNKNOWN) return;
    this.#loggedMismatch.add(key);
    this.log?.warn({ worker: worker.workerId, rank: worker.dpRank, batchRank: sent }, "KV events name another data_parallel_rank than their listener's: check the KV port and the DP start rank");
  }

  #learnAdapter(ix: Indexer, name: string): void {
    if (this.#adapters.has(name) || this.#byModel.has(name)) return;
    if (this.#adapters.size >= MAX_ADAPTERS) {
      this.metrics.eventsRejected.inc({ reason: "adapter_limit" });
      return;
    }
    this.#adapters.set(name, ix.key);
    this.log?.info({ adapter: name, model: ix.key }, "LoRA adapter learned from KV events");
  }

  /** Declares the model served by the configured workers; the first one is the default for requests. */
  register(model: string, tenant: string, blockSize: number): Indexer {
    const key = indexerKey(model, tenant);
    let ix = this.#byKey.get(key);
    if (!ix) {
      ix = { key, blockSize, index: KvIndex.create({ blockSize }) };
      this.#byKey.set(key, ix);
    }
    this.#byModel.set(model, key);
    this.#default ??= key;
    return ix;
  }

  /** The indexer for a request's model (see resolve); unknown or absent names fall back to the default model. */
  lookup(model?: string): Indexer | undefined {
    return this.resolve(model)?.indexer;
  }

  /**
   * An index whose module trapped (linear memory that could not grow) is no longer trusted: it is
   * replaced by an empty one, as if every worker had reset, and counted. Routing goes on by load while
   * new events fill it again.
   */
  #sound(ix: Indexer | undefined): Indexer | undefined {
    if (ix?.index.trapped) {
      ix.index = KvIndex.create({ blockSize: ix.blockSize });
      this.metrics.indexTraps.inc();
      this.opts.onViewLost?.(ix.key, null);
    }
    return ix;
  }

  get(key: string): Indexer | undefined {
    return this.#byKey.get(key);
  }

  all(): Indexer[] {
    return [...this.#byKey.values()];
  }

  /** Applies one listener signal for one worker rank to the model's index. */
  applySignal(key: string, worker: WorkerRef, signal: ListenerSignal): void {
    const ix = this.#sound(this.#byKey.get(key));
    if (!ix) return;
    try {
      this.#applySignal(ix, worker, signal);
    } finally {
      this.#sound(ix);
    }
  }

  #applySignal(ix: Indexer, worker: WorkerRef, signal: ListenerSignal): void {
    if (signal.kind === "reset") {
      ix.index.clearWorker(worker);
      this.metrics.listenerResets.inc({ reason: signal.reason });
      return;
    }
    const sent = signal.batch.dataParallelRank;
    if (sent !== null && sent !== worker.dpRank) this.#rankMismatch(worker, sent);
    // The first indexed store may replace the configured block size (and the empty index with it),
    // which must happen before this batch's builder is taken from the index.
    if (!this.#adopted.has(ix.key))
      for (const e of signal.batch.events)
        if (e.type === "BlockStored" && e.blockSize > 0 && isGpuMedium(e.medium) && this.#rank(worker).groups.stored(e) === "index") {
          this.#checkBlockSize(ix, worker, e);
          break;
        }
    // The index's typed-array batch builder: tokens hashes go in as the BigUint64Array computeBlockHashes
    // returns (one copy), no per-block objects (index-wasm README, "Which ingestion path").
    const b = ix.index.batch();
    for (const e of signal.batch.events) this.#add(b, worker, e, ix);
    const n = b.events;
    if (n === 0) return;
    const out = b.apply();
    this.metrics.eventsApplied.inc(n - out.rejected);
    // Unknown parent or hash conflict: the index refused it (e.g. a parent lost with a gap).
    if (out.rejected > 0) this.metrics.eventsRejected.inc({ reason: "index" }, out.rejected);
    this.#holdWithinCapacity(ix, worker);
  }

  /** Resets a rank that the index holds more blocks for than the rank can hold (rankCapacity). */
  #holdWithinCapacity(ix: Indexer, worker: WorkerRef): void {
    const cap = this.opts.rankCapacity?.(worker);
    if (cap === undefined || cap <= 0) return;
    const held = ix.index.treeSize(worker);
    if (held <= cap) return;
    ix.index.clearWorker(worker);
    this.metrics.rankOverCapacity.inc();
    this.opts.onViewLost?.(ix.key, worker);
    this.log?.warn({ worker: worker.workerId, rank: worker.dpRank, model: ix.key, blocks: held, capacity: cap }, "worker rank above its KV capacity: its blocks were dropped");
  }

  /** Applies the capacity rule to every rank of every index (after a recovery: the dump is a peer's claim). */
  holdWithinCapacity(): void {
    for (const ix of this.#byKey.values()) for (const w of ix.index.workers()) this.#holdWithinCapacity(ix, w);
  }

  /** What /workers shows of a rank: its groups and the block size its events use (null: none seen yet). */
  rankInfo(worker: WorkerRef): { blockSize: number | null; blockSizeMismatch: boolean; kvGroups: ReturnType<RankGroups["toJSON"]> } | undefined {
    const r = this.#ranks.get(rankKey(worker));
    return r && { blockSize: r.blockSize, blockSizeMismatch: r.mismatch, kvGroups: r.groups.toJSON() };
  }

  #rank(worker: WorkerRef): RankState {
    const k = rankKey(worker);
    let r = this.#ranks.get(k);
    if (!r) this.#ranks.set(k, (r = { groups: new RankGroups(), blockSize: null, mismatch: false }));
    return r;
  }

  /**
   * The block size is the workers': the configured one is the index's until the first indexed store
   * says otherwise, and is replaced then if nothing is indexed yet (loudly: it was configured wrong).
   * Later a rank with another size is a mismatch: its stores cannot match requests hashed by the
   * index's size, so they are refused, counted, logged once, and /workers shows it.
   */
  #checkBlockSize(ix: Indexer, worker: WorkerRef, e: BlockStored): boolean {
    const r = this.#rank(worker);
    r.blockSize = e.blockSize;
    if (e.blockSize === ix.blockSize) {
      this.#adopted.add(ix.key);
      r.mismatch = false;
      return true;
    }
    if (ix.index.stats().residencies === 0 && !this.#adopted.has(ix.key)) {
      this.log?.error({ model: ix.key, configured: ix.blockSize, workers: e.blockSize, worker: worker.workerId, rank: worker.dpRank }, "the workers' KV block size is not the configured one: indexing by the workers'");
      this.metrics.blockSizeMismatches.inc();
      ix.blockSize = e.blockSize;
      ix.index = KvIndex.create({ blockSize: e.blockSize });
      this.#adopted.add(ix.key);
      r.mismatch = false;
      return true;
    }
    this.#adopted.add(ix.key);
    r.mismatch = true;
    this.metrics.blockSizeMismatches.inc();
    this.metrics.eventsRejected.inc({ reason: "block_size" });
    const k = rankKey(worker);
    if (!this.#loggedBlockSize.has(k) && this.#loggedBlockSize.size < MAX_LOGGED_UNKNOWN) {
      this.#loggedBlockSize.add(k);
      this.log?.error({ model: ix.key, index: ix.blockSize, rank: worker.dpRank, worker: worker.workerId, events: e.blockSize }, "a worker rank's KV block size is not its index's: its blocks are not indexed");
    }
    return false;
  }

  #add(b: StoredBatchBuilder, worker: WorkerRef, e: KvEvent, ix: Indexer): void {
    switch (e.type) {
      case "BlockStored": {
        // Offloading connectors announce hashes without content (vLLM #43468): nothing to match on.
        if (e.blockSize === 0 && e.tokenIds.length === 0) {
          this.metrics.eventsIgnored.inc({ reason: "placeholder" });
          return;
        }
        // Only GPU residency makes a prefix cheap to serve; offloaded copies are not counted.
        if (!isGpuMedium(e.medium)) {
          this.metrics.eventsRejected.inc({ reason: "medium" });
          return;
        }
        const group = this.#rank(worker).groups.stored(e);
        if (group !== "index") {
          this.metrics.eventsIgnored.inc({ reason: group });
          return;
        }
        // Blocks of another size hash other token spans than requests are hashed by: never matched.
        if (!this.#checkBlockSize(ix, worker, e)) return;
        if (e.loraName) this.#learnAdapter(ix, e.loraName);
        const full = Math.min(Math.floor(e.tokenIds.length / e.blockSize), e.blockHashes.length);
        let tokensHashes = computeBlockHashes(Uint32Array.from(e.tokenIds), e.blockSize, storedBlockExtras(e, full));
        const n = Math.min(tokensHashes.length, e.blockHashes.length);
        if (n < e.blockHashes.length) this.metrics.eventsRejected.inc({ reason: "partial_block" });
        if (n === 0) return;
        if (tokensHashes.length > n) tokensHashes = tokensHashes.subarray(0, n);
        b.stored(worker, e.parentBlockHash, n < e.blockHashes.length ? e.blockHashes.slice(0, n) : e.blockHashes, tokensHashes);
        return;
      }
      case "BlockRemoved": {
        if (!isGpuMedium(e.medium)) {
          this.metrics.eventsRejected.inc({ reason: "medium" });
          return;
        }
        const group = this.#rank(worker).groups.removed(e);
        if (group !== "index") {
          this.metrics.eventsIgnored.inc({ reason: group });
          return;
        }
        b.removed(worker, e.blockHashes);
        return;
      }
      case "AllBlocksCleared":
        b.cleared(worker);
    }
  }

  removeWorker(worker: WorkerRef): void {
    for (const ix of this.#byKey.values()) ix.index.removeWorker(worker);
    this.#ranks.delete(rankKey(worker));
  }

  /** Drops workers the index knows but the worker set does not (e.g. only the peer's dump had them). */
  pruneWorkers(keep: (w: WorkerRef) => boolean): void {
    for (const ix of this.#byKey.values()) for (const w of ix.index.workers()) if (!keep(w)) ix.index.removeWorker(w);
  }

  updateGauges(): void {
    for (const ix of this.#byKey.values()) {
      const s = ix.index.stats();
      this.metrics.indexBlocks.set({ model: ix.key }, s.blocks);
      this.metrics.indexResidencies.set({ model: ix.key }, s.residencies);
      this.metrics.indexWorkers.set({ model: ix.key }, s.workers);
    }
  }

  // --- recovery: DumpSource ---
  /** `onSnapshot`: told each worker of a model in the step its blocks are copied (see KvIndex.dump). */
  *models(opts: { onSnapshot?: (key: string, w: WorkerRef) => void } = {}): Iterable<DumpModel> {
    for (const ix of this.#byKey.values()) {
      const onSnapshot = opts.onSnapshot && ((w: WorkerRef) => opts.onSnapshot!(ix.key, w));
      yield {
        key: ix.key,
        blockSize: ix.blockSize,
        events: toRouterEvents(ix.index.dump({ onSnapshot })),
        // The writer uses this instead of `events`: the index module writes the same JSON itself (3-4x faster).
        eventsJson: (chunkBytes) => ix.index.dumpJsonChunks({ chunkBytes, onSnapshot }),
      };
    }
  }

  // --- recovery: DumpTarget ---
  begin(): DumpStaging {
    const staged = new Map<string, Staged>();
    let open = true;
    const flush = (s: Staged) => {
      if (s.builder.events > 0) s.builder.apply();
    };
    const stagedFor = (key: string, blockSize: number): Staged => {
      let s = staged.get(key);
      // The parser skips models accepts() refuses: an unknown key here is a bug, not a peer's choice.
      if (!this.#byKey.has(key)) throw new Error(`model ${key} is not served by this replica`);
      // A peer with another block size for a model has hashes no request here can match: the attempt
      // fails (staging aborted, the next peer tried) rather than "recovering" nothing.
      const want = s?.blockSize ?? this.#byKey.get(key)?.blockSize;
      if (want !== undefined && want !== blockSize) {
        this.metrics.eventsRejected.inc({ reason: "block_size" });
        throw new Error(`the dump's block size for ${key} is ${blockSize}, this replica's ${want}`);
      }
      if (!s) {
        const index = KvIndex.create({ blockSize });
        s = { blockSize, index, builder: index.batch(), workers: new Map(), ext: new BigUint64Array(64), tok: new BigUint64Array(64) };
        staged.set(key, s);
      }
      return s;
    };
    return {
      // Only the models this replica serves are staged: any other model of the dump is skipped unparsed.
      accepts: (key) => this.#byKey.has(key),
      // The staged indexes' linear memory: what the dump really costs this process (checked per chunk).
      stagedBytes: () => {
        let n = 0;
        for (const s of staged.values()) n += s.index.stats().bytes;
        return n;
      },
      // The fast path: fetchDump hands most events over as typed batches (hashes already in BigUint64Arrays).
      applyBatch: (key, blockSize, b) => {
        if (!open) return;
        const s = stagedFor(key, blockSize);
        for (let i = 0; i < b.count; i++) {
          const from = b.blockStart[i]!, to = b.blockStart[i + 1]!;
          s.builder.stored(b.workers[i]!, b.parentHash(i), b.blockHashes.subarray(from, to), b.tokensHashes.subarray(from, to), b.hasCopies ? b.copies.subarray(from, to) : undefined);
        }
        flush(s);
      },
      apply: (key, blockSize, e) => {
        if (!open) return;
        const s = stagedFor(key, blockSize);
        // Dump events go in through the batch builder, STAGING_BATCH at a time (not one call each).
        const n = e.blocks.length;
        if (s.ext.length < n) {
          s.ext = new BigUint64Array(Math.max(n, s.ext.length * 2));
          s.tok = new BigUint64Array(s.ext.length);
        }
        let copies: number[] | undefined;
        for (let i = 0; i < n; i++) {
          const blk = e.blocks[i]!;
          s.ext[i] = blk.blockHash;
          s.tok[i] = blk.tokensHash;
          if (blk.copies !== undefined && blk.copies !== 1) copies ??= e.blocks.map((x) => x.copies ?? 1);
        }
        s.builder.stored(workerRef(s.workers, e.workerId, e.dpRank), e.parentHash, s.ext.subarray(0, n), s.tok.subarray(0, n), copies);
        if (s.builder.events >= STAGING_BATCH) flush(s);
      },
      commit: () => {
        if (!open) return;
        open = false;
        for (const [key, s] of staged) {
          flush(s);
          this.#byKey.get(key)!.index = s.index; // a served model, same block size: stagedFor refused others
        }
      },
      abort: () => {
        open = false;
        for (const s of staged.values()) s.builder.reset();
        staged.clear();
      },
    };
  }
}

type RankState = { groups: RankGroups; blockSize: number | null; mismatch: boolean };

function rankKey(w: WorkerRef): string {
  return `${w.workerId}\u0000${w.dpRank}`;
}

/** Dump events per builder call (the index-wasm bench measured batches of 256). */
const STAGING_BATCH = 256;

type Staged = {
  blockSize: number;
  index: KvIndex;
  builder: StoredBatchBuilder;
  /** One WorkerRef object per worker rank: the index caches a worker's slot per object. */
  workers: Map<string, WorkerRef>;
  ext: BigUint64Array;
  tok: BigUint64Array;
};

function workerRef(refs: Map<string, WorkerRef>, workerId: string, dpRank: number): WorkerRef {
  const key = `${workerId}\u0000${dpRank}`;
  let w = refs.get(key);
  if (!w) refs.set(key, (w = { workerId, dpRank }));
  return w;
}

