import { afterEach, describe, expect, test } from "bun:test";
import { createPreprocessor, TokenizerPool, warmUp, type ChatMessage } from "../src/index";
import { freshWords } from "@kv-epp/testkit";
import { modelDir } from "./reference-tokenizers";

const dir = modelDir("qwen3");
let pool: TokenizerPool | null = null;
afterEach(async () => {
  await pool?.close();
  pool = null;
});

describe("warm-up", () => {
  test("tokenizes a conversation through the request path, then leaves the segment cache empty and its counters at zero", () => {
    const pre = createPreprocessor({ tokenizerDir: dir });
    const w = warmUp(pre);
    expect(w.tokens).toBeGreaterThan(10_000);
    expect(pre.cacheStats()).toEqual({ hits: 0, misses: 0, entries: 0, bytes: 0, evictions: 0, freshTokens: 0, warmedHitTokens: 0 });
    // Nothing of the warm-up answers a request: its first chat is all fresh, with the ids of a cold preprocessor.
    const messages: ChatMessage[] = [{ role: "system", content: freshWords(300, 1) }, { role: "user", content: freshWords(300, 2) }];
    const cold = createPreprocessor({ tokenizerDir: dir });
    expect([...pre.encodeChat(messages)]).toEqual([...cold.encodeChat(messages)]);
    expect(pre.cacheStats()).toEqual(cold.cacheStats());
  }, 60_000);

  test("a pool reports ready once every member has warmed up, each with an empty cache", async () => {
    pool = new TokenizerPool({ preprocessor: { tokenizerDir: dir }, size: 2 });
    await pool.ready();
    for (const m of pool.stats().members) {
      expect(m.warmUp?.tokens).toBeGreaterThan(10_000);
      expect(m.cache.entries).toBe(0);
    }
    expect(pool.cacheStats().freshTokens).toBe(0);
  }, 60_000);
});
