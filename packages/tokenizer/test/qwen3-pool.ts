import { afterEach } from "bun:test";
import { freshWords } from "@kv-epp/testkit";
import { Registry } from "prom-client";
import { poolMetrics, TokenizerPool, type ChatMessage, type PoolOptions } from "../src/index";
import { modelDir } from "./reference-tokenizers";

// Tokenizer pools over the real Qwen3 tokenizer files, for the tests of the pool and of its placement.

export const QWEN3_DIR = modelDir("qwen3");

type StartOptions = Omit<PoolOptions, "preprocessor" | "observe">;

/**
 * Starts ready pools over the Qwen3 tokenizer; each pool a test starts is closed after that test, passed or
 * failed (the hook is registered where this is called: a file's top level or a describe).
 */
export function qwen3Pools() {
  const open: TokenizerPool[] = [];
  // A member on a loaded machine (the more at a raised nice) can take seconds to stop: more than a hook's default 5 s.
  afterEach(async () => {
    await Promise.all(open.splice(0).map((pool) => pool.close()));
  }, 60_000);
  const ready = async (pool: TokenizerPool) => {
    open.push(pool); // closed even if ready() fails
    await pool.ready();
    return pool;
  };
  return {
    start: (opts: StartOptions, preprocessor: Omit<PoolOptions["preprocessor"], "tokenizerDir"> = {}) =>
      ready(new TokenizerPool({ preprocessor: { tokenizerDir: QWEN3_DIR, ...preprocessor }, ...opts })),
    /** A pool observed by the pool's metrics on a registry of its own, labelled model="qwen3". */
    async startWithMetrics(opts: StartOptions): Promise<{ pool: TokenizerPool; registry: Registry }> {
      const registry = new Registry();
      const observe = poolMetrics(registry, "qwen3");
      const pool = new TokenizerPool({ preprocessor: { tokenizerDir: QWEN3_DIR }, ...opts, observe });
      observe.attach(pool);
      return { pool: await ready(pool), registry };
    },
  };
}

/** A system message, then user and assistant turns alternating, starting with the user's. */
export const chat = (system: string, ...turns: string[]): ChatMessage[] =>
  [{ role: "system", content: system }, ...turns.map((t, i) => ({ role: i % 2 === 0 ? "user" : "assistant", content: t }))];

/** A chat of fresh text: a system message of `systemWords` words, then `n` turns of `words` words each, from `seed`. */
export const freshChat = (seed: number, n: number, words: number, systemWords = 500): ChatMessage[] =>
  chat(freshWords(systemWords, seed), ...Array.from({ length: n }, (_, i) => freshWords(words, seed + 1 + i)));
