import type { ExtraKeyValue } from "@kv-epp/kv-events";
import { BASE_IDENTITY, chainBlockIds, noneHash, type BlockId, type RequestIdentity } from "./block-hash.ts";

/**
 * A simulated vLLM prefix cache for one rank: a fixed number of physical block slots, full prompt
 * blocks cached by their parent-chained block hash as the prefill reaches them (chunk by chunk, as
 * vLLM's scheduler allocates them), blocks referenced while a request runs,
 * unreferenced blocks kept until LRU eviction needs their slot. Every change is reported to
 * `onEvents`, in the order a consumer must apply it (removals of evicted blocks before the stores that
 * reuse their slots).
 *
 * Like vLLM's block pool it does not deduplicate: a block is looked up by hash (the first copy wins),
 * but a full block computed again is cached again, as a second physical copy under the same hash
 * (vLLM keeps block tables append-only, so it never swaps in an existing block). That happens every
 * time a prompt is sent again whose length is a multiple of the block size: vLLM recomputes at least
 * the last prompt token, so the last block is never a hit and is stored anew. Evicting a copy publishes
 * `BlockRemoved` for its hash even while another copy stays cached.
 *
 * A running request holds a slot for every block of its tokens (`allocate`, all or nothing, as vLLM's
 * allocate_slots): its full prompt blocks cached, its partial last block and its generated tokens'
 * blocks held uncached (the mock has no output token ids to name them by) and freed when it ends.
 * `acquire`, for a prompt computed in one go outside the engine, caches the leading blocks that fit
 * when the referenced ones leave too little room.
 */

export type CacheEvent =
  | {
      kind: "stored";
      parent: bigint | null;
      hashes: bigint[];
      tokenIds: number[];
      /** One entry per block: what vLLM publishes as extra_keys. */
      extraKeys: (ExtraKeyValue[] | null)[];
      loraName: string | null;
      loraId: number | null;
      /** The request's cache_salt, when it has one (SGLang publishes it on every store of a salted request). */
      cacheSalt?: string;
      /**
       * Where the run sits in its request: the index of its first block, the request's block hashes up
       * to the run's end, its tokens and what names its blocks (with `runContext`). KV groups with larger
       * blocks regroup from it (a group block may straddle earlier runs).
       */
      context?: { start: number; chain: readonly { hash: bigint }[]; tokens: Uint32Array; identity: RequestIdentity };
    }
  | { kind: "removed"; hashes: bigint[] }
  | { kind: "cleared" };

/** One physical block slot holding a cached block. */
type Block = { hash: bigint; parent: bigint | null; tokenIds: Uint32Array; extraKeys: ExtraKeyValue[] | null; refs: number; live: boolean };

/**
 * One resident block as the cache holds it (the ground truth tests compare an index with). `copies` is
 * how many physical copies of the block the rank holds (vLLM does not deduplicate).
 */
export type CachedBlock = { hash: bigint; parent: bigint | null; tokenIds: Uint32Array; extraKeys: ExtraKeyValue[] | null; copies: number };

/** The blocks a running request holds; hand it back to `release` when the request ends. */
export type Lease = {
  /** its prompt's leading blocks: the hit, then those cached as its prefill reached them */
  readonly blocks: Block[];
  /** blocks it holds uncached: its prompt's partial last block and its generated tokens' (allocate) */
  anonymous: number;
  released: boolean;
  /** what the blocks still to cache are named from, until the prompt's last full block is cached */
  rest?: { readonly ids: readonly BlockId[]; readonly tokens: Uint32Array; readonly id: AcquireIdentity };
  /** its lookup, counted in the prefix-cache stats once it is scheduled (a failed admission is not) */
  lookup?: { queried: number; hit: number };
  /** the cache's clear count when it was admitted: a lease from before a clear holds nothing now */
  readonly epoch: number;
};

export type Acquisition = {
  lease: Lease;
  /** Full blocks in the prompt. */
  promptBlocks: number;
  /** Leading prompt blocks that were already cached and reused. */
  hitBlocks: number;
  cachedTokens: number;
  /** Blocks this request added to the cache (may be fewer than promptBlocks - hitBlocks when full). */
  storedBlocks: number;
};

export type PrefixCacheOptions = {
  blockSize: number;
  capacityBlocks: number;
  onEvents?: (events: CacheEvent[]) => void;
  /** Stored events carry their `context` (for KV groups whose blocks are larger than the hash block). */
  runContext?: boolean;
  /** vLLM's PYTHONHASHSEED, or `random` (block-hash.ts, noneHash); absent: no seed. */
  hashSeed?: string;
};

