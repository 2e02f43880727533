import { expect, test } from "bun:test";
import { qwen3TokenizerDir } from "../test/qwen3-fixture";
import { byteLevelDecoder } from "./byte-level-decode";
import { createPreprocessor } from "./preprocessor";
import { loadTokenizerFiles } from "./tokenizer-files";

test("a byte-level BPE's ids decode as the tokenizers library decodes them, special tokens and split characters too", async () => {
  const dir = await qwen3TokenizerDir();
  const pre = createPreprocessor({ tokenizerDir: dir, anthropicInlineSystem: "fold" });
  const decode = byteLevelDecoder(loadTokenizerFiles(dir).tokenizerJson)!;
  const ids = pre.encodeChat([{ role: "user", content: "Zürich 😀 naïve\n\tx  y" }, { role: "assistant", content: "日本語 <think>" }], {});
  expect(decode(ids)).toBe(pre.decode(ids));
  for (let i = 0; i + 3 <= ids.length; i++) expect(decode(ids.subarray(i, i + 3))).toBe(pre.decode(ids.subarray(i, i + 3)));
  expect(decode([])).toBe("");
  expect(byteLevelDecoder({ added_tokens: [], normalizer: null, decoder: { type: "Metaspace" }, model: { type: "BPE" } })).toBeUndefined();
}, 60_000);
