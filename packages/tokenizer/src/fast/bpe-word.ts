import type { MergeTable } from "./merge-table";

/**
 * Merges one word's symbols in place, as Hugging Face's BPE does (`Word::merge_all`): repeatedly the pending
 * merge of lowest (rank, position), through a min-heap with stale entries skipped. An entry is stale when the
 * pair at its position no longer merges into the id it was queued with; like the reference, the check is on
 * the merged id, not the rank. O(n log n) in the word's length, so a 100k-character "word" (a run of one
 * character, a section without spaces under a SentencePiece-style tokenizer) costs what its size says.
 * Returns the number of symbols left at the front of `syms`.
 */
// Up to this many symbols a word merges by scanning its pairs (measured faster than the heap for pre-tokens).
const SMALL_WORD = 24;
const NO_MERGE = 0x7fffffff;

export class WordMerger {
  private prev = new Int32Array(64);
  private next = new Int32Array(64);
  private alive = new Uint8Array(64);
  private heapKey = new Float64Array(128); // rank * 2^32 + position: orders by rank, then position
  private heapId = new Int32Array(128);
  private heapSize = 0;
  private readonly smallRank = new Int32Array(SMALL_WORD);
  private readonly smallId = new Int32Array(SMALL_WORD);

  constructor(private readonly merges: MergeTable) {}

  merge(syms: Int32Array, n: number): number {
    if (n < 2) return n;
    if (n <= SMALL_WORD) return this.mergeSmall(syms, n);
    this.reserve(n);
    const { prev, next, alive, merges } = this;
    this.heapSize = 0;
    for (let i = 0; i < n; i++) {
      prev[i] = i - 1;
      next[i] = i + 1;
      alive[i] = 1;
    }
    for (let i = 0; i + 1 < n; i++) {
      const slot = merges.find(syms[i]!, syms[i + 1]!);
      if (slot >= 0) this.push(merges.rank(slot), i, merges.merged(slot));
    }
    while (this.heapSize > 0) {
      const key = this.heapKey[0]!;
      const mergedId = this.heapId[0]!;
      this.pop();
      const pos = key % 4294967296;
      if (alive[pos] === 0) continue;
      const right = next[pos]!;
      if (right >= n) continue;
      const slot = merges.find(syms[pos]!, syms[right]!);
      if (slot < 0 || merges.merged(slot) !== mergedId) continue;
      syms[pos] = mergedId;
      alive[right] = 0;
      const after = next[right]!;
      next[pos] = after;
      if (after < n) prev[after] = pos;
      const before = prev[pos]!;
      if (before >= 0) {
        const s = merges.find(syms[before]!, mergedId);
        if (s >= 0) this.push(merges.rank(s), before, merges.merged(s));
      }
      if (after < n) {
        const s = merges.find(mergedId, syms[after]!);
        if (s >= 0) this.push(merges.rank(s), pos, merges.merged(s));
      }
    }
    let out = 0;
    for (let i = 0; i < n; i = next[i]!) syms[out++] = syms[i]!;
    return out;
  }

  /**
   * The same merges for a short word (most pre-tokens) without the heap: the lowest (rank, position) among the
   * current pairs, found by a scan. The heap's order is that one too, since a queued entry is live exactly when
   * its pair is still adjacent (a symbol only grows, so a changed pair spells a longer string: another id).
   */
  private mergeSmall(syms: Int32Array, n: number): number {
    const { smallRank: rank, smallId: id, merges } = this;
    for (let i = 0; i + 1 < n; i++) {
      const slot = merges.find(syms[i]!, syms[i + 1]!);
      rank[i] = slot < 0 ? NO_MERGE : merges.rank(slot);
      id[i] = slot < 0 ? 0 : merges.merged(slot);
    }
    for (;;) {
      let best = NO_MERGE;
      let at = -1;
      for (let i = 0; i + 1 < n; i++) {
        if (rank[i]! < best) {
          best = rank[i]!;
          at = i;
        }
      }
      if (at < 0) return n;
      syms[at] = id[at]!;
      n--;
      for (let i = at + 1; i < n; i++) {
        syms[i] = syms[i + 1]!;
        rank[i] = rank[i + 1]!;
        id[i] = id[i + 1]!;
      }
      if (at > 0) this.rankPair(syms, at - 1);
      if (at + 1 < n) this.rankPair(syms, at);
    }
  }

  private rankPair(syms: Int32Array, i: number): void {
    const slot = this.merges.find(syms[i]!, syms[i + 1]!);
    this.smallRank[i] = slot < 0 ? NO_MERGE : this.merges.rank(slot);
    this.smallId[i] = slot < 0 ? 0 : this.merges.merged(slot);
  }

  private reserve(n: number): void {
    if (this.prev.length >= n) return;
    let cap = this.prev.length;
    while (cap < n) cap *= 2;
    this.prev = new Int32Array(cap);
    this.next = new Int32Array(cap);
    this.alive = new Uint8Array(cap);
  }

  private push(rank: number, pos: number, mergedId: number): void {
    if (this.heapSize === this.heapKey.length) {
      const k = new Float64Array(this.heapKey.length * 2);
      k.set(this.heapKey);
      const d = new Int32Array(this.heapId.length * 2);
      d.set(this.heapId);
      this.heapKey = k;
      this.heapId = d;
    }
    const keys = this.heapKey;
    const ids = this.heapId;
    const key = rank * 4294967296 + pos;
    let i = this.heapSize++;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (keys[parent]! <= key) break;
      keys[i] = keys[parent]!;
      ids[i] = ids[parent]!;
      i = parent;
    }
    keys[i] = key;
    ids[i] = mergedId;
  }

  private pop(): void {
    const keys = this.heapKey;
    const ids = this.heapId;
    const size = --this.heapSize;
    if (size === 0) return;
    const key = keys[size]!;
    const id = ids[size]!;
    let i = 0;
    for (;;) {
      let child = 2 * i + 1;
      if (child >= size) break;
      if (child + 1 < size && keys[child + 1]! < keys[child]!) child++;
      if (keys[child]! >= key) break;
      keys[i] = keys[child]!;
      ids[i] = ids[child]!;
      i = child;
    }
    keys[i] = key;
    ids[i] = id;
  }
}
