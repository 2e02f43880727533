// How much the workers' caches lose to eviction, read from their KV events: the share of the blocks a
// worker rank stores that it had itself evicted a while before (a recompute a larger cache would have
// served). This is what a request routed away from its cached prefix costs beyond its own prefill:
// the prefix is computed again elsewhere and, where the caches are full, evicts blocks that will be
// asked for again. Where caches hold the working set it costs nothing and the share stays near 0.
//
// Evicted blocks are remembered in a direct-mapped table of fingerprints (a ghost list, as ARC keeps
// one): a block's slot and fingerprint come from its hash and its rank, a newer eviction overwrites an
// older one in the same slot, so memory is fixed (4 bytes a slot) and each block costs O(1) whatever a
// publisher sends. Written here: no library keeps a bounded ghost set over 64-bit hashes; a Map of
// bigints would cost ~60 bytes an entry and grow with every eviction.

import type { WorkerRef } from "@kv-epp/protocol";
import { workerKey } from "@kv-epp/protocol";

/** Slots of the ghost table: 2^20 (4 MiB), four times a 32k-block rank's cache over eight ranks. */
const GHOST_SLOTS = 1 << 20;
/** Weight of the newest stored block in the share: ~20k blocks of memory, a few dozen long prompts. */
const ALPHA = 1 / 20000;

/** One 64-bit hash at a time, read back as two 32-bit halves (little-endian: HALVES[0] is the low one). */
const WORD = new BigUint64Array(1);
const HALVES = new Uint32Array(WORD.buffer);

/** FNV-1a of a rank's key: a salt that keeps two ranks' copies of one block apart. */
function rankSalt(key: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < key.length; i++) h = Math.imul(h ^ key.charCodeAt(i), 0x01000193);
  return h >>> 0;
}

export class EvictionRegret {
  private readonly ghosts: Uint32Array;
  private readonly mask: number;
  private readonly salts = new Map<string, number>();
  private ewma = 0;
  private blocks = 0;
  /** place()'s answer, kept in fields rather than returned in an array (no allocation a block). */
  private slot = 0;
  private print = 0;

  constructor(slots = GHOST_SLOTS) {
    if (!(slots > 0) || (slots & (slots - 1)) !== 0) throw new RangeError("slots must be a power of two");
    this.ghosts = new Uint32Array(slots);
    this.mask = slots - 1;
  }

  /** The share of stored blocks that were recently evicted from the same rank (0..1, decayed). */
  get share(): number {
    return this.ewma;
  }

  /** Stored blocks seen since start. */
  get observed(): number {
    return this.blocks;
  }

  removed(worker: WorkerRef, hashes: readonly bigint[]): void {
    const salt = this.salt(worker);
    for (const h of hashes) {
      this.place(h, salt);
      this.ghosts[this.slot] = this.print;
    }
  }

  stored(worker: WorkerRef, hashes: readonly bigint[]): void {
    const salt = this.salt(worker);
    for (const h of hashes) {
      this.place(h, salt);
      const again = this.ghosts[this.slot] === this.print;
      // Resident again: a later eviction of it is a new one.
      if (again) this.ghosts[this.slot] = 0;
      this.ewma += ALPHA * ((again ? 1 : 0) - this.ewma);
      this.blocks++;
    }
  }

  /** The rank left: its salt goes (its ghosts age out as other evictions overwrite them). */
  forget(worker: WorkerRef): void {
    this.salts.delete(workerKey(worker));
  }

  private salt(worker: WorkerRef): number {
    const key = workerKey(worker);
    let s = this.salts.get(key);
    if (s === undefined) this.salts.set(key, (s = rankSalt(key)));
    return s;
  }

  /**
   * Sets `slot` and `print` (never 0, the empty slot) for the block. The hash's halves are read through a
   * typed array: BigInt shifts allocate, and every stored and removed block comes here (87 ns a block with
   * them, on the EPP's event loop).
   */
  private place(hash: bigint, salt: number): void {
    WORD[0] = hash;
    const lo = HALVES[0]! ^ salt;
    const hi = HALVES[1]!;
    this.slot = (Math.imul(lo ^ (hi >>> 7), 0x9e3779b1) >>> 0) & this.mask;
    this.print = (hi ^ Math.imul(lo, 0x85ebca6b)) >>> 0 || 1;
  }
}

/**
 * The regret at which the follower weight reaches its max: 2% of stored blocks recomputed after their
 * own rank evicted them. Over a bench:trace run it rises to 3.4% on the conversation trace (8 x 32768
 * blocks, 13k-token prompts, half the unbounded cache's hits lost to eviction) and stays under 0.5% on
 * the synthetic one (the caches hold its working set).
 */
export const REGRET_SATURATION = 0.02;

/** The follower weight's range: `base` with no regret, `max` from REGRET_SATURATION on. */
export type FollowerRange = { base: number; max: number };

/** A range from the two settings: a max below the base would fall as the caches lose more, so the base stands for both. */
export function followerRange(base: number, max: number): FollowerRange {
  return { base, max: Math.max(base, max) };
}

/**
 * The latency cost's follower weight, between `base` (caches that hold their working set: balance
 * matters more than keeping a prefix where it is) and `max` (caches that recompute what they evicted:
 * sending a prefix elsewhere costs the blocks it evicts there), in proportion to the eviction regret
 * up to `REGRET_SATURATION`. `max` equal to `base` is a fixed weight.
 */
export class FollowerWeight {
  constructor(
    readonly base: number,
    readonly max: number,
    private readonly regret?: EvictionRegret,
  ) {
    if (!(base >= 0) || !(max >= base)) throw new RangeError(`follower weights must satisfy 0 <= base (${base}) <= max (${max})`);
  }

  get value(): number {
    if (!this.regret || this.max === this.base) return this.base;
    return this.base + (this.max - this.base) * Math.min(1, this.regret.share / REGRET_SATURATION);
  }
}
