// Live ingestion: a KV listener's signals for one worker rank become index events, in arrival order,
// through the filters that decide what the index may hold: the rank's KV cache groups (only the main
// attention group), the block size (the workers', fixed once confirmed), the DP rank the batch names,
// GPU residency, whole blocks, each block's identity (extra keys), and the rank's capacity.
import { newExtraKeyTally, type StoredBatchBuilder } from "@kv-epp/index-wasm";
import { workerKey, type WorkerRef } from "@kv-epp/protocol";
import { isGpuMedium, type BlockStored, type KvEvent, type ListenerSignal } from "@kv-epp/kv-events";
import type { Logger } from "pino";
import type { Metrics } from "../metrics.ts";
import type { EvictionRegret } from "@kv-epp/routing";
import { storedBlockExtras } from "./event-identity.ts";
import { RankGroups } from "./kv-groups.ts";
import { isPartialEntry } from "./partial-entry.ts";
import { MAX_LOGGED, type Indexer, type ModelIndexes, type ViewLost } from "./model-indexes.ts";

export type LiveIngestOptions = {
  /**
   * The blocks a worker rank can really hold (its vLLM num_gpu_blocks, else a configured bound); undefined:
   * no bound. A rank the index sees above it is reset: only lost removals or a hostile publisher get there.
   */
  rankCapacity?: (w: WorkerRef) => number | undefined;
  onViewLost?: ViewLost;
  /** Told the blocks each rank stores and evicts (the ones the index takes), for the eviction regret. */
  regret?: EvictionRegret;
};

/** What /workers shows of a rank's events: the block size they use (null: none seen yet) and its KV groups. */
export type RankInfo = { blockSize: number | null; blockSizeMismatch: boolean; kvGroups: ReturnType<RankGroups["toJSON"]> };

type RankState = { groups: RankGroups; blockSize: number | null; mismatch: boolean };

export class LiveIngest {
  private readonly models: ModelIndexes;
  private readonly metrics: Metrics;
  private readonly log: Logger | undefined;
  private readonly opts: LiveIngestOptions;
  /** Per worker rank: its KV cache groups, and the block size of its indexed group's events. */
  private readonly ranks = new Map<string, RankState>();
  /** Index keys whose block size the workers' events have confirmed or replaced (it is fixed from then on). */
  private readonly adopted = new Set<string>();
  /** Worker ranks whose block size is not their index's (logged once each). */
  private readonly loggedBlockSize = new Set<string>();
  /** Worker ranks whose batches named another data_parallel_rank (logged once each). */
  private readonly loggedMismatch = new Set<string>();

  constructor(models: ModelIndexes, metrics: Metrics, log?: Logger, opts: LiveIngestOptions = {}) {
    this.models = models;
    this.metrics = metrics;
    this.log = log;
    this.opts = opts;
  }

  /** Applies one listener signal for one worker rank to the model's index. */
  apply(key: string, worker: WorkerRef, signal: ListenerSignal): void {
    const ix = this.models.sound(this.models.get(key));
    if (!ix) return;
    try {
      this.applyTo(ix, worker, signal);
    } finally {
      this.models.sound(ix);
    }
  }

  /** Applies the capacity rule to every rank of every index (after a recovery: the dump is a peer's claim). */
  holdWithinCapacity(): void {
    for (const ix of this.models.all()) for (const w of ix.index.workers()) this.holdRankWithinCapacity(ix, w);
  }

  rankInfo(worker: WorkerRef): RankInfo | undefined {
    const r = this.ranks.get(workerKey(worker));
    return r && { blockSize: r.blockSize, blockSizeMismatch: r.mismatch, kvGroups: r.groups.toJSON() };
  }

  /** The rank left the worker set: what its events revealed goes too. */
  forget(worker: WorkerRef): void {
    this.ranks.delete(workerKey(worker));
    this.opts.regret?.forget(worker);
  }

