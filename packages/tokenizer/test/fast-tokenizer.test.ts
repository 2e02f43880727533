// The purpose-built BPE against Hugging Face's Rust tokenizer (the native binding), on random text for every
// shipped tokenizer. A failure names the model and prints the first differing text and ids.
import { beforeAll, describe, expect, test } from "bun:test";
import fc from "fast-check";
import { compileFastTokenizer, type FastTokenizer } from "../src/fast/fast-tokenizer";
import { createPreprocessor, TokenizerPool, type Preprocessor } from "../src/index";
import { addedTokenTexts, firstDifference, modelDir, MODELS, reference, textArbitrary, tokenizerJson, type Reference } from "./reference-tokenizers";

const RUNS = Number(process.env.TOKENIZER_PROPERTY_RUNS ?? 400);

describe.each(MODELS)("fast BPE, %s", (model) => {
  let fast: FastTokenizer;
  let ref: Reference;
  let added: string[];
  let pre: Preprocessor;
  beforeAll(async () => {
    pre = createPreprocessor({ tokenizerDir: modelDir(model) });
    const json = await tokenizerJson(model);
    const compiled = compileFastTokenizer(json);
    if (!compiled.ok) throw new Error(`${model} not supported: ${compiled.reason}`);
    fast = compiled.tokenizer;
    ref = reference(model);
    added = addedTokenTexts(json);
  }, 60_000);

  test("gives the ids of Hugging Face's tokenizer on random text", async () => {
    await fc.assert(
      fc.asyncProperty(textArbitrary(added), async (text) => {
        const want = await ref.encode(text);
        const got = fast.encode(text);
        const at = firstDifference(got, want);
        if (at >= 0) {
          throw new Error(`${model}: ids differ at ${at} for text ${JSON.stringify(text)}: ` +
            `got ${JSON.stringify([...got.slice(at, at + 8)])}, want ${JSON.stringify(want.slice(at, at + 8))}`);
        }
      }),
      { numRuns: RUNS },
    );
  }, 300_000);

  /** Texts growing by random turns (each ending in an added token) get the reference's ids from `encode`, turn by turn. */
  async function growingTextsKeepReferenceIds(label: string, encode: (text: string) => ArrayLike<number> | Promise<ArrayLike<number>>) {
    // The preprocessor adds what the model's config asks around a completion (e.g. DeepSeek's bos, which
    // transformers adds from add_bos_token and the bare tokenizer.json does not); the rest is the reference's.
    const around = pre.encodeCompletion("");
    await fc.assert(
      fc.asyncProperty(fc.array(textArbitrary(added), { minLength: 1, maxLength: 4 }), async (turns) => {
        let text = "";
        for (const turn of turns) {
          text += turn + (added[0] ?? "");
          const want = [...around, ...(await ref.encode(text))];
          const at = firstDifference(await encode(text), want);
          if (at >= 0) throw new Error(`${label}: ids differ at ${at} for text ${JSON.stringify(text)}`);
        }
      }),
      { numRuns: Math.ceil(RUNS / 4) },
    );
  }

  test("through the segment cache, a conversation growing by random turns keeps the reference's ids", async () => {
    await growingTextsKeepReferenceIds(model, (text) => pre.encodeCompletion(text));
    expect(pre.cacheStats().hits).toBeGreaterThan(0);
  }, 300_000);

  test("gives the ids of Hugging Face's tokenizer on long runs of one character and on large mixed documents", async () => {
    const texts = ["a".repeat(20_000), " ".repeat(5000) + "x", "\n".repeat(3000), "1".repeat(10_000), "日".repeat(8000), "!@#$%^&*()".repeat(500),
      "▁".repeat(2000), fc.sample(textArbitrary(added), { numRuns: 400, seed: 42 }).join(" ")];
    for (const text of texts) {
      const got = fast.encode(text);
      const want = await ref.encode(text);
      expect({ at: firstDifference(got, want), text: text.slice(0, 80) }).toEqual({ at: -1, text: text.slice(0, 80) });
    }
  }, 300_000);

  test("words of every length, words repeated, and a word cache that turns over all the time keep the reference's ids", async () => {
    // Words short and long (around the small-word merge's limit in bytes and far past it, past the word cache's
    // longest key too), a few of them repeated in one text and encoded twice (cache hits), by the shared
    // tokenizer and by one whose 2 KiB cache keeps turning over (eviction); the separators include Gemma's one
    // merge across a space ("> </"), spaces beside "▁" (which Gemma reads as one), and characters outside the
    // vocabulary right before a space.
    const tiny = compileFastTokenizer(await tokenizerJson(model), { wordCacheBytes: 2048 });
    if (!tiny.ok) throw new Error(tiny.reason);
    const unit = fc.constantFrom("a", "b", "e", "n", "t", "X", "é", "ß", "日", "本", "ー", "\u0301", "🙂", "𓀀", "\u0001", "7", "▁");
    const word = fc.oneof(fc.string({ unit, minLength: 1, maxLength: 40 }), fc.string({ unit, minLength: 200, maxLength: 300 }));
    const separator = fc.constantFrom(" ", "", "\n", "  ", "> </", ">▁</", " ▁", "-", ". ", "\u0001 ", "𓀀 ");
    const text = fc.array(word, { minLength: 1, maxLength: 5 })
      .chain((words) => fc.array(fc.tuple(fc.constantFrom(...words), separator), { maxLength: 30 }))
      .map((parts) => parts.flat().join(""));
    await fc.assert(
      fc.asyncProperty(text, async (t) => {
        const want = await ref.encode(t);
        for (const [label, got] of [["first", fast.encode(t)], ["again", fast.encode(t)], ["tiny cache", tiny.tokenizer.encode(t)]] as const) {
          const at = firstDifference(got, want);
          if (at >= 0) throw new Error(`${model} (${label}): ids differ at ${at} for text ${JSON.stringify(t)}`);
        }
      }),
      { numRuns: Math.ceil(RUNS / 2) },
    );
  }, 300_000);

  test("through the pool (members' fast BPE and segment caches), texts growing by random turns keep the reference's ids", async () => {
    const pool = new TokenizerPool({ preprocessor: { tokenizerDir: modelDir(model) }, size: 2, budgetMs: 600_000 });
    try {
      await pool.ready();
      await growingTextsKeepReferenceIds(`${model} through the pool`, async (text) => (await pool.tokenize({ kind: "prompt", text })).tokens);
      expect(pool.stats().cache.hits).toBeGreaterThan(0);
    } finally {
      await pool.close();
    }
  }, 300_000);
});

test("a tokenizer.json it does not implement is refused with the reason, for the caller to keep the library", () => {
  const r = compileFastTokenizer({ added_tokens: [], normalizer: null, pre_tokenizer: { type: "Metaspace" }, model: { type: "BPE", vocab: {}, merges: [] } });
  expect(r).toEqual({ ok: false, reason: "pre-tokenizer Metaspace" });
  const wp = compileFastTokenizer({ added_tokens: [], normalizer: null, pre_tokenizer: null, model: { type: "WordPiece" } });
  expect(wp).toEqual({ ok: false, reason: "model WordPiece" });
});
