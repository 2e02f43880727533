/**
 * Pre-token -> ids, bounded in bytes, keyed by a range of the text being encoded so that a lookup allocates
 * nothing (a Map<string, ...> needs a substring per pre-token, and its garbage, on every word of fresh text).
 * Two generations of fixed-size typed arrays: words go into the young one; when it is full the old one is
 * dropped and the young one becomes old; a word found in the old one is copied into the young one. So the
 * words used since the last turnover stay, memory is fixed at construction (`maxBytes`), and each lookup or
 * insertion costs the word's length (plus, once per turnover, clearing a table the size of the generation).
 */
export class WordCache {
  private young: TextTable;
  private old: TextTable;
  /** The largest word (UTF-16 units) kept. */
  readonly maxWordLength: number;
  hits = 0;
  misses = 0;
  turnovers = 0;

  constructor(maxBytes: number, maxWordLength = 256) {
    const entries = Math.max(1, Math.floor(maxBytes / 2 / BYTES_PER_ENTRY));
    this.young = new TextTable(entries, entries * 8, entries * 3);
    this.old = new TextTable(entries, entries * 8, entries * 3);
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
    this.young.insert(text, start, end, hash, ids, from, n);
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

/** FNV-1a over the UTF-16 units of text[start, end), mixed. */
export function textHash(text: string, start: number, end: number): number {
  let h = 0x811c9dc5 ^ (end - start);
  for (let i = start; i < end; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193);
  h ^= h >>> 15;
  h = Math.imul(h, 0x2c1b3c6d);
  return (h ^ (h >>> 12)) | 0;
}

/**
 * Text -> ids in typed arrays of fixed capacity, looked up by a range of any string (open addressing on
 * `textHash`). A generation of the word cache, and the whole-word table of an `ignore_merges` model.
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
  readonly keyCapacity: number;

  constructor(maxEntries: number, keyUnits: number, idCount: number) {
    this.maxEntries = maxEntries;
    let cap = 2;
    while (cap < maxEntries * 2) cap *= 2;
    this.slots = new Int32Array(cap);
    this.mask = cap - 1;
    this.entries = new Int32Array(maxEntries * 4);
    this.keyCapacity = keyUnits;
    this.keys = new Uint16Array(keyUnits);
    this.ids = new Uint32Array(idCount);
  }

  /** A table holding each word of `words` (no longer than 65535 units) with its one id. */
  static of(words: Map<string, number>): TextTable {
    let units = 0;
    for (const w of words.keys()) units += w.length;
    const table = new TextTable(words.size, units, words.size);
    for (const [w, id] of words) table.insert(w, 0, w.length, textHash(w, 0, w.length), [id], 0, 1);
    return table;
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
    for (let s = hash & mask; ; s = (s + 1) & mask) {
      const e = slots[s]! - 1;
      if (e < 0) return -1;
      const f = e * 4;
      if (entries[f] !== hash || entries[f + 2]! >>> 16 !== len) continue;
      const k = entries[f + 1]!;
      let i = 0;
      while (i < len && keys[k + i] === text.charCodeAt(start + i)) i++;
      if (i === len) return e;
    }
  }

  copyIds(e: number, out: Uint32Array, at: number): number {
    const f = e * 4;
    const n = this.entries[f + 2]! & 0xffff;
    const from = this.entries[f + 3]!;
    for (let i = 0; i < n; i++) out[at + i] = this.ids[from + i]!;
    return n;
  }

  insert(text: string, start: number, end: number, hash: number, ids: ArrayLike<number>, from: number, n: number): void {
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
    let s = hash & this.mask;
    while (this.slots[s] !== 0) s = (s + 1) & this.mask;
    this.slots[s] = e + 1;
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
