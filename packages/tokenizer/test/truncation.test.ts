// truncate_prompt_tokens with and without the request's truncation_side, against vLLM's rule over the ids of the
// native `tokenizers` binding (the code vLLM runs). Gemma 3's post-processor puts <bos> first, which is where the two
// paths part: without a side the tokenizer truncates as it encodes and keeps <bos> inside the k; an explicit side
// encodes whole and slices the ids, <bos> counted like any other id.
import { beforeAll, describe, expect, test } from "bun:test";
import fc from "fast-check";
import { createPreprocessor, type Preprocessor } from "../src/index";
import { addedTokenTexts, modelDir, reference, textArbitrary, tokenizerJson, type Reference } from "./reference-tokenizers";

let pre: Preprocessor;
let ref: Reference;
let text: fc.Arbitrary<string>;
beforeAll(async () => {
  pre = createPreprocessor({ tokenizerDir: modelDir("gemma3") });
  ref = reference("gemma3");
  text = textArbitrary(addedTokenTexts(await tokenizerJson("gemma3")));
}, 180_000); // Gemma 3's tokenizer.json is 33 MB

const k = fc.integer({ min: 0, max: 24 });

describe("truncate_prompt_tokens as vLLM applies it", () => {
  test("an explicit side slices the whole ids: left the last k (<bos> may go), right the first k", async () => {
    await fc.assert(fc.asyncProperty(text, k, fc.constantFrom("left" as const, "right" as const), async (t, n, side) => {
      const full = await ref.encode(t, true);
      const want = side === "right" ? full.slice(0, n) : full.slice(Math.max(0, full.length - n));
      expect([...pre.encodeCompletion(t, { truncatePromptTokens: n, truncationSide: side })]).toEqual(want);
    }), { numRuns: 200 });
  });

  test("without a side the tokenizer's own truncation keeps <bos> and the last k - 1 of the text", async () => {
    await fc.assert(fc.asyncProperty(text, k.filter((n) => n > 0), async (t, n) => {
      const [bos, ...body] = await ref.encode(t, true);
      const want = [bos!, ...body.slice(Math.max(0, body.length - (n - 1)))];
      expect([...pre.encodeCompletion(t, { truncatePromptTokens: n })]).toEqual(want);
    }), { numRuns: 200 });
  });

  test("a chat with add_special_tokens: the rendered <bos> and the tokenizer's are both ids an explicit side may cut", () => {
    const messages = [{ role: "user", content: "hi" }];
    const whole = [...pre.encodeChat(messages, { addSpecialTokens: true })];
    expect(whole.slice(0, 2)).toEqual([2, 2]);
    const k = whole.length - 2;
    expect([...pre.encodeChat(messages, { addSpecialTokens: true, truncatePromptTokens: k, truncationSide: "left" })]).toEqual(whole.slice(2));
    expect([...pre.encodeChat(messages, { addSpecialTokens: true, truncatePromptTokens: k })]).toEqual([2, ...whole.slice(3)]);
  });
});