  private applyTo(ix: Indexer, worker: WorkerRef, signal: ListenerSignal): void {
    if (signal.kind === "reset") {
      ix.index.clearWorker(worker);
      this.metrics.listenerResets.inc({ reason: signal.reason });
      return;
    }
    const sent = signal.batch.dataParallelRank;
    if (sent !== null && sent !== worker.dpRank) this.rankMismatch(worker, sent);
    // The first indexed store may replace the configured block size (and the empty index with it),
    // which must happen before this batch's builder is taken from the index.
    if (!this.adopted.has(ix.key))
      for (const e of signal.batch.events)
        if (e.type === "BlockStored" && e.blockSize > 0 && !oneTokenStream(e, ix) && isGpuMedium(e.medium) && e.ownership == null && !this.partial(worker, e, ix) && this.rank(worker).groups.stored(e) === "index") {
          this.checkBlockSize(ix, worker, e);
          break;
        }
    // The index's batch builder: token ids are hashed inside the index's module, no per-block objects.
    const b = ix.index.batch();
    try {
      for (const e of signal.batch.events) this.add(b, worker, e, ix);
    } catch (err) {
      // The builder is the index's, shared by every batch: what this one added must not go with the next.
      b.reset();
      throw err;
    }
    const n = b.events;
    if (n === 0) return;
    const out = b.apply();
    this.metrics.eventsApplied.inc(n - out.rejected);
    if (this.opts.regret) this.metrics.evictionRegret.set(this.opts.regret.share);
    // Unknown parent or hash conflict: the index refused it (e.g. a parent lost with a gap).
    if (out.rejected > 0) this.metrics.eventsRejected.inc({ reason: "index" }, out.rejected);
    this.holdRankWithinCapacity(ix, worker);
  }

  /**
   * The socket decides whose blocks these are (it is the rank's endpoint); a batch naming another rank
   * means the ports or the start rank are configured wrong, which routing cannot repair: counted, and
   * logged once per rank.
   */
  private rankMismatch(worker: WorkerRef, sent: number): void {
    this.metrics.rankMismatches.inc();
    const key = workerKey(worker);
    if (this.loggedMismatch.has(key) || this.loggedMismatch.size >= MAX_LOGGED) return;
    this.loggedMismatch.add(key);
    this.log?.warn({ worker: worker.workerId, rank: worker.dpRank, batchRank: sent }, "KV events name another data_parallel_rank than their listener's: check the KV port and the DP start rank");
  }

  /** Resets a rank that the index holds more blocks for than the rank can hold (rankCapacity). */
  private holdRankWithinCapacity(ix: Indexer, worker: WorkerRef): void {
    const cap = this.opts.rankCapacity?.(worker);
    if (cap === undefined || cap <= 0) return;
    const held = ix.index.treeSize(worker);
    if (held <= cap) return;
    ix.index.clearWorker(worker);
    this.metrics.rankOverCapacity.inc();
    this.opts.onViewLost?.(ix.key, worker);
    this.log?.warn({ worker: worker.workerId, rank: worker.dpRank, model: ix.key, blocks: held, capacity: cap }, "worker rank above its KV capacity: its blocks were dropped");
  }

  private rank(worker: WorkerRef): RankState {
    const k = workerKey(worker);
    let r = this.ranks.get(k);
    if (!r) this.ranks.set(k, (r = { groups: new RankGroups(), blockSize: null, mismatch: false }));
    return r;
  }

  /**
   * The block size is the workers': the configured one is the index's until the first indexed store
   * says otherwise, and is replaced then if nothing is indexed yet (loudly: it was configured wrong).
   * Later a rank with another size is a mismatch: its stores cannot match requests hashed by the
   * index's size, so they are refused, counted, logged once, and /workers shows it.
   */
  private checkBlockSize(ix: Indexer, worker: WorkerRef, e: BlockStored): boolean {
    const r = this.rank(worker);
    r.blockSize = e.blockSize;
    if (e.blockSize === ix.blockSize) {
      this.adopted.add(ix.key);
      r.mismatch = false;
      return true;
    }
    // One-token blocks (SGLang's default --page-size 1) are never adopted: indexed per token, every option
    // stated in blocks (the prefix cap, in-flight prefixes, --max-blocks-per-rank) would mean tokens, for
    // an index many times larger. Refused with what to change; --block-size 1 indexes them on purpose.
    if (oneTokenStream(e, ix))
      return this.refuse(ix, worker, r, e, `a worker rank publishes one-token KV blocks (SGLang's default --page-size 1): its blocks are not indexed; start it with --page-size ${ix.blockSize} (the EPP's --block-size), or set --block-size 1 to index every token`);
    if (ix.index.stats().residencies === 0 && !this.adopted.has(ix.key)) {
      this.log?.error({ model: ix.key, configured: ix.blockSize, workers: e.blockSize, worker: worker.workerId, rank: worker.dpRank }, "the workers' KV block size is not the configured one: indexing by the workers'");
      this.metrics.blockSizeMismatches.inc();
      ix.blockSize = e.blockSize;
      ix.index = this.models.newIndex(e.blockSize);
      this.adopted.add(ix.key);
      r.mismatch = false;
      return true;
    }
    this.adopted.add(ix.key);
    return this.refuse(ix, worker, r, e, "a worker rank's KV block size is not its index's: its blocks are not indexed");
  }

