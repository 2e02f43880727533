// The fast BPE's word cache: keyed by ranges of a text, bounded in bytes, two generations.
import { expect, test } from "bun:test";
import fc from "fast-check";
import { textHash, WordCache } from "../src/fast/word-cache";

// A word's ids as the tokenizer would give them: a function of the word (1 to 4 ids).
function idsOf(word: string): number[] {
  const h = textHash(word, 0, word.length) >>> 0;
  return Array.from({ length: 1 + (h % 4) }, (_, i) => (h >>> i) & 0xffff);
}

function lookup(cache: WordCache, text: string, start: number, end: number): number[] | null {
  const out = new Uint32Array(cache.maxWordLength + 8);
  const n = cache.get(text, start, end, textHash(text, start, end), out, 3);
  return n < 0 ? null : [...out.subarray(3, 3 + n)];
}

const words = fc.array(fc.string({ unit: fc.constantFrom("a", "b", "é", "日", "😀", " "), minLength: 1, maxLength: 12 }), { minLength: 1, maxLength: 400 });

test("a word is found with its ids, by a range of any text, until two turnovers pass it by; memory stays in its bound", () => {
  fc.assert(
    fc.property(words, fc.integer({ min: 1024, max: 16 * 1024 }), fc.string({ maxLength: 5 }), (seq, maxBytes, pad) => {
      const cache = new WordCache(maxBytes, 64);
      const addedAt = new Map<string, number>(); // turnover count when last added or promoted
      for (const w of seq) {
        const text = pad + w + pad;
        const got = lookup(cache, text, pad.length, pad.length + w.length);
        const last = addedAt.get(w);
        if (got !== null) {
          expect(got).toEqual(idsOf(w));
          expect(last).toBeDefined();
          addedAt.set(w, cache.turnovers);
          continue;
        }
        // Not found: it was never added, or two turnovers have dropped it since.
        if (last !== undefined) expect(cache.turnovers - last).toBeGreaterThanOrEqual(2);
        const ids = idsOf(w);
        cache.add(text, pad.length, pad.length + w.length, textHash(text, pad.length, pad.length + w.length), ids, 0, ids.length);
        addedAt.set(w, cache.turnovers);
      }
      const { bytes, capacityBytes } = cache.stats();
      expect(bytes).toBeLessThanOrEqual(capacityBytes);
      expect(capacityBytes).toBeLessThanOrEqual(maxBytes);
    }),
    { numRuns: 300 },
  );
});

test("a word used again survives a turnover (it moves to the young generation); one left alone is dropped by the second", () => {
  const cache = new WordCache(4096, 64);
  const add = (w: string) => cache.add(w, 0, w.length, textHash(w, 0, w.length), idsOf(w), 0, idsOf(w).length);
  add("kept");
  add("dropped");
  let i = 0;
  const turnovers = cache.turnovers;
  while (cache.turnovers < turnovers + 2) {
    add(`filler${i++}`);
    if (lookup(cache, "kept", 0, 4) === null) throw new Error(`"kept" lost after ${i} fillers`);
  }
  expect(lookup(cache, "kept", 0, 4)).toEqual(idsOf("kept"));
  expect(lookup(cache, "dropped", 0, 7)).toBeNull();
});

test("words longer than the limit are not kept, and the limit fits the key space", () => {
  const cache = new WordCache(4096, 64);
  const long = "x".repeat(cache.maxWordLength + 1);
  cache.add(long, 0, long.length, textHash(long, 0, long.length), [1, 2], 0, 2);
  expect(lookup(cache, long, 0, long.length)).toBeNull();
  expect(cache.stats().entries).toBe(0);
  expect(cache.maxWordLength).toBeLessThanOrEqual(64);
});
