import { describe, expect, test } from "bun:test";
import { createPreprocessor, warmUp } from "../src/index";
import { freshChat, QWEN3_DIR, qwen3Pools } from "./qwen3-pool";

const pools = qwen3Pools();

describe("warm-up", () => {
  test("tokenizes a conversation through the request path, then leaves the segment cache empty and its counters at zero", () => {
    const pre = createPreprocessor({ tokenizerDir: QWEN3_DIR });
    const w = warmUp(pre);
    expect(w.tokens).toBeGreaterThan(10_000);
    expect(pre.cacheStats()).toEqual({ hits: 0, misses: 0, entries: 0, bytes: 0, evictions: 0, freshTokens: 0, warmedHitTokens: 0 });
    // Nothing of the warm-up answers a request: its first chat is tokenized as by a cold preprocessor, ids and cache alike.
    const messages = freshChat(1, 1, 300, 300);
    const cold = createPreprocessor({ tokenizerDir: QWEN3_DIR });
    expect([...pre.encodeChat(messages)]).toEqual([...cold.encodeChat(messages)]);
    expect(pre.cacheStats()).toEqual(cold.cacheStats());
  }, 60_000);

  test("a pool reports ready once every member has warmed up, each with an empty cache", async () => {
    const pool = await pools.start({ size: 2 });
    for (const m of pool.stats().members) {
      expect(m.warmUp?.tokens).toBeGreaterThan(10_000);
      expect(m.cache.entries).toBe(0);
    }
    expect(pool.cacheStats().freshTokens).toBe(0);
  }, 60_000);
});