  /** The rank's stores of another block size than the index's: counted, logged once per rank, shown in /workers. */
  private refuse(ix: Indexer, worker: WorkerRef, r: RankState, e: BlockStored, why: string): false {
    r.mismatch = true;
    this.metrics.blockSizeMismatches.inc();
    this.metrics.eventsRejected.inc({ reason: "block_size" });
    const k = workerKey(worker);
    if (!this.loggedBlockSize.has(k) && this.loggedBlockSize.size < MAX_LOGGED) {
      this.loggedBlockSize.add(k);
      this.log?.error({ model: ix.key, index: ix.blockSize, rank: worker.dpRank, worker: worker.workerId, events: e.blockSize }, why);
    }
    return false;
  }

  /** A partial prefix-cache entry (partial-entry.ts), judged by its group's block size, else the index's. */
  private partial(worker: WorkerRef, e: BlockStored, ix: Indexer): boolean {
    return isPartialEntry(e, this.rank(worker).groups.blockSize(e.groupIdx) ?? ix.blockSize);
  }

  private add(b: StoredBatchBuilder, worker: WorkerRef, e: KvEvent, ix: Indexer): void {
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
        if (e.ownership != null) {
          this.metrics.eventsIgnored.inc({ reason: "offload_tier" });
          return;
        }
        const partial = this.partial(worker, e, ix);
        const group = this.rank(worker).groups.stored(e, partial);
        if (group !== "index") {
          this.metrics.eventsIgnored.inc({ reason: group });
          return;
        }
        // Never indexed, and never a block size (partial-entry.ts).
        if (partial) {
          this.metrics.eventsIgnored.inc({ reason: "partial_entry" });
          return;
        }
        // Blocks of another size hash other token spans than requests are hashed by: never matched.
        if (!this.checkBlockSize(ix, worker, e)) return;
        if (e.loraName) this.models.learnAdapter(ix, e.loraName);
        // More whole blocks of tokens than hashes: the event left blocks out (vLLM's cache_full_blocks skips
        // null and already-cached blocks in block_hashes, not in token_ids) and does not say which, so no
        // hash can be paired with its tokens.
        if (Math.floor(e.tokenIds.length / e.blockSize) > e.blockHashes.length) {
          this.metrics.eventsRejected.inc({ reason: "unaligned" });
          return;
        }
        const n = Math.min(Math.floor(e.tokenIds.length / e.blockSize), e.blockHashes.length);
        if (n < e.blockHashes.length) this.metrics.eventsRejected.inc({ reason: "partial_block" });
        if (n === 0) return;
        // The token ids are hashed by the index's own module, straight into the batch (same block size: checked above).
        const hashes = n < e.blockHashes.length ? e.blockHashes.slice(0, n) : e.blockHashes;
        // Extra keys of a shape or label we do not know are read past, as unknown fields are.
        const tally = e.extraKeys || e.mmKeys ? newExtraKeyTally() : undefined;
        b.stored(worker, e.parentBlockHash, hashes, { tokenIds: e.tokenIds, extras: storedBlockExtras(e, n, tally) });
        if (tally && tally.unknown + tally.skipped > 0) this.metrics.unknownFields.inc(tally.unknown + tally.skipped);
        this.opts.regret?.stored(worker, hashes);
        return;
      }
      case "BlockRemoved": {
        if (!isGpuMedium(e.medium)) {
          this.metrics.eventsRejected.inc({ reason: "medium" });
          return;
        }
        // A secondary tier's removal (vLLM #52067) names its copy, not the engine's.
        if (e.ownership != null) {
          this.metrics.eventsIgnored.inc({ reason: "offload_tier" });
          return;
        }
        const group = this.rank(worker).groups.removed(e);
        if (group !== "index") {
          this.metrics.eventsIgnored.inc({ reason: group });
          return;
        }
        b.removed(worker, e.blockHashes);
        this.opts.regret?.removed(worker, e.blockHashes);
        return;
      }
      case "AllBlocksCleared":
        b.cleared(worker);
    }
  }
}

/** A store of one-token blocks into an index of larger ones (never adopted: see checkBlockSize). */
function oneTokenStream(e: BlockStored, ix: Indexer): boolean {
  return e.blockSize === 1 && ix.blockSize !== 1;
}