/** An adapter's identity for a request: vLLM's lora_name (hashed) and lora_int_id (published as lora_id). */
export type AcquireIdentity = RequestIdentity & { loraId?: number | null };

export class PrefixCacheSim {
  readonly blockSize: number;
  readonly capacityBlocks: number;
  private readonly runContext: boolean;
  private readonly hashSeed: string | undefined;
  /** The root block's parent (vLLM's NONE_HASH); redrawn by a restart when the seed is `random`. */
  private noneHash: Uint8Array | null;
  /** Cached copies by block hash, oldest first (lookups take the first, as vLLM's does). */
  private readonly blocks = new Map<bigint, Block[]>();
  /** Unreferenced resident blocks; Set order is LRU order (first = evicted first). */
  private readonly free = new Set<Block>();
  /** slots in use: cached blocks (copies counted) and running requests' uncached ones */
  private physical = 0;
  private epoch = 0;
  private listeners: ((events: CacheEvent[]) => void)[] = [];
  /** Prompt tokens looked up, and tokens found cached (vLLM's prefix_cache_queries / hits). */
  queriedTokens = 0;
  hitTokens = 0;

  constructor(opts: PrefixCacheOptions) {
    if (!(opts.blockSize > 0) || !(opts.capacityBlocks > 0)) throw new RangeError("blockSize and capacityBlocks must be positive");
    this.blockSize = opts.blockSize;
    this.capacityBlocks = opts.capacityBlocks;
    this.runContext = opts.runContext ?? false;
    this.hashSeed = opts.hashSeed;
    this.noneHash = opts.hashSeed !== undefined ? noneHash(opts.hashSeed) : null;
    if (opts.onEvents) this.listeners.push(opts.onEvents);
  }

  /** Adds a listener for cache changes; returns a function that removes it. */
  subscribe(listener: (events: CacheEvent[]) => void): () => void {
    this.listeners.push(listener);
    return () => {
      this.listeners = this.listeners.filter((l) => l !== listener);
    };
  }

  /** Physical blocks in use (cached copies counted, and the running requests' uncached blocks). */
  get usedBlocks(): number {
    return this.physical;
  }

  /**
   * vLLM's kv_cache_usage_perc (its block pool's get_usage: 1 - free / total, 0..1), where free blocks
   * include the cached ones no running request references: the share of slots that running requests
   * hold, not the share holding a block (a warm cache is full of evictable blocks and reads low here).
   */
  get usage(): number {
    return (this.physical - this.free.size) / this.capacityBlocks;
  }

  /** Resident block hashes, for tests and dumps. */
  residentHashes(): Set<bigint> {
    return new Set(this.blocks.keys());
  }

  /** Copies per resident hash: the ground truth a consumer's copy counts must equal. */
  copies(): Map<bigint, number> {
    return new Map([...this.blocks].map(([h, list]) => [h, list.length]));
  }

  /**
   * Every resident block with its parent, tokens, extra keys and copy count, a resident parent before
   * its children (a child can outlive its parent: vLLM evicts copies, not subtrees).
   */
  snapshot(): CachedBlock[] {
    const out: CachedBlock[] = [];
    const done = new Set<bigint>();
    for (const hash of this.blocks.keys()) {
      // Walk up to the first ancestor not listed yet, then list the chain top-down.
      const chain: bigint[] = [];
      for (let h: bigint | null = hash; h !== null && !done.has(h) && this.blocks.has(h); h = this.blocks.get(h)![0]!.parent) chain.push(h);
      for (let i = chain.length - 1; i >= 0; i--) {
        const list = this.blocks.get(chain[i]!)!;
        const b = list[0]!;
        done.add(b.hash);
        out.push({ hash: b.hash, parent: b.parent, tokenIds: b.tokenIds, extraKeys: b.extraKeys, copies: list.length });
      }
    }
    return out;
  }

  /**
   * Leading blocks of this prompt that are resident, without touching LRU order or counters: what a
   * router's index should report for it (a hit walk stops at the first block not cached).
   */
  peekHitBlocks(tokens: Uint32Array, id: RequestIdentity = BASE_IDENTITY): number {
    const ids = this.blockIds(tokens, id);
    let hit = 0;
    while (hit < ids.length && this.blocks.has(ids[hit]!.hash)) hit++;
    return hit;
  }

