import { FNV_OFFSET, hashRange } from "./fnv";
import { sharedCopy } from "./shared-arrays";

/**
 * Pre-token -> ids, bounded in bytes, keyed by a range of the text being encoded so that a lookup allocates
 * nothing (a Map<string, ...> needs a substring per pre-token, and its garbage, on every word of fresh text).
 * Two generations of fixed-size typed arrays: words go into the young one; when it is full the old one is
 * dropped and the young one becomes old; a word found in the old one is copied into the young one. So the
 * words used since the last turnover stay, memory is fixed at construction (`maxBytes`), and each lookup or
 * insertion costs the word's length (plus, once per turnover, clearing a table the size of the generation).
 * The words come from request text, which anyone may write: each lookup and insertion examines at most
 * `PROBES` slots, so words made to share a hash cost a re-tokenization each, not a walk through all the others.
 */
export class WordCache {
  private young: TextTable;
  private old: TextTable;
  /** The largest word (UTF-16 units) kept. */
  readonly maxWordLength: number;
  hits = 0;
  misses = 0;
  turnovers = 0;
  /** Insertions dropped because the `PROBES` slots from the word's home slot were all taken. */
  skipped = 0;

  constructor(maxBytes: number, maxWordLength = 256) {
    const entries = Math.max(1, Math.floor(maxBytes / 2 / BYTES_PER_ENTRY));
    this.young = new TextTable(entries, entries * 8, entries * 3, PROBES);
    this.old = new TextTable(entries, entries * 8, entries * 3, PROBES);
    this.maxWordLength = Math.min(maxWordLength, this.young.keyCapacity >> 2);
  }

  /**
   * Copies the cached ids of text[start, end) (`hash` its `textHash`) into `out` at `at` (which must have room for
   * `maxWordLength` ids), and returns how many; -1 when the word is not cached.
   */
  get(text: string, start: number, end: number, hash: number, out: Uint32Array, at: number): number {
    const young = this.young;
    let e = young.find(text, start, end, hash);
    if (e >= 0) {
      this.hits++;
      return young.copyIds(e, out, at);
    }
    const old = this.old;
    e = old.find(text, start, end, hash);
    if (e < 0) {
      this.misses++;
      return -1;
    }
    this.hits++;
    const n = old.copyIds(e, out, at);
    this.add(text, start, end, hash, out, at, n);
    return n;
  }

  /** Caches ids[from, from + n) for text[start, end) (which must not be cached in the young generation). */
  add(text: string, start: number, end: number, hash: number, ids: ArrayLike<number>, from: number, n: number): void {
    if (end - start > this.maxWordLength || n > this.maxWordLength) return;
    if (!this.young.fits(end - start, n)) {
      const dropped = this.old;
      this.old = this.young;
      this.young = dropped;
      dropped.clear();
      this.turnovers++;
    }
    if (!this.young.insert(text, start, end, hash, ids, from, n)) this.skipped++;
  }

  /** Entries and bytes in use (both generations). */
  stats(): { entries: number; bytes: number; capacityBytes: number } {
    return {
      entries: this.young.count + this.old.count,
      bytes: this.young.usedBytes() + this.old.usedBytes(),
      capacityBytes: this.young.capacityBytes() + this.old.capacityBytes(),
    };
  }
}

// Per entry a generation reserves: 4 fields (16 bytes), up to 4 table slots (16), 8 key units (16), 3 ids (12).
const BYTES_PER_ENTRY = 60;

/**
 * Slots a word cache lookup or insertion examines from the word's home slot. A generation's table is at most
 * half full, where linear probing on a well-spread hash needs 1.5 probes to find a word and 2.5 to miss on
 * average; runs of 32 taken slots are rare enough that honest text loses nothing (no insertion dropped among 3
 * million distinct words, caches of 64 KiB to 8 MiB), while against words sharing a hash a lookup compares at
 * most 32 keys.
 */
export const PROBES = 32;

