// The fast BPE's word cache: keyed by ranges of a text, bounded in bytes, two generations.
import { expect, test } from "bun:test";
import fc from "fast-check";
import { hashSeed, PROBES, TextTable, textHash, WordCache } from "../src/fast/word-cache";

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

// Words that all share one hash, as someone could send them: equal length, differing only in their last units
// (so each key comparison reads the whole word).
const COLLIDING = 2000;
const SHARED_HASH = 0x2545f491;
const colliding = Array.from({ length: COLLIDING }, (_, i) => `collision${String(i).padStart(5, "0")}`);

// A text that counts the code units read from it: the work of a lookup, without a clock.
function counted(text: string): { text: string; reads: () => number } {
  let reads = 0;
  const view = { charCodeAt: (i: number) => (reads++, text.charCodeAt(i)), length: text.length };
  return { text: view as unknown as string, reads: () => reads };
}

test("words sharing a hash: the cache keeps the first PROBES of them with their ids, counts the rest as skipped, and a lookup reads at most PROBES keys per generation", () => {
  const cache = new WordCache(1 << 20, 64);
  for (const w of colliding) cache.add(w, 0, w.length, SHARED_HASH, idsOf(w), 0, idsOf(w).length);
  expect(cache.stats().entries).toBe(PROBES);
  expect(cache.skipped).toBe(COLLIDING - PROBES);
  const out = new Uint32Array(cache.maxWordLength);
  let reads = 0;
  colliding.forEach((w, i) => {
    const t = counted(w);
    const n = cache.get(t.text, 0, w.length, SHARED_HASH, out, 0);
    reads += t.reads();
    if (i < PROBES) expect([...out.subarray(0, n)]).toEqual(idsOf(w));
    else expect(n).toBe(-1);
  });
  expect(reads).toBeLessThanOrEqual(COLLIDING * 2 * PROBES * colliding[0]!.length);
});

test("the same colliding words: a table bounded at PROBES keeps PROBES of them, an unbounded one (the vocabulary's) keeps and finds every one", () => {
  const units = COLLIDING * colliding[0]!.length;
  const bounded = new TextTable(COLLIDING, units, COLLIDING, PROBES);
  const unbounded = new TextTable(COLLIDING, units, COLLIDING, Infinity);
  colliding.forEach((w, i) => {
    expect(bounded.insert(w, 0, w.length, SHARED_HASH, [i], 0, 1)).toBe(i < PROBES);
    expect(unbounded.insert(w, 0, w.length, SHARED_HASH, [i], 0, 1)).toBe(true);
  });
  expect(bounded.count).toBe(PROBES);
  expect(unbounded.count).toBe(COLLIDING);
  colliding.forEach((w, i) => {
    const e = bounded.find(w, 0, w.length, SHARED_HASH);
    expect(e >= 0 ? bounded.firstId(e) : -1).toBe(i < PROBES ? i : -1);
    expect(unbounded.firstId(unbounded.find(w, 0, w.length, SHARED_HASH))).toBe(i);
  });
});

test("textHash is seeded per process: two processes hash the same word differently", () => {
  const module = new URL("../src/fast/word-cache.ts", import.meta.url).pathname;
  const script = `import { textHash } from ${JSON.stringify(module)}; console.log(textHash("hello", 0, 5));`;
  const run = () => Bun.spawnSync([process.execPath, "-e", script]).stdout.toString().trim();
  const [a, b] = [run(), run()];
  expect(a).toMatch(/^-?\d+$/);
  expect(a).not.toBe(b);
});

test("a process given this one's seed (useSeed, as a pool member is) hashes as this one does; once it made a table, another seed is refused", () => {
  const module = new URL("../src/fast/word-cache.ts", import.meta.url).pathname;
  const seed = hashSeed();
  const script = `import { textHash, TextTable, useSeed } from ${JSON.stringify(module)};
    const own = textHash("hello", 0, 5);
    useSeed(${seed});
    const given = textHash("hello", 0, 5);
    new TextTable(1, 1, 1, 1);
    useSeed(${seed});
    let refused = false;
    try { useSeed(${seed ^ 1}); } catch { refused = true; }
    console.log(JSON.stringify({ own, given, refused, after: textHash("hello", 0, 5) }));`;
  const { own, ...given } = JSON.parse(Bun.spawnSync([process.execPath, "-e", script]).stdout.toString());
  const hello = textHash("hello", 0, 5);
  expect(own).not.toBe(hello);
  expect(given).toEqual({ given: hello, refused: true, after: hello });
});
