// In-flight prefixes: per worker rank, the blocks of requests routed there and not yet ended. A worker
// publishes a request's blocks as KV events only once its scheduler admits it (vLLM caches, and
// announces, a request's full blocks in allocate_slots, before the forward pass), so while the request
// waits for a slot (plus the events' lag) the index does not know them: a sibling or follow-up that
// arrives then sees no overlap and is balanced elsewhere. The picker takes, per candidate, the
// longer of the index's overlap and the leading blocks pending there. An entry leaves when its
// request ends (its lease is released: from then on the index is the truth), when it is older than
// the TTL, or, oldest first, when the total would pass the block cap: memory stays bounded whatever
// clients send.
import { PrefixTree, type PrefixEntry } from "./prefix-tree.ts";

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

/**
 * Several views read as one: per worker, the longest pending prefix in any of them (this replica's own
 * requests and, kept apart under their own bounds, its peers'). Absent views are left out: one view
 * is itself, none is undefined (in-flight prefixes off).
 */
export function combinedPending(maybe: readonly (PendingView | undefined)[]): PendingView | undefined {
  const views = maybe.filter((v): v is PendingView => v !== undefined);
  if (views.length <= 1) return views[0];
  const part = new Map<string, number>();
  return {
    overlapsInto(keys, out) {
      views[0]!.overlapsInto(keys, out);
      for (let i = 1; i < views.length; i++) {
        views[i]!.overlapsInto(keys, part);
        for (const [w, n] of part) if (n > (out.get(w) ?? 0)) out.set(w, n);
      }
    },
  };
}

export type PendingOptions = {
  /** Most prefix keys held over all entries; the oldest entries leave first past it (> 0). */
  maxBlocks: number;
  /** Most entries (requests) held, likewise: each costs its bookkeeping, however few keys it has. */
  maxEntries: number;
  /** An entry older than this leaves even if its request never ended (a lease never released). */
  ttlMs: number;
  now?: () => number;
};

export const DEFAULT_PENDING: Omit<PendingOptions, "now"> = { maxBlocks: 1 << 20, maxEntries: 16_384, ttlMs: 600_000 };

/**
 * On by default: bench:trace measured no change beyond seed noise on either trace as it arrives, and a
 * win on both when requests arrive together (packages/trace-replay/README.md "In-flight prefixes").
 */
export const INFLIGHT_PREFIX_DEFAULT = true;

/** `tree`: where its keys are matched (none for an entry without keys, which matches nothing). */
type Entry = { readonly keys: PrefixKeys; readonly at: number; readonly tree: PrefixEntry | undefined };

/** Why entries left other than their request's end. */
export type PendingDrops = { expired: number; evicted: number };

export class PendingPrefixes implements PendingView {
  /** By id, in insertion order: the oldest first (expiry and eviction take from the front). */
  private readonly entries = new Map<number, Entry>();
  /** The entries' keys, matched per worker at the cost of the query's path, not of the entries (prefix-tree.ts). */
  private readonly tree = new PrefixTree();
  private nextId = 1;
  private held = 0;
  readonly drops: PendingDrops = { expired: 0, evicted: 0 };
  private readonly now: () => number;

  constructor(private readonly opts: PendingOptions) {
    if (!(opts.maxBlocks > 0)) throw new RangeError(`maxBlocks must be > 0, got ${opts.maxBlocks}`);
    if (!(opts.maxEntries > 0)) throw new RangeError(`maxEntries must be > 0, got ${opts.maxEntries}`);
    this.now = opts.now ?? (() => performance.now());
  }

  /** Records `keys` as pending on `workerKey` (a prefix longer than the cap keeps its first maxBlocks); returns the entry's id. */
  add(workerKey: string, keys: PrefixKeys): number {
    const now = this.now();
    this.expire(now);
    const kept = keys.length > this.opts.maxBlocks ? keys.subarray(0, this.opts.maxBlocks) : keys;
    for (const [id, e] of this.entries) {
      if (this.held + kept.length <= this.opts.maxBlocks && this.entries.size < this.opts.maxEntries) break;
      this.drop(id, e);
      this.drops.evicted++;
    }
    const id = this.nextId++;
    const e: Entry = { keys: kept, at: now, tree: kept.length > 0 ? this.tree.add(workerKey, kept) : undefined };
    this.entries.set(id, e);
    this.held += kept.length;
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
    this.tree.longestInto(keys, out);
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
    if (e.tree) this.tree.remove(e.tree);
  }
}