// One seed per process, so that words sharing a textHash cannot be worked out offline; it is never kept beyond the
// process. Each worker thread loads its own copy of this module and draws its own, so a tokenizer pool hands its
// members its seed (hashSeed, then useSeed) before they make any table: a table one thread builds (Llama 3's whole
// words, shared by the pool) is found by every thread's hashes. Module state, not a seed passed to each table: one
// hash per word is looked up in the word cache and the whole-word table alike, so all tables must hash alike, and a
// seed that cannot change once a table exists keeps them so without any table carrying one.
let seed = crypto.getRandomValues(new Int32Array(1))[0]!;
// Set by the first TextTable (hashes are kept nowhere else): from then on `seed` is fixed.
let seedFixed = false;

/** The seed of this thread's textHash, for a thread that must hash as this one does (`useSeed`). */
export function hashSeed(): number {
  return seed;
}

/** Hashes with `s` from now on; before any TextTable is made (a pool member, given its pool's seed). */
export function useSeed(s: number): void {
  if (s === seed) return;
  if (seedFixed) throw new Error("textHash's seed cannot change once a table holds hashes of it");
  seed = s;
}

/** FNV-1a over the UTF-16 units of text[start, end) from the process's seed, mixed. */
export function textHash(text: string, start: number, end: number): number {
  let h = hashRange(FNV_OFFSET ^ seed ^ (end - start), text, start, end);
  h ^= h >>> 15;
  h = Math.imul(h, 0x2c1b3c6d);
  return (h ^ (h >>> 12)) | 0;
}

/** A finished table's arrays in shared memory (`shared()`), for `TextTable.adopt` on any thread of the process. */
export type TextTableArrays = { count: number; slots: Int32Array; entries: Int32Array; keys: Uint16Array; ids: Uint32Array };

/**
 * Text -> ids in typed arrays of fixed capacity, looked up by a range of any string (open addressing on
 * `textHash`). A generation of the word cache, and the whole-word table of an `ignore_merges` model.
 * Lookups and insertions examine at most `probes` slots from the home slot; an insertion finding them all taken
 * is dropped. Entries are only added, and cleared all at once, so every slot a lookup passes on its way to an
 * entry was taken when the entry went in: each entry kept is found within the same bound.
 */
export class TextTable {
  count = 0;
  private readonly slots: Int32Array; // entry + 1, 0 = empty; open addressing, linear probing
  private readonly mask: number;
  private readonly entries: Int32Array; // per entry: hash, key start, key length << 16 | ids length, ids start
  private readonly keys: Uint16Array;
  private readonly ids: Uint32Array;
  private keyUsed = 0;
  private idUsed = 0;
  private readonly maxEntries: number;
  private readonly probes: number;
  readonly keyCapacity: number;

  /**
   * `probes`: Infinity keeps every entry (a lookup still stops at the first empty slot). `full`: the arrays of a
   * finished table (`shared()`), used as they are.
   */
  constructor(maxEntries: number, keyUnits: number, idCount: number, probes: number, full?: TextTableArrays) {
    seedFixed = true;
    this.maxEntries = maxEntries;
    let cap = 2;
    while (cap < maxEntries * 2) cap *= 2;
    this.slots = full?.slots ?? new Int32Array(cap);
    this.mask = this.slots.length - 1;
    this.probes = Math.min(probes, this.slots.length);
    this.entries = full?.entries ?? new Int32Array(maxEntries * 4);
    this.keyCapacity = keyUnits;
    this.keys = full?.keys ?? new Uint16Array(keyUnits);
    this.ids = full?.ids ?? new Uint32Array(idCount);
    if (full !== undefined) {
      this.count = full.count;
      this.keyUsed = keyUnits;
      this.idUsed = idCount;
    }
  }