  /** The ids this cache gives the prompt's full blocks (its NONE_HASH included). */
  blockIds(tokens: Uint32Array, id: RequestIdentity = BASE_IDENTITY): BlockId[] {
    return chainBlockIds(tokens, this.blockSize, id, this.noneHash);
  }

  /**
   * Admits a prompt computed in one go: its cached prefix referenced and every remaining full block
   * cached at once (`admit`, then `computeTo` the whole prompt).
   */
  acquire(tokens: Uint32Array, id: AcquireIdentity = BASE_IDENTITY): Acquisition {
    const acq = this.admit(tokens, id);
    this.count(acq.lease);
    const events: CacheEvent[] = [];
    const stored = this.computeTo(acq.lease, tokens.length, events);
    this.emit(events);
    return { ...acq, storedBlocks: stored };
  }

  /**
   * Admits a prompt as vLLM's scheduler does: references its cached prefix (the hit stops before the
   * prompt's last token) and caches nothing else yet. Its other blocks are cached as its prefill
   * reaches them (`allocate`, once per scheduled step). An admission that does not fit is handed back
   * with `release` before its first allocation, and its lookup is not counted.
   */
  admit(tokens: Uint32Array, id: AcquireIdentity = BASE_IDENTITY): Acquisition {
    const ids = this.blockIds(tokens, id);
    const held: Block[] = [];
    // vLLM computes at least the last prompt token, so a hit never covers the whole prompt.
    const maxHit = Math.min(ids.length, tokens.length > 0 ? Math.floor((tokens.length - 1) / this.blockSize) : 0);
    let hit = 0;
    for (; hit < maxHit; hit++) {
      const block = this.blocks.get(ids[hit]!.hash)?.[0];
      if (!block) break;
      this.ref(block);
      held.push(block);
    }
    return {
      lease: {
        blocks: held, anonymous: 0, released: false, rest: hit < ids.length ? { ids, tokens, id } : undefined,
        lookup: { queried: tokens.length, hit: hit * this.blockSize }, epoch: this.epoch,
      },
      promptBlocks: ids.length,
      hitBlocks: hit,
      cachedTokens: hit * this.blockSize,
      storedBlocks: 0,
    };
  }

  /**
   * Reserves the blocks a running request needs to hold `tokens` tokens of KV once the step being
   * scheduled has run (vLLM's allocate_slots): one slot per block of tokens, the full prompt blocks
   * among them cached (`computeTo`), the rest (the prompt's partial last block, generated tokens) held
   * uncached. All or nothing: false, and nothing changes, when the blocks no running request references
   * cannot make room; vLLM then preempts a running request, or leaves a waiting one waiting. A lease
   * from before a clear holds nothing in the cleared cache and is let run.
   */
  allocate(lease: Lease, tokens: number): boolean {
    if (lease.released) return false;
    if (lease.epoch !== this.epoch) return true;
    const total = Math.ceil(tokens / this.blockSize);
    const need = total - lease.blocks.length - lease.anonymous;
    if (need > this.capacityBlocks - (this.physical - this.free.size)) return false;
    this.count(lease);
    if (need <= 0) return true;
    // The step's new slots at once, as vLLM's block pool hands them out: evictions, then the stores.
    const events: CacheEvent[] = [];
    const evicted = this.evictFor(need);
    if (evicted.length > 0) events.push({ kind: "removed", hashes: evicted });
    this.computeTo(lease, tokens, events);
    // What computeTo did not cache (the partial last block, generated tokens) is held uncached.
    const uncached = total - lease.blocks.length - lease.anonymous;
    lease.anonymous += Math.max(0, uncached);
    this.physical += Math.max(0, uncached);
    this.emit(events);
    return true;
  }

  /** The lease's lookup enters vLLM's prefix_cache_queries / hits, once. */
  private count(lease: Lease): void {
    if (!lease.lookup) return;
    this.queriedTokens += lease.lookup.queried;
    this.hitTokens += lease.lookup.hit;
    lease.lookup = undefined;
  }

