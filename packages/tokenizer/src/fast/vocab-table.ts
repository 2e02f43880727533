import { FNV_OFFSET, hashRange } from "./fnv";
import { sharedCopy } from "./shared-arrays";

/** A finished table's arrays, in shared memory (`shared()`): a table for another thread, read-only. */
export type VocabArrays = {
  count: number; slots: Int32Array; hashes: Int32Array; starts: Int32Array; lengths: Int32Array; ids: Int32Array; keys: Uint16Array;
};

/**
 * Token text -> id, keyed by ranges of any string (open addressing over typed arrays, FNV-1a on code units): a
 * tokenizer.json's vocabulary read in place, and its merges' parts and results looked up without making a string
 * of each (for Qwen3's 151k tokens, a Map of them and the merges' lookups in it were ~35% of loading it). A token
 * listed twice keeps its last id.
 */
export class VocabTable {
  count = 0;
  private slots: Int32Array; // entry + 1, 0 = empty
  private hashes: Int32Array;
  private starts: Int32Array;
  private lengths: Int32Array;
  private ids: Int32Array;
  private keys: Uint16Array;
  private keyUsed = 0;

  /**
   * Sized for a tokenizer.json of `fileChars` characters; it grows when that is short. The shipped files hold
   * 55-120 characters per token (vocabulary, merges and the rest), Qwen3's tokens 6.4 code units on average.
   */
  constructor(from: number | VocabArrays = 0) {
    if (typeof from !== "number") {
      ({ count: this.count, slots: this.slots, hashes: this.hashes, starts: this.starts, lengths: this.lengths, ids: this.ids, keys: this.keys } = from);
      this.keyUsed = from.keys.length;
      return;
    }
    const fileChars = from;
    let entries = 1 << 10;
    while (entries * 64 < fileChars) entries *= 2;
    this.slots = new Int32Array(entries * 2);
    this.hashes = new Int32Array(entries);
    this.starts = new Int32Array(entries);
    this.lengths = new Int32Array(entries);
    this.ids = new Int32Array(entries);
    this.keys = new Uint16Array(entries * 8);
  }

  /** Sets the id of src[start, end), whose hash (`hashRange` from FNV_OFFSET) is `hash`. */
  set(hash: number, src: string, start: number, end: number, id: number): void {
    const found = this.find(hash, src, start, end, src, end, end);
    if (found >= 0) {
      this.ids[found] = id;
      return;
    }
    if (this.count === this.ids.length) this.growEntries();
    const len = end - start;
    if (this.keyUsed + len > this.keys.length) this.keys = grown(this.keys, this.keyUsed + len);
    const keys = this.keys;
    const at = this.keyUsed;
    for (let i = 0; i < len; i++) keys[at + i] = src.charCodeAt(start + i);
    const e = this.count++;
    this.hashes[e] = hash;
    this.starts[e] = at;
    this.lengths[e] = len;
    this.ids[e] = id;
    this.keyUsed += len;
    this.place(e);
  }

  /** The entry of a[aStart, aEnd) followed by b[bStart, bEnd), whose hash is `hash`, or -1. */
  find(hash: number, a: string, aStart: number, aEnd: number, b: string, bStart: number, bEnd: number): number {
    const aLen = aEnd - aStart;
    const len = aLen + bEnd - bStart;
    const { slots, keys, hashes, lengths, starts } = this;
    const mask = slots.length - 1;
    for (let s = hash & mask; ; s = (s + 1) & mask) {
      const e = slots[s]! - 1;
      if (e < 0) return -1;
      if (hashes[e] !== hash || lengths[e] !== len) continue;
      const k = starts[e]!;
      let i = 0;
      while (i < aLen && keys[k + i] === a.charCodeAt(aStart + i)) i++;
      if (i < aLen) continue;
      while (i < len && keys[k + i] === b.charCodeAt(bStart + i - aLen)) i++;
      if (i === len) return e;
    }
  }

  id(entry: number): number {
    return this.ids[entry]!;
  }

  get(token: string): number | undefined {
    const e = this.find(hashRange(FNV_OFFSET, token, 0, token.length), token, 0, token.length, token, 0, 0);
    return e < 0 ? undefined : this.ids[e];
  }

  /** The text of entry `e`. */
  key(e: number): string {
    const start = this.starts[e]!;
    return this.allKeys().slice(start, start + this.lengths[e]!);
  }

  *entries(): IterableIterator<[string, number]> {
    for (let e = 0; e < this.count; e++) yield [this.key(e), this.ids[e]!];
  }

  /** Drops the spare capacity of a finished table. */
  trim(): void {
    this.keys = this.keys.slice(0, this.keyUsed);
  }

  /** A finished table's arrays copied into shared memory, for `new VocabTable(arrays)` on any thread; nothing set after. */
  shared(): VocabArrays {
    const n = this.count;
    const used = (a: Int32Array) => sharedCopy(a.subarray(0, n));
    return {
      count: n, slots: sharedCopy(this.slots), hashes: used(this.hashes), starts: used(this.starts), lengths: used(this.lengths),
      ids: used(this.ids), keys: sharedCopy(this.keys.subarray(0, this.keyUsed)),
    };
  }

  // Every key's text, made once: one string sliced for each key costs far less than a string built for each.
  private keyText: string | null = null;
  private allKeys(): string {
    if (this.keyText === null) {
      const parts: string[] = [];
      for (let at = 0; at < this.keyUsed; at += CHUNK) parts.push(String.fromCharCode.apply(null, this.keys.subarray(at, Math.min(this.keyUsed, at + CHUNK)) as never));
      this.keyText = parts.join("");
    }
    return this.keyText;
  }

  private place(e: number): void {
    const mask = this.slots.length - 1;
    let s = this.hashes[e]! & mask;
    while (this.slots[s] !== 0) s = (s + 1) & mask;
    this.slots[s] = e + 1;
  }

  private growEntries(): void {
    const n = this.ids.length * 2;
    this.hashes = grown(this.hashes, n);
    this.starts = grown(this.starts, n);
    this.lengths = grown(this.lengths, n);
    this.ids = grown(this.ids, n);
    this.slots = new Int32Array(n * 2);
    for (let e = 0; e < this.count; e++) this.place(e);
  }
}

// String.fromCharCode's arguments per call.
const CHUNK = 4096;

/** A copy of `a` with room for at least `min` elements. */
export function grown<T extends Int32Array | Uint16Array>(a: T, min: number): T {
  let n = Math.max(a.length, 16);
  while (n < min) n *= 2;
  const b = new (a.constructor as new (n: number) => T)(n);
  b.set(a);
  return b;
}
