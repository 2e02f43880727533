// Long sections cut into pieces at the fast BPE's cut points keep Hugging Face's ids (the native binding), with
// and without the segment cache, for every shipped tokenizer; texts that share a prefix share its pieces. A
// failure names the model and prints the first differing text.
import { beforeAll, describe, expect, test } from "bun:test";
import fc from "fast-check";
import { compileFastTokenizer, type FastTokenizer } from "../src/fast/fast-tokenizer";
import type { CutPoints } from "../src/fast/cut-points";
import { createPreprocessor, type KnownPrefix, type Preprocessor } from "../src/index";
import { SegmentCache } from "../src/segment-cache";
import { Segmenter } from "../src/segmenter";
import { fastAndReference, firstDifference, modelDir, MODELS, textArbitrary, tokenizerJson, type Reference } from "./reference-tokenizers";

const RUNS = Number(process.env.TOKENIZER_PROPERTY_RUNS ?? 400);

/**
 * Documents: lines of random text (any Unicode, digits, code, contractions, the model's added-token text) after
 * line breaks of every kind (CRLF, blank lines, a newline before indentation or before U+3000), so cut points
 * and near misses are dense.
 */
function documentArbitrary(added: readonly string[], minLines = 1): fc.Arbitrary<string> {
  const lead = fc.constantFrom("", "", " ", "    ", "\t", "# ", "- ", "x", "1. ", "}", "'s", "\u3000", "\u00e9", "e\u0301", "\v", "\u0085", "12");
  const lineBreak = fc.constantFrom("\n", "\n\n", "\r\n", ".\n", " \n", "\n\n\n", "\n \n", "\u0085\n", "\r", "\n\r\n", "\n  \t");
  const line = fc.tuple(lead, textArbitrary(added), lineBreak).map(([a, b, c]) => a + b + c);
  return fc.array(line, { minLength: minLines, maxLength: 24 }).map((xs) => xs.join(""));
}

/** The pieces the segmenter's rule makes of a text with no added tokens: a cut at the first cut point at or after pieceChars from the previous. */
function pieces(cuts: CutPoints, text: string, pieceChars: number): [number, number][] {
  const out: [number, number][] = [];
  let start = 0;
  for (let at = cuts.next(text, start + pieceChars, text.length); at >= 0; at = cuts.next(text, start + pieceChars, text.length)) {
    out.push([start, at]);
    start = at;
  }
  out.push([start, text.length]);
  return out;
}

function same(label: string, text: string, got: ArrayLike<number>, want: ArrayLike<number>): void {
  const at = firstDifference(got, want);
  if (at >= 0) {
    throw new Error(`${label}: ids differ at ${at} for text ${JSON.stringify(text)}: ` +
      `got ${JSON.stringify([...Array.from(got).slice(at, at + 8)])}, want ${JSON.stringify([...Array.from(want).slice(at, at + 8)])}`);
  }
}

test("cut points: after a newline, before ASCII that is not a line break, a whitespace run only when no line break follows in it", async () => {
  const compiled = compileFastTokenizer(await tokenizerJson("qwen3"));
  if (!compiled.ok || compiled.tokenizer.cuts === null) throw new Error("qwen3 has cut points");
  const all = (text: string) => pieces(compiled.tokenizer.cuts!, text, 1).slice(1).map(([start]) => start);
  expect(all("a\nb")).toEqual([2]);
  expect(all("a\r\nb")).toEqual([3]);
  expect(all("a\n  b")).toEqual([2]);
  expect(all("a\n \nb")).toEqual([4]); // the run after the first newline holds another: \s*[\r\n]+ would straddle
  expect(all("a\n\u00e9b\n\u3000c")).toEqual([]); // non-ASCII after the newline: normalization may not restart
  expect(all("a\n\rb\n")).toEqual([]);
  expect(all("a\n")).toEqual([]);
});