  /**
   * The request's prefill has been scheduled up to `computedTokens` of its prompt: caches the full
   * blocks that brings (vLLM's allocate_slots caches up to computed + scheduled tokens when it
   * schedules a chunk, before the step runs, so a request admitted later in the same step already hits
   * them). Returns the blocks cached. When the cache cannot make room for all of them, the leading
   * ones that fit are cached and the rest of the prompt is not; nor is it once a clear dropped the
   * blocks it would chain to.
   */
  private computeTo(lease: Lease, computedTokens: number, events: CacheEvent[]): number {
    const rest = lease.rest;
    if (!rest || lease.released) return 0;
    const { ids, tokens, id } = rest;
    const start = lease.blocks.length;
    const end = Math.min(ids.length, Math.floor(computedTokens / this.blockSize));
    if (end <= start) return 0;
    if (start > 0 && !lease.blocks[start - 1]!.live) {
      lease.rest = undefined;
      return 0;
    }
    const want = end - start;
    const evicted = this.evictFor(want);
    if (evicted.length > 0) events.push({ kind: "removed", hashes: evicted });
    const room = Math.max(0, Math.min(want, this.capacityBlocks - this.physical));
    if (room > 0) {
      const fresh = ids.slice(start, start + room);
      for (let i = 0; i < fresh.length; i++) {
        const bid = fresh[i]!, b = start + i;
        const block: Block = {
          hash: bid.hash, parent: b > 0 ? ids[b - 1]!.hash : null, tokenIds: tokens.slice(b * this.blockSize, (b + 1) * this.blockSize),
          extraKeys: bid.extraKeys, refs: 1, live: true,
        };
        const list = this.blocks.get(bid.hash);
        if (list) list.push(block); // a second copy: not deduplicated
        else this.blocks.set(bid.hash, [block]);
        this.physical++;
        lease.blocks.push(block);
      }
      events.push({
        kind: "stored",
        parent: start > 0 ? ids[start - 1]!.hash : null,
        hashes: fresh.map((b) => b.hash),
        tokenIds: Array.from(tokens.subarray(start * this.blockSize, (start + room) * this.blockSize)),
        extraKeys: fresh.map((b) => b.extraKeys),
        loraName: id.loraName ?? null,
        loraId: id.loraName ? (id.loraId ?? null) : null,
        ...(id.cacheSalt != null ? { cacheSalt: id.cacheSalt } : {}),
        ...(this.runContext ? { context: { start, chain: ids.slice(0, start + room), tokens, identity: id } } : {}),
      });
    }
    // Done with the prompt (or out of room): the lease stops holding its tokens.
    if (room < want || start + room === ids.length) lease.rest = undefined;
    return room;
  }

  /** Ends a request: its blocks stay cached but become evictable, the prompt's tail first (as vLLM frees them). */
  release(lease: Lease): void {
    if (lease.released) return;
    lease.released = true;
    lease.rest = undefined;
    lease.lookup = undefined;
    if (lease.epoch === this.epoch) this.physical -= lease.anonymous;
    lease.anonymous = 0;
    for (let i = lease.blocks.length - 1; i >= 0; i--) {
      const block = lease.blocks[i]!;
      // A block dropped by a clear while the request ran is no longer ours to track.
      if (!block.live) continue;
      block.refs--;
      if (block.refs === 0) this.free.add(block);
    }
  }

  /**
   * Drops every block (POST /reset_prefix_cache). `silent` models a restart: nothing is published, and
   * an unseeded vLLM's new process draws a new NONE_HASH.
   */
  clear(opts: { silent?: boolean } = {}): void {
    for (const list of this.blocks.values()) for (const b of list) b.live = false;
    this.blocks.clear();
    this.free.clear();
    this.physical = 0;
    this.epoch++;
    if (opts.silent && this.hashSeed === "random") this.noneHash = noneHash(this.hashSeed);
    if (!opts.silent) this.emit([{ kind: "cleared" }]);
  }

  private ref(block: Block): void {
    if (block.refs === 0) this.free.delete(block);
    block.refs++;
  }

  /** Evicts least recently used unreferenced blocks until `want` new blocks fit (or nothing is evictable). */
  private evictFor(want: number): bigint[] {
    const evicted: bigint[] = [];
    let excess = this.physical + want - this.capacityBlocks;
    for (const block of this.free) {
      if (excess <= 0) break;
      this.free.delete(block);
      const list = this.blocks.get(block.hash)!;
      list.splice(list.indexOf(block), 1);
      if (list.length === 0) this.blocks.delete(block.hash);
      block.live = false;
      this.physical--;
      evicted.push(block.hash);
      excess--;
    }
    return evicted;
  }

  private emit(events: CacheEvent[]): void {
    if (events.length === 0) return;
    for (const l of this.listeners) l(events);
  }
}
