// The hand-written pre-tokenizer scanners against the regexes they stand for (JavaScript's engine, with `\s` as
// Oniguruma reads it), on text dense in the characters their classes tell apart. The tokenizer tests then hold
// the whole against Hugging Face's own tokenizer.
import { expect, test } from "bun:test";
import fc from "fast-check";
import { cl100kDigits, scanCl100k } from "../src/fast/cl100k-scanner";
import { DEEPSEEK_V3_PATTERNS, scanDeepSeekV3 } from "../src/fast/deepseek-scanner";
import { hfRegexToJs } from "../src/fast/hf-regex";

const RUNS = Number(process.env.TOKENIZER_PROPERTY_RUNS ?? 400) * 5;

// Letters (ASCII, accented, astral, CJK, kana incl. ー), marks, numbers (astral too, 〇), punctuation and symbols
// (ASCII, CJK, emoji), whitespace (\r, \n, U+0085, U+3000, ...), and characters no alternative matches.
const CHARS = [
  "a", "Z", "é", "ß", "𐀀", "日", "一", "龥", "龦", "ぁ", "ア", "ー", "・", "゠", "\u0301", "\u093f",
  "0", "7", "²", "①", "〇", "𝟘", "!", "'", "-", "[", "\\", "`", "~", "$", "+", "、", "«", "€", "😀",
  " ", " ", " ", "\t", "\n", "\r", "\u0085", "\u00a0", "\u3000", "\u2028", "\u000b",
  "\u0000", "\u200b", "\ufeff", "\ue000", "s", "t", "S", "ſ", "l", "L", "r", "e", "v", "m", "d",
];
const dense = fc.array(fc.constantFrom(...CHARS), { maxLength: 40 }).map((xs) => xs.join(""));

/** Hugging Face's Split, Isolated: each match a piece, the text between matches a piece. */
function isolated(pattern: string, pieces: string[]): string[] {
  const re = hfRegexToJs(pattern);
  return pieces.flatMap((piece) => {
    const out: string[] = [];
    let from = 0;
    for (const m of piece.matchAll(re)) {
      if (m[0].length === 0) continue;
      if (m.index > from) out.push(piece.slice(from, m.index));
      out.push(m[0]);
      from = m.index + m[0].length;
    }
    if (from < piece.length) out.push(piece.slice(from));
    return out;
  });
}

function scanned(scan: (text: string, start: number, end: number, emit: (s: number, e: number) => void) => void, text: string, start = 0, end = text.length): string[] {
  const out: string[] = [];
  let at = start;
  scan(text, start, end, (s, e) => {
    if (s !== at || e <= s) throw new Error(`piece [${s}, ${e}) after ${at} in ${JSON.stringify(text)}`);
    out.push(text.slice(s, e));
    at = e;
  });
  expect(at).toBe(end);
  return out;
}

test("DeepSeek V3's scanner splits as its three regexes in a row", () => {
  fc.assert(
    fc.property(dense, (text) => {
      const want = DEEPSEEK_V3_PATTERNS.reduce((pieces, p) => isolated(p, pieces), text.length > 0 ? [text] : []);
      expect(scanned(scanDeepSeekV3, text)).toEqual(want);
    }),
    { numRuns: RUNS },
  );
});

test("the cl100k scanner splits as its regex, Qwen's single digits and Llama 3's runs of three", () => {
  const pattern = (digits: string) =>
    `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}${digits}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+`;
  for (const digits of ["", "{1,3}"]) {
    const max = cl100kDigits(pattern(digits))!;
    fc.assert(
      fc.property(dense, (text) => {
        expect(scanned((t, s, e, emit) => scanCl100k(t, s, e, max, emit), text)).toEqual(isolated(pattern(digits), text.length > 0 ? [text] : []));
      }),
      { numRuns: RUNS },
    );
  }
});

test("a scanner given a range of a longer text splits it as that range alone (nothing past its end is read)", () => {
  const range = fc.tuple(dense, dense, dense).filter(([, mid]) => mid.length > 0);
  fc.assert(
    fc.property(range, ([before, mid, after]) => {
      const text = before + mid + after;
      const [s, e] = [before.length, before.length + mid.length];
      expect(scanned(scanDeepSeekV3, text, s, e)).toEqual(scanned(scanDeepSeekV3, mid));
      expect(scanned((t, a, b, emit) => scanCl100k(t, a, b, 3, emit), text, s, e))
        .toEqual(scanned((t, a, b, emit) => scanCl100k(t, a, b, 3, emit), mid));
    }),
    { numRuns: RUNS },
  );
});