test("the tokenizers with a proven pre-tokenizer have cut points; Gemma 3 (no pre-tokenizer split, a Replace normalizer) has none", async () => {
  const has = async (model: (typeof MODELS)[number]) => {
    const c = compileFastTokenizer(await tokenizerJson(model));
    return c.ok && c.tokenizer.cuts !== null;
  };
  expect({ qwen3: await has("qwen3"), llama3: await has("llama3"), gemma3: await has("gemma3"), deepseek_v3: await has("deepseek_v3") })
    .toEqual({ qwen3: true, llama3: true, gemma3: false, deepseek_v3: true });
}, 60_000);

describe.each(MODELS)("pieces, %s", (model) => {
  let fast: FastTokenizer;
  let ref: Reference;
  let added: string[];
  let json: Record<string, any>;
  const segmenters = new Map<number, Segmenter>();
  const segmenter = (pieceChars: number) => {
    let s = segmenters.get(pieceChars);
    if (s === undefined) {
      s = new Segmenter({ encode: (t) => fast.encode(t), independentSections: true, cuts: fast.cuts }, json.added_tokens, json.normalizer != null, pieceChars);
      segmenters.set(pieceChars, s);
    }
    return s;
  };
  beforeAll(async () => {
    ({ json, fast, ref, added } = await fastAndReference(model));
  }, 60_000);

  test("the pieces between every cut point, each encoded alone, give the ids of the whole text", async () => {
    if (fast.cuts === null) return; // Gemma 3: no cut points, whole sections (the next tests still check its ids)
    await fc.assert(
      fc.asyncProperty(documentArbitrary(added), async (text) => {
        const parts = pieces(fast.cuts!, text, 1).map(([a, b]) => [...fast.encode(text.slice(a, b))]);
        same(`${model}, every cut point`, text, parts.flat(), await ref.encode(text));
      }),
      { numRuns: RUNS },
    );
  }, 300_000);

  test("through the segment cache, cut every few characters, random documents keep the reference's ids", async () => {
    await fc.assert(
      fc.asyncProperty(documentArbitrary(added), fc.constantFrom(1, 5, 40, 300), async (text, pieceChars) => {
        const cache = new SegmentCache();
        const want = await ref.encode(text);
        same(`${model}, pieceChars ${pieceChars}`, text, segmenter(pieceChars).encode(text, cache), want);
        // again, from the cache
        same(`${model}, pieceChars ${pieceChars}, cached`, text, segmenter(pieceChars).encode(text, cache), want);
      }),
      { numRuns: RUNS },
    );
  }, 300_000);

  test("a text cut and continued differently finds the first text's pieces before the cut in the cache, and knows them as its prefix", async () => {
    let pairsSharing = 0;
    let grown = 0;
    await fc.assert(
      fc.asyncProperty(documentArbitrary([], 6), documentArbitrary(added), fc.constantFrom(0, 0.2, 0.4, 0.6, 0.8, 0.95, 1), fc.constantFrom(1, 16, 64),
        async (first, tail, where, pieceChars) => {
          const d = Math.floor(first.length * where);
          const second = first.slice(0, d) + tail;
          const seg = segmenter(pieceChars);
          const cache = new SegmentCache();
          same(`${model}, first text`, first, seg.encode(first, cache), await ref.encode(first));
          const want = await ref.encode(second);
          const before = cache.stats();
          const told: KnownPrefix[] = [];
          const got = seg.encode(second, cache, { knownPrefix: (k) => told.push(k) });
          const after = cache.stats();
          same(`${model}, the text continued differently`, second, got, want);
          // Told at the first miss, then again as the pieces tokenized extend it (each time longer, the rest
          // shorter, never the whole); not told when every piece hit. Each report adds to the ones before: together
          // an exact prefix of the ids, as long as the report says.
          const joined: number[] = [];
          for (const k of told) {
            joined.push(...k.added);
            if (joined.length !== k.tokens) throw new Error(`${model}: a report of ${k.tokens} known ids adds up to ${joined.length}, for ${JSON.stringify(second)}`);
            same(`${model}, a known prefix of the text continued differently`, second, Uint32Array.from(joined), want.slice(0, k.tokens));
          }
          // Each an array of its own, whole (the pool member transfers its buffer as it is).
          const buffers = new Set([got.buffer, ...told.map((k) => k.added.buffer)]);
          if (buffers.size !== told.length + 1 || told.some((k) => k.added.byteOffset !== 0 || k.added.byteLength !== k.added.buffer.byteLength)) {
            throw new Error(`${model}: a known prefix shares its buffer, or is a view, for ${JSON.stringify(second)}`);
          }
          for (let i = 1; i < told.length; i++) {
            if (told[i]!.added.length === 0 || told[i]!.unknownChars >= told[i - 1]!.unknownChars || told[i]!.unknownChars === 0) {
              throw new Error(`${model}: known prefixes told out of order (${told.map((k) => `${k.tokens}/${k.unknownChars}`).join(", ")}) for ${JSON.stringify(second)}`);
            }
          }
          if (told.length > 1) grown++;
          const known = told[0] ?? { unknownChars: 0 };
          if (fast.cuts === null) return;
          // The first text's pieces wholly before the difference whose cut was decided there (the character after
          // the cut, or its whitespace run, is in the shared part) are the second's pieces too.
          const shared = pieces(fast.cuts, first, pieceChars).filter(([, b]) => b < d && /\P{White_Space}|[\r\n]/u.test(first.slice(b, d)));
          const sharedEnd = shared.at(-1)?.[1] ?? 0;
          if (second.length - known.unknownChars < sharedEnd) {
            throw new Error(`${model}: known prefix ends at ${second.length - known.unknownChars}, before the shared pieces' end ${sharedEnd}, for ` +
              `${JSON.stringify(first)} then ${JSON.stringify(second)}`);
          }
          if (shared.length > 0) pairsSharing++;
          const sharedTokens = shared.reduce((n, [a, b]) => n + fast.encode(first.slice(a, b)).length, 0);
          if (after.hits - before.hits < shared.length || after.freshTokens - before.freshTokens > want.length - sharedTokens) {
            throw new Error(`${model}: ${shared.length} shared pieces (${sharedTokens} tokens), ${after.hits - before.hits} hits, ` +
              `${after.freshTokens - before.freshTokens} fresh of ${want.length} for ${JSON.stringify(first)} then ${JSON.stringify(second)}`);
          }
        }),
      { numRuns: RUNS },
    );
    // Not vacuous: many pairs share pieces, and many have their known prefix told again as it grew.
    if (fast.cuts !== null) expect(pairsSharing).toBeGreaterThan(RUNS / 4);
    if (fast.cuts !== null) expect(grown).toBeGreaterThan(RUNS / 4);
  }, 300_000);

  test("a large document at the default piece length keeps the reference's ids, cached in many pieces", async () => {
    const doc = fc.sample(documentArbitrary(added), { numRuns: 200, seed: 7 }).join("");
    const pre = createPreprocessor({ tokenizerDir: modelDir(model) });
    same(`${model}, large document`, doc.slice(0, 200), pre.encodeCompletion(doc, { addSpecialTokens: false }), await ref.encode(doc));
    if (fast.cuts !== null) expect(pre.cacheStats().entries).toBeGreaterThan(doc.length / 4096);
  }, 120_000);

  describe("through the preprocessor", () => {
    let pre: Preprocessor;
    beforeAll(() => {
      pre = createPreprocessor({ tokenizerDir: modelDir(model), cache: { pieceChars: 16 } });
    }, 60_000);

    test("completions and chats with long messages keep the reference's ids, and later ones hit earlier pieces", async () => {
      await fc.assert(
        fc.asyncProperty(fc.array(documentArbitrary(added), { minLength: 1, maxLength: 3 }), async (docs) => {
          for (const doc of docs) same(`${model}, completion`, doc, pre.encodeCompletion(doc, { addSpecialTokens: false }), await ref.encode(doc));
          const messages = docs.map((content, i) => ({ role: i % 2 === 0 ? "user" : "assistant", content }));
          const rendered = pre.renderChat(messages);
          same(`${model}, chat`, rendered, pre.encodeChat(messages), await ref.encode(rendered));
        }),
        { numRuns: Math.ceil(RUNS / 4) },
      );
      expect(pre.cacheStats().hits).toBeGreaterThan(0);
    }, 300_000);
  });
});
