// The Unicode the reference knows (src/fast/reference-unicode.ts). Its pre-tokenizer: the code points Unicode added
// after Oniguruma's tables are pre-tokenized as the reference does: in contexts that tell a letter, a number, a
// mark, punctuation and whitespace apart, the fast BPE's ids equal the native binding's, for every code point of
// every listed range, in each tokenizer with a hand-written scanner. Its normalizers (Unicode 9.0): every code
// point they leave alone while Bun does not is normalized as they do, in every form and in Qwen3's ids, in probes
// that show a combining class, a decomposition or a composition, and in random text mixing them with marks.
// (scripts/reference-unicode.ts checks every assigned code point.)
import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { nfcNormalizer, nfdNormalizer, nfkcNormalizer, nfkdNormalizer } from "tokenizers";
import {
  normalizeAsReference,
  REFERENCE_NORMALIZER_UNKNOWN,
  REFERENCE_UNASSIGNED,
  unassignedForReference,
  unknownToReferenceNormalizer,
} from "../src/fast/reference-unicode";
import { fastAndReference, firstDifference, textArbitrary } from "./reference-tokenizers";

type Ranges = readonly (readonly [number, number])[];

const codePoints = (ranges: Ranges) => ranges.flatMap(([lo, hi]) => Array.from({ length: hi - lo + 1 }, (_, k) => lo + k));

function expectLookedUpExactly(ranges: Ranges, lookup: (cp: number) => boolean): void {
  for (let i = 1; i < ranges.length; i++) expect(ranges[i]![0]).toBeGreaterThan(ranges[i - 1]![1] + 1);
  for (const [lo, hi] of ranges) {
    expect(lookup(lo)).toBe(true);
    expect(lookup(hi)).toBe(true);
    expect(lookup(lo - 1)).toBe(false);
    expect(lookup(hi + 1)).toBe(false);
  }
}

/** Encodes `texts` in documents of 64 (one reference call each); throws on the first document whose ids differ. */
async function expectReferenceIds(model: "qwen3" | "llama3" | "deepseek_v3", texts: string[], separator: string): Promise<void> {
  const { fast, ref } = await fastAndReference(model);
  for (let i = 0; i < texts.length; i += 64) {
    const text = texts.slice(i, i + 64).join(separator);
    const at = firstDifference(fast.encode(text), await ref.encode(text));
    if (at >= 0) throw new Error(`${model}: ids differ at ${at} in ${JSON.stringify(text)}`);
  }
}

describe("Unicode the reference's pre-tokenizer does not know", () => {
  const probe = (cp: number) => {
    const ch = String.fromCodePoint(cp);
    return ` ${ch}\n \n${ch}1 ${ch}a'${ch}.${ch}${ch}\u0301`;
  };

  test("the list is sorted, disjoint, and looked up exactly", () => {
    expectLookedUpExactly(REFERENCE_UNASSIGNED, unassignedForReference);
  });

  for (const model of ["qwen3", "llama3", "deepseek_v3"] as const) {
    test(`${model}: every listed code point is pre-tokenized as the reference does`, async () => {
      await expectReferenceIds(model, codePoints(REFERENCE_UNASSIGNED).map(probe), "");
    }, 120_000);
  }
});

describe("Unicode the reference's normalizers (9.0) do not know", () => {
  const NORMALIZERS = { NFC: nfcNormalizer(), NFD: nfdNormalizer(), NFKC: nfkcNormalizer(), NFKD: nfkdNormalizer() };
  const listed = codePoints(REFERENCE_NORMALIZER_UNKNOWN).filter((cp) => !/\p{Cn}/u.test(String.fromCodePoint(cp)));
  // A starter to the reference: no decomposition, blocks a+U+0301 and lets no mark of another class move past it.
  const probes = (cp: number) => {
    const ch = String.fromCodePoint(cp);
    const nfd = ch.normalize("NFD");
    return [ch, `a${ch}\u0301`, `x\u0301${ch}`, `x${ch}\u0334`, `a${ch}\u0323`, ...(nfd === ch ? [] : [nfd])];
  };
  const reviewed = ["a\u1DF9\u0301", "x\u0301\u1DF9", "a\u07FD\u0301", "ا\u08D3\u0654", "\u{11935}\u{11930}"];

  test("the list is sorted, disjoint, and looked up exactly", () => {
    expectLookedUpExactly(REFERENCE_NORMALIZER_UNKNOWN, unknownToReferenceNormalizer);
  });

  test("marks and compositions newer than Unicode 9 are normalized as the reference does, in every form", () => {
    const texts = [...reviewed, ...listed.flatMap(probes)];
    for (const [form, normalizer] of Object.entries(NORMALIZERS)) {
      for (const text of texts) expect({ form, text, got: normalizeAsReference(text, form) }).toEqual({ form, text, got: normalizer.normalizeString(text) });
    }
  });

  test("qwen3 (NFC): ids equal the reference's on them", async () => {
    await expectReferenceIds("qwen3", [...reviewed, ...listed.flatMap(probes)], " ");
  }, 120_000);

  test("qwen3 (NFC): ids equal the reference's on random text mixing them with combining marks", async () => {
    const { fast, ref, added } = await fastAndReference("qwen3");
    const piece = fc.oneof(
      fc.constantFrom(...listed).map((cp) => String.fromCodePoint(cp)),
      fc.constantFrom("\u0301", "\u0316", "\u0323", "\u0334", "\u0345", "\u0307", "\u0654", "\u093c", "\u05b0", "\u1dce"),
      fc.constantFrom("a", "e", "x", "o", "ا", "\u0928", "\u{11935}", "\u{105d2}", "\u{1611e}", "\u{113c2}"),
      textArbitrary(added),
    );
    await fc.assert(
      fc.asyncProperty(fc.array(piece, { maxLength: 24 }).map((xs) => xs.join("")), async (text) => {
        const at = firstDifference(fast.encode(text), await ref.encode(text));
        if (at >= 0) throw new Error(`qwen3: ids differ at ${at} for text ${JSON.stringify(text)}`);
        for (const [form, normalizer] of Object.entries(NORMALIZERS)) {
          if (normalizeAsReference(text, form) !== normalizer.normalizeString(text)) throw new Error(`${form} differs for text ${JSON.stringify(text)}`);
        }
      }),
      { numRuns: 300 },
    );
  }, 120_000);
});
