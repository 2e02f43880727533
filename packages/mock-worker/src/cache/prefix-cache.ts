import { chainBlockIds } from "./block-hash.ts";

/**
 * A simulated vLLM prefix cache for one rank: a fixed number of block slots, full prompt blocks cached
 * by their parent-chained external hash, blocks referenced while a request runs, unreferenced blocks
 * kept until LRU eviction needs their slot. Every change is reported to `onEvents`, in the order a
 * consumer must apply it (removals of evicted blocks before the stores that reuse their slots).
 *
 * Simplifications against vLLM, on purpose: only full prompt blocks occupy slots (decode blocks and the
 * partial tail are not modelled), and a request that needs more new blocks than can be freed caches
 * only the leading blocks that fit instead of waiting for space.
 */

export type CacheEvent =
  | { kind: "stored"; parent: bigint | null; hashes: bigint[]; tokenIds: number[] }
  | { kind: "removed"; hashes: bigint[] }
  | { kind: "cleared" };

type Block = { hash: bigint; parent: bigint | null; tokenIds: Uint32Array; refs: number };

/**
 * One resident block as the cache holds it (the ground truth tests compare an index with). `copies` is
 * how many copies of the block the rank holds: prefix caching deduplicates, so one.
 */
export type CachedBlock = { hash: bigint; parent: bigint | null; tokenIds: Uint32Array; copies: number };

/** The blocks a running request holds; hand it back to `release` when the request ends. */
export type Lease = { readonly blocks: readonly Block[]; released: boolean };

export type Acquisition = {
  lease: Lease;
  /** Full blocks in the prompt. */
  promptBlocks: number;
  /** Leading prompt blocks that were already cached. */
  hitBlocks: number;
  cachedTokens: number;
  /** Blocks this request added to the cache (may be fewer than promptBlocks - hitBlocks when full). */
  storedBlocks: number;
};

export type PrefixCacheOptions = {
  blockSize: number;
  capacityBlocks: number;
  onEvents?: (events: CacheEvent[]) => void;
};

export class PrefixCacheSim {
  readonly blockSize: number;
  readonly capacityBlocks: number;
  /** Every resident block by external hash. */
  private readonly blocks = new Map<bigint, Block>();
  /** Unreferenced resident blocks; Map order is LRU order (first = evicted first). */
  private readonly free = new Map<bigint, Block>();
  private listeners: ((events: CacheEvent[]) => void)[] = [];
  /** Prompt tokens looked up, and tokens found cached (vLLM's prefix_cache_queries / hits). */
  queriedTokens = 0;
  hitTokens = 0;

  constructor(opts: PrefixCacheOptions) {
    if (!(opts.blockSize > 0) || !(opts.capacityBlocks > 0)) throw new RangeError("blockSize and capacityBlocks must be positive");
    this.blockSize = opts.blockSize;
    this.capacityBlocks = opts.capacityBlocks;
    if (opts.onEvents) this.listeners.push(opts.onEvents);
  }

  /** Adds a listener for cache changes; returns a function that removes it. */
  subscribe(listener: (events: CacheEvent[]) => void): () => void {
    this.listeners.push(listener);
    return () => {
      this.listeners = this.listeners.filter((l) => l !== listener);
    };
  }

  get usedBlocks(): number {
    return this.blocks.size;
  }

  /** Fraction of slots holding a block, 0..1 (vLLM's kv_cache_usage_perc is a fraction too). */
  get usage(): number {
    return this.blocks.size / this.capacityBlocks;
  }

  /** Resident block hashes, for tests and dumps. */
  residentHashes(): Set<bigint> {
    return new Set(this.blocks.keys());
  }

  /** Every resident block with its parent, tokens and copy count, parents before children. */
  snapshot(): CachedBlock[] {
    // Map order is insertion order, and a block is only ever stored after its parent (a chain is
    // cached from its first uncached block on) and evicted before it (tail first).
    return [...this.blocks.values()].map((b) => ({ hash: b.hash, parent: b.parent, tokenIds: b.tokenIds, copies: 1 }));
  }

