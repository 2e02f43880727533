import { expect, test } from "bun:test";
import fc from "fast-check";
import { overlappingContents } from "../src/segmenter";

// The definition, pair by pair: containment, or a proper suffix of one equal to a proper prefix of the other.
function overlapsPairwise(a: string, b: string): boolean {
  if (a.includes(b) || b.includes(a)) return true;
  for (let k = 1; k < Math.min(a.length, b.length); k++) if (a.endsWith(b.slice(0, k)) || b.endsWith(a.slice(0, k))) return true;
  return false;
}

test("the indexed overlap check finds exactly the added tokens the pairwise definition finds", () => {
  const token = fc.string({ unit: fc.constantFrom("<", ">", "|", "a", "b", "_"), maxLength: 6 });
  fc.assert(fc.property(fc.array(token, { maxLength: 12 }), (contents) => {
    const expected = new Set(contents.filter((t) => contents.some((o) => o !== t && overlapsPairwise(o, t))));
    expect(overlappingContents(contents)).toEqual(expected);
  }), { numRuns: 500 });
});
