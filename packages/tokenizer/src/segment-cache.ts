import type { CacheOptions, CacheStats } from "./types";

// Rough per-entry cost beyond the key and the ids (Map slot, typed-array header), so that many tiny segments
// ("\n", "user\n") are still accounted for.
const ENTRY_OVERHEAD_BYTES = 96;
export const DEFAULT_CACHE_MAX_BYTES = 64 * 1024 * 1024;

/**
 * LRU of segment text → token ids, bounded by entries and by bytes (UTF-16 key + ids + overhead).
 * A Map keeps insertion order, so re-inserting on a hit makes the first key the least recently used.
 */
export class SegmentCache {
  private readonly map = new Map<string, Uint32Array>();
  private readonly maxEntries: number;
  private readonly maxBytes: number;
  private bytesUsed = 0;
  hits = 0;
  misses = 0;
  evictions = 0;
  /** Tokens tokenized because their section was not cached (the fresh work), counted by the segmenter. */
  freshTokens = 0;
  /** Tokens of hits on entries a background warm set and nothing had used since (see EncodeControl.warm). */
  warmedHitTokens = 0;
  /** Keys set by a warm and not yet hit by a tokenization someone waits for. */
  private readonly warmed = new Set<string>();

  constructor(opts: CacheOptions = {}) {
    this.maxEntries = opts.maxEntries ?? Number.POSITIVE_INFINITY;
    this.maxBytes = opts.maxBytes ?? DEFAULT_CACHE_MAX_BYTES;
  }

  /** `warming`: the caller is a background warm (a hit on a warmed entry then leaves it marked). */
  get(key: string, warming = false): Uint32Array | undefined {
    const ids = this.map.get(key);
    if (ids === undefined) {
      this.misses++;
      return undefined;
    }
    this.hits++;
    if (!warming && this.warmed.size > 0 && this.warmed.delete(key)) this.warmedHitTokens += ids.length;
    this.map.delete(key);
    this.map.set(key, ids);
    return ids;
  }

  set(key: string, ids: Uint32Array, warming = false): void {
    const cost = entryCost(key, ids);
    if (cost > this.maxBytes || this.maxEntries < 1) return; // would evict everything and still not fit
    const old = this.map.get(key);
    if (old !== undefined) {
      this.map.delete(key);
      this.bytesUsed -= entryCost(key, old);
    }
    const own = detach(key);
    this.map.set(own, ids);
    if (warming) this.warmed.add(own);
    else this.warmed.delete(key);
    this.bytesUsed += cost;
    while (this.bytesUsed > this.maxBytes || this.map.size > this.maxEntries) {
      const [oldestKey, oldestIds] = this.map.entries().next().value as [string, Uint32Array];
      this.map.delete(oldestKey);
      this.warmed.delete(oldestKey);
      this.bytesUsed -= entryCost(oldestKey, oldestIds);
      this.evictions++;
    }
  }

  /** Empty, and every counter back to zero. */
  clear(): void {
    this.map.clear();
    this.warmed.clear();
    this.bytesUsed = 0;
    this.hits = this.misses = this.evictions = this.freshTokens = this.warmedHitTokens = 0;
  }

  stats(): CacheStats {
    return {
      hits: this.hits, misses: this.misses, entries: this.map.size, bytes: this.bytesUsed, evictions: this.evictions, freshTokens: this.freshTokens,
      warmedHitTokens: this.warmedHitTokens,
    };
  }
}

function entryCost(key: string, ids: Uint32Array): number {
  return key.length * 2 + ids.byteLength + ENTRY_OVERHEAD_BYTES;
}

// A key is usually a slice of a whole rendered conversation, and JavaScriptCore lets a slice share (and so keep
// alive) the buffer of the string it came from: measured, 2000 cached 3 KB slices of 200 KB strings held 860 MB.
// That would hold every rendered conversation that contributed a section, far beyond what the byte bound counts,
// so a key is copied into a buffer of its own (only on a miss). Padding the key by one character makes a new
// string whose slice shares only that string's buffer (one character longer than the key): ~0.5 µs for a 2 KB key.
// Measured against the ways tried before (bench:tokenize, the demo's chats): reading a character of the rope
// `key + "\0"` flattened it one character at a time, ~10 µs a key (1.74 ms a request against 1.32 now, at the
// default bound); a UTF-16 round trip through a Buffer copied three times.
function detach(key: string): string {
  return key.padEnd(key.length + 1).slice(0, -1);
}
