// mulberry32: a tiny, fast, well-distributed 32-bit PRNG, the one seeded generator of the tests, the
// benches and the trace simulation, so runs replay identically from their seed.

/** A generator of u32 values from a 32-bit seed. */
export function mulberry32(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (t ^ (t >>> 14)) >>> 0;
  };
}

/** Uniform [0, 1) from a seed. */
export function seededRandom(seed: number): () => number {
  const next = mulberry32(seed);
  return () => next() / 4294967296;
}

/** `words` space-separated base-36 words from a seed: text no tokenizer cache has seen (fresh tokenization). */
export function freshWords(words: number, seed: number): string {
  const next = mulberry32(seed);
  const out: string[] = [];
  for (let i = 0; i < words; i++) out.push((next() >>> 8).toString(36));
  return out.join(" ");
}
