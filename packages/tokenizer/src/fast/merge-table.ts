import { sharedCopy } from "./shared-arrays";

/** A table's arrays in shared memory (`shared()`), for `new MergeTable(arrays)` on any thread. */
export type MergeArrays = { keys: Int32Array; vals: Int32Array };

/**
 * The BPE merges of a tokenizer as an open-addressing hash table over typed arrays: (left id, right id) →
 * (rank, merged id). A Map keyed by a 38-bit number (left * 2^19 + right) was the first version; a probe in
 * Int32Arrays avoids boxing doubles and is the inner loop of every fresh word.
 */
export class MergeTable {
  private readonly mask: number;
  // Slot i: keys[2i] = left + 1 (0 = empty), keys[2i + 1] = right; vals[2i] = rank, vals[2i + 1] = merged id.
  private readonly keys: Int32Array;
  private readonly vals: Int32Array;

  /**
   * `merges`: per merge in rank order, its left id, right id and merged id; or the arrays of a table built already
   * (`shared()`), used as they are.
   */
  constructor(merges: Int32Array | MergeArrays) {
    if (!ArrayBuffer.isView(merges)) {
      this.keys = merges.keys;
      this.vals = merges.vals;
      this.mask = merges.keys.length / 2 - 1;
      return;
    }
    const count = merges.length / 3;
    let capacity = 16;
    while (capacity < count * 2) capacity *= 2;
    this.mask = capacity - 1;
    this.keys = new Int32Array(capacity * 2);
    this.vals = new Int32Array(capacity * 2);
    // Like Hugging Face's map, a pair listed twice keeps its last rank.
    for (let rank = 0; rank < count; rank++) this.put(merges[3 * rank]!, merges[3 * rank + 1]!, rank, merges[3 * rank + 2]!);
  }

  /** The slot of (left, right), or -1 when the pair does not merge. */
  find(left: number, right: number): number {
    let i = hash(left, right) & this.mask;
    const keys = this.keys;
    for (;;) {
      const k = keys[2 * i]!;
      if (k === 0) return -1;
      if (k === left + 1 && keys[2 * i + 1] === right) return i;
      i = (i + 1) & this.mask;
    }
  }

  /** The table's arrays copied into shared memory. */
  shared(): MergeArrays {
    return { keys: sharedCopy(this.keys), vals: sharedCopy(this.vals) };
  }

  rank(slot: number): number {
    return this.vals[2 * slot]!;
  }

  merged(slot: number): number {
    return this.vals[2 * slot + 1]!;
  }

  private put(left: number, right: number, rank: number, merged: number): void {
    let i = hash(left, right) & this.mask;
    for (;;) {
      const k = this.keys[2 * i]!;
      if (k === 0 || (k === left + 1 && this.keys[2 * i + 1] === right)) {
        this.keys[2 * i] = left + 1;
        this.keys[2 * i + 1] = right;
        this.vals[2 * i] = rank;
        this.vals[2 * i + 1] = merged;
        return;
      }
      i = (i + 1) & this.mask;
    }
  }
}

function hash(left: number, right: number): number {
  return (Math.imul(left, 0x9e3779b1) ^ Math.imul(right + 0x7f4a7c15, 0x85ebca6b)) >>> 7;
}
