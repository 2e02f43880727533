// The code points Unicode added after the reference's tables (src/fast/reference-unicode.ts) are pre-tokenized as
// the reference does: in contexts that tell a letter, a number, a mark, punctuation and whitespace apart, the fast
// BPE's ids equal the native binding's, for every code point of every listed range, in each tokenizer with a
// hand-written scanner (scripts/reference-unicode.ts checks every assigned code point).
import { describe, expect, test } from "bun:test";
import { REFERENCE_UNASSIGNED, unassignedForReference } from "../src/fast/reference-unicode";
import { fastAndReference, firstDifference } from "./reference-tokenizers";

const probe = (cp: number) => {
  const ch = String.fromCodePoint(cp);
  return ` ${ch}\n \n${ch}1 ${ch}a'${ch}.${ch}${ch}\u0301`;
};

describe("Unicode the reference does not know", () => {
  test("the list is sorted, disjoint, and looked up exactly", () => {
    for (let i = 1; i < REFERENCE_UNASSIGNED.length; i++) expect(REFERENCE_UNASSIGNED[i]![0]).toBeGreaterThan(REFERENCE_UNASSIGNED[i - 1]![1] + 1);
    for (const [lo, hi] of REFERENCE_UNASSIGNED) {
      expect(unassignedForReference(lo)).toBe(true);
      expect(unassignedForReference(hi)).toBe(true);
      expect(unassignedForReference(lo - 1)).toBe(false);
      expect(unassignedForReference(hi + 1)).toBe(false);
    }
  });

  for (const model of ["qwen3", "llama3", "deepseek_v3"] as const) {
    test(`${model}: every listed code point is pre-tokenized as the reference does`, async () => {
      const { fast, ref } = await fastAndReference(model);
      const cps = REFERENCE_UNASSIGNED.flatMap(([lo, hi]) => Array.from({ length: hi - lo + 1 }, (_, k) => lo + k));
      // In documents of 64 probes each: one reference call per document.
      for (let i = 0; i < cps.length; i += 64) {
        const text = cps.slice(i, i + 64).map(probe).join("");
        const want = await ref.encode(text);
        const got = fast.encode(text);
        const at = firstDifference(got, want);
        if (at >= 0) throw new Error(`${model}: ids differ at ${at} in ${JSON.stringify(text)}`);
      }
    }, 120_000);
  }
});
