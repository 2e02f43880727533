// In-flight prefixes: per worker rank, the blocks of requests routed there and not yet ended. A worker
// publishes a request's blocks as KV events only once it has computed them, so for the request's
// queueing and prefill (plus the events' lag) the index does not know them: a sibling or follow-up
// that arrives then sees no overlap and is balanced elsewhere. The picker takes, per candidate, the
// longer of the index's overlap and the leading blocks pending there. An entry leaves when its
// request ends (its lease is released: from then on the index is the truth), when it is older than
// the TTL, or, oldest first, when the total would pass the block cap: memory stays bounded whatever
// clients send.

/**
 * A request's blocks as prefix keys: key i names blocks 0..i together with the request's identity
 * (the model's index, and through the local hashes its LoRA adapter and cache_salt). Local hashes name
 * one block's tokens only; chaining them is what makes "the same leading blocks" one map lookup per
 * block.
 */
export type PrefixKeys = Float64Array;

/**
 * Chains `hashes` (the index's local block hashes of the request) into prefix keys, seeded by `scope`
 * (the model's index key). Two 32-bit multiply-xor lanes folded to 53 bits, so keys are plain numbers
 * (bigint arithmetic allocates per block); a collision only ever lends a candidate overlap it lacks.
 */
export function prefixKeys(scope: string, hashes: BigUint64Array, maxBlocks = hashes.length): PrefixKeys {
  const n = Math.min(hashes.length, maxBlocks);
  const out = new Float64Array(n);
  if (n === 0) return out;
  let a = 0x9e3779b9;
  let b = 0x85ebca6b;
  for (let i = 0; i < scope.length; i++) {
    a = Math.imul(a ^ scope.charCodeAt(i), 0x01000193);
    b = Math.imul(b + scope.charCodeAt(i), 0xcc9e2d51) ^ (a >>> 15);
  }
  // The hashes' u32 halves, read in place.
  const halves = new Uint32Array(hashes.buffer, hashes.byteOffset, n * 2);
  for (let i = 0; i < n; i++) {
    a = Math.imul(a ^ halves[2 * i]!, 0x85ebca6b);
    a ^= a >>> 13;
    b = Math.imul(b ^ halves[2 * i + 1]!, 0xc2b2ae35) ^ (a >>> 16);
    b ^= b >>> 15;
    out[i] = (a >>> 0) * 0x200000 + ((b >>> 0) & 0x1fffff);
  }
  return out;
}

/** What the picker reads: the leading pending blocks per worker key. */
export interface PendingView {
  /** Fills `out` (cleared first) with each worker key's longest pending prefix of `keys` (only those with >= 1). */
  overlapsInto(keys: PrefixKeys, out: Map<string, number>): void;
}

export type PendingOptions = {
  /** Most prefix keys held over all entries; the oldest entries leave first past it (> 0). */
  maxBlocks: number;
  /** An entry older than this leaves even if its request never ended (a lease never released). */
  ttlMs: number;
  now?: () => number;
};

export const DEFAULT_PENDING: Omit<PendingOptions, "now"> = { maxBlocks: 1 << 20, ttlMs: 600_000 };

type Entry = { readonly workerKey: string; readonly keys: PrefixKeys; readonly at: number };

/** Why entries left other than their request's end. */
export type PendingDrops = { expired: number; evicted: number };

export class PendingPrefixes implements PendingView {
  /** prefix key -> worker key -> pending requests holding that prefix there. */
  private readonly holders = new Map<number, Map<string, number>>();
  /** By id, in insertion order: the oldest first (expiry and eviction take from the front). */
  private readonly entries = new Map<number, Entry>();
  private nextId = 1;
  private held = 0;
  readonly drops: PendingDrops = { expired: 0, evicted: 0 };
  private readonly now: () => number;

  constructor(private readonly opts: PendingOptions) {
    if (!(opts.maxBlocks > 0)) throw new RangeError(`maxBlocks must be > 0, got ${opts.maxBlocks}`);
    this.now = opts.now ?? (() => performance.now());
  }

  /** Records `keys` as pending on `workerKey` (a prefix longer than the cap keeps its first maxBlocks); returns the entry's id. */
  add(workerKey: string, keys: PrefixKeys): number {
    const now = this.now();
    this.expire(now);
    const kept = keys.length > this.opts.maxBlocks ? keys.subarray(0, this.opts.maxBlocks) : keys;
    for (const [id, e] of this.entries) {
      if (this.held + kept.length <= this.opts.maxBlocks) break;
      this.drop(id, e);
      this.drops.evicted++;
    }
    const id = this.nextId++;
    this.entries.set(id, { workerKey, keys: kept, at: now });
    this.held += kept.length;
    for (let i = 0; i < kept.length; i++) {
      const k = kept[i]!;
      let h = this.holders.get(k);
      if (!h) this.holders.set(k, (h = new Map()));
      h.set(workerKey, (h.get(workerKey) ?? 0) + 1);
    }
    return id;
  }

  /** The entry's request ended (idempotent; false when it had already left). */
  remove(id: number): boolean {
    const e = this.entries.get(id);
    if (!e) return false;
    this.drop(id, e);
    return true;
  }

  overlapsInto(keys: PrefixKeys, out: Map<string, number>): void {
    out.clear();
    this.expire(this.now());
    // Every entry holds all its prefixes, so a worker holding key i holds keys 0..i: walk until no
    // worker holds the next one.
    for (let i = 0; i < keys.length; i++) {
      const h = this.holders.get(keys[i]!);
      if (!h) return;
      for (const w of h.keys()) out.set(w, i + 1);
    }
  }

  /** Entries held (requests). */
  get size(): number {
    return this.entries.size;
  }

  /** Prefix keys held over all entries (bounded by maxBlocks). */
  get blocks(): number {
    return this.held;
  }

  private expire(now: number): void {
    for (const [id, e] of this.entries) {
      if (now - e.at < this.opts.ttlMs) return;
      this.drop(id, e);
      this.drops.expired++;
    }
  }

  private drop(id: number, e: Entry): void {
    this.entries.delete(id);
    this.held -= e.keys.length;
    for (let i = 0; i < e.keys.length; i++) {
      const k = e.keys[i]!;
      const h = this.holders.get(k);
      if (!h) continue;
      const c = (h.get(e.workerKey) ?? 0) - 1;
      if (c > 0) h.set(e.workerKey, c);
      else {
        h.delete(e.workerKey);
        if (h.size === 0) this.holders.delete(k);
      }
    }
  }
}