  /**
   * A table holding each word of `words` (no longer than 65535 units) with its one id. Unbounded: the
   * vocabulary's words are the answer, not a cache of it, so none may be dropped. That costs no bound on lookups:
   * the table is built once from the vocabulary and never written again, so its runs of taken slots are fixed
   * before any request is read, and a lookup from any text ends at the end of one of them. (A bounded table would
   * need a fallback for the words it refused; one that is only ever read needs none.)
   */
  static of(words: Map<string, number>): TextTable {
    let units = 0;
    for (const w of words.keys()) units += w.length;
    const table = new TextTable(words.size, units, words.size, Infinity);
    for (const [w, id] of words) table.insert(w, 0, w.length, textHash(w, 0, w.length), [id], 0, 1);
    return table;
  }

  /** A finished, unbounded table (`of`) made from its shared arrays; read-only. */
  static adopt(full: TextTableArrays): TextTable {
    return new TextTable(full.count, full.keys.length, full.ids.length, Infinity, full);
  }

  /** A finished table's arrays copied into shared memory; nothing may be inserted after. */
  shared(): TextTableArrays {
    const { count, slots, entries, keys, ids } = this;
    return {
      count, slots: sharedCopy(slots), entries: sharedCopy(entries.subarray(0, count * 4)),
      keys: sharedCopy(keys.subarray(0, this.keyUsed)), ids: sharedCopy(ids.subarray(0, this.idUsed)),
    };
  }

  /** The first id of entry `e`. */
  firstId(e: number): number {
    return this.ids[this.entries[e * 4 + 3]!]!;
  }

  fits(keyLength: number, idCount: number): boolean {
    return this.count < this.maxEntries && this.keyUsed + keyLength <= this.keys.length && this.idUsed + idCount <= this.ids.length;
  }

  find(text: string, start: number, end: number, hash: number): number {
    const len = end - start;
    const { slots, entries, keys, mask } = this;
    for (let s = hash & mask, left = this.probes; left > 0; s = (s + 1) & mask, left--) {
      const e = slots[s]! - 1;
      if (e < 0) return -1;
      const f = e * 4;
      if (entries[f] !== hash || entries[f + 2]! >>> 16 !== len) continue;
      const k = entries[f + 1]!;
      let i = 0;
      while (i < len && keys[k + i] === text.charCodeAt(start + i)) i++;
      if (i === len) return e;
    }
    return -1;
  }

  copyIds(e: number, out: Uint32Array, at: number): number {
    const f = e * 4;
    const n = this.entries[f + 2]! & 0xffff;
    const from = this.entries[f + 3]!;
    for (let i = 0; i < n; i++) out[at + i] = this.ids[from + i]!;
    return n;
  }

  /** Adds text[start, end) with ids[from, from + n) (it must fit, and not be here); false when it was dropped. */
  insert(text: string, start: number, end: number, hash: number, ids: ArrayLike<number>, from: number, n: number): boolean {
    const slots = this.slots;
    const mask = this.mask;
    let s = hash & mask;
    for (let left = this.probes; slots[s] !== 0; s = (s + 1) & mask) if (--left === 0) return false;
    slots[s] = this.count + 1;
    const e = this.count++;
    const f = e * 4;
    const len = end - start;
    this.entries[f] = hash;
    this.entries[f + 1] = this.keyUsed;
    this.entries[f + 2] = (len << 16) | n;
    this.entries[f + 3] = this.idUsed;
    for (let i = 0; i < len; i++) this.keys[this.keyUsed + i] = text.charCodeAt(start + i);
    this.keyUsed += len;
    for (let i = 0; i < n; i++) this.ids[this.idUsed + i] = ids[from + i]!;
    this.idUsed += n;
    return true;
  }

  clear(): void {
    this.slots.fill(0);
    this.count = 0;
    this.keyUsed = 0;
    this.idUsed = 0;
  }

  usedBytes(): number {
    return this.count * 16 + this.keyUsed * 2 + this.idUsed * 4 + this.slots.byteLength;
  }

  capacityBytes(): number {
    return this.entries.byteLength + this.keys.byteLength + this.ids.byteLength + this.slots.byteLength;
  }
}
