import { expect, test } from "bun:test";
import { freshWords } from "@kv-epp/testkit";
import { createPreprocessor, EncodeStopped } from "../src/index";
import { modelDir } from "./reference-tokenizers";

// Small pieces, so that a short text has many: lines of fresh words in two sections between added tokens.
const pre = createPreprocessor({ tokenizerDir: modelDir("qwen3"), cache: { pieceChars: 256 } });
const lines = (n: number, seed: number) => Array.from({ length: n }, (_, i) => freshWords(20, seed * 1000 + i)).join("\n");
const text = `<|im_start|>user\n${lines(30, 1)}<|im_end|>\n<|im_start|>assistant\n${lines(30, 2)}<|im_end|>\n`;

test("a walk stopped midway resumes where it stopped: no piece walked twice, the text cached as one walk caches it", () => {
  const reference = createPreprocessor({ tokenizerDir: modelDir("qwen3"), cache: false }).encodeCompletion(text, { addSpecialTokens: false });
  // One walk from an empty cache finds some pieces already (a "\n" between added tokens, seen before in the text).
  pre.resetCache();
  pre.encodeCompletion(text, { addSpecialTokens: false });
  const oneWalk = pre.cacheStats();
  // Stopped before the first piece to tokenize, the second, ..., the last.
  for (let stopAfter = 0; stopAfter < oneWalk.misses; stopAfter++) {
    pre.resetCache();
    let misses = 0;
    let stopped: EncodeStopped | undefined;
    try {
      pre.encodeCompletion(text, { addSpecialTokens: false }, { shouldStop: () => ++misses > stopAfter });
    } catch (err) {
      stopped = err as EncodeStopped;
    }
    expect(stopped).toBeInstanceOf(EncodeStopped);
    expect(stopped!.text).toBe(text);
    const rest = pre.encodeCompletion(stopped!.text, { addSpecialTokens: false }, { from: stopped!.at });
    // The pieces the stopped walk finished are not looked up again (the two walks find what one finds), and
    // nothing is tokenized twice.
    expect(pre.cacheStats().hits).toBe(oneWalk.hits);
    expect(pre.cacheStats().freshTokens).toBe(oneWalk.freshTokens);
    // The ids of the rest are the end of the whole text's.
    expect([...rest]).toEqual([...reference.subarray(reference.length - rest.length)]);
    // Every piece is cached: the whole text now costs nothing, with the same ids.
    expect([...pre.encodeCompletion(text, { addSpecialTokens: false })]).toEqual([...reference]);
    expect(pre.cacheStats().freshTokens).toBe(oneWalk.freshTokens);
  }
});