  /** Leading cached blocks for these tokens, without touching LRU order or counters. */
  peekHitBlocks(tokens: Uint32Array): number {
    const ids = chainBlockIds(tokens, this.blockSize);
    let hit = 0;
    while (hit < ids.length && this.blocks.has(ids[hit]!.hash)) hit++;
    return hit;
  }

  /** Admits a prompt: references its cached prefix and caches its remaining full blocks. */
  acquire(tokens: Uint32Array): Acquisition {
    const ids = chainBlockIds(tokens, this.blockSize);
    const held: Block[] = [];
    let hit = 0;
    for (; hit < ids.length; hit++) {
      const block = this.blocks.get(ids[hit]!.hash);
      if (!block) break;
      this.ref(block);
      held.push(block);
    }
    this.queriedTokens += tokens.length;
    this.hitTokens += hit * this.blockSize;

    const events: CacheEvent[] = [];
    const want = ids.length - hit;
    const evicted = this.evictFor(want);
    if (evicted.length > 0) events.push({ kind: "removed", hashes: evicted });
    const room = Math.min(want, this.capacityBlocks - this.blocks.size);
    if (room > 0) {
      const fresh = ids.slice(hit, hit + room);
      for (let i = 0; i < fresh.length; i++) {
        const b = hit + i;
        const block: Block = {
          hash: fresh[i]!.hash, parent: b > 0 ? ids[b - 1]!.hash : null, refs: 1,
          tokenIds: tokens.slice(b * this.blockSize, (b + 1) * this.blockSize),
        };
        this.blocks.set(block.hash, block);
        held.push(block);
      }
      events.push({
        kind: "stored",
        parent: hit > 0 ? ids[hit - 1]!.hash : null,
        hashes: fresh.map((id) => id.hash),
        tokenIds: Array.from(tokens.subarray(hit * this.blockSize, (hit + room) * this.blockSize)),
      });
    }
    this.emit(events);
    return {
      lease: { blocks: held, released: false },
      promptBlocks: ids.length,
      hitBlocks: hit,
      cachedTokens: hit * this.blockSize,
      storedBlocks: Math.max(room, 0),
    };
  }

  /** Ends a request: its blocks stay cached but become evictable, the prompt's tail first (as vLLM frees them). */
  release(lease: Lease): void {
    if (lease.released) return;
    lease.released = true;
    for (let i = lease.blocks.length - 1; i >= 0; i--) {
      const block = lease.blocks[i]!;
      // A block dropped by a clear while the request ran is no longer ours to track.
      if (this.blocks.get(block.hash) !== block) continue;
      block.refs--;
      if (block.refs === 0) this.free.set(block.hash, block);
    }
  }

  /** Drops every block (POST /reset_prefix_cache). `silent` models a restart: nothing is published. */
  clear(opts: { silent?: boolean } = {}): void {
    this.blocks.clear();
    this.free.clear();
    if (!opts.silent) this.emit([{ kind: "cleared" }]);
  }

  private ref(block: Block): void {
    if (block.refs === 0) this.free.delete(block.hash);
    block.refs++;
  }

  /** Evicts least recently used unreferenced blocks until `want` new blocks fit (or nothing is evictable). */
  private evictFor(want: number): bigint[] {
    const evicted: bigint[] = [];
    let excess = this.blocks.size + want - this.capacityBlocks;
    for (const [hash] of this.free) {
      if (excess <= 0) break;
      this.free.delete(hash);
      this.blocks.delete(hash);
      evicted.push(hash);
      excess--;
    }
    return evicted;
  }

  private emit(events: CacheEvent[]): void {
    if (events.length === 0) return;
    for (const l of this.listeners) l(events);
  }
}
