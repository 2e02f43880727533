import { expect, test } from "bun:test";
import fc from "fast-check";
import { AddedTokenMatcher } from "../src/fast/added-tokens";

type Part = { gap: string } | { token: number };

function split(m: AddedTokenMatcher, text: string): Part[] {
  const parts: Part[] = [];
  m.split(text, (s, e) => parts.push({ gap: text.slice(s, e) }), (token) => parts.push({ token }));
  return parts;
}

// Tokens sharing their first code unit take the indexOf search; one more token starting elsewhere (never in the
// text) makes the same set take the walk over every unit: both must split every text alike. A high surrogate
// first (emoji tokens) checks that the search works on code units, as the walk does.
test("the search for a shared first unit splits as the walk over every unit does", () => {
  for (const contents of [["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<"], ["😀a", "😀b", "😀", "\ud83d"]]) {
    const tokens = contents.map((content, id) => ({ content, id }));
    const searching = new AddedTokenMatcher(tokens);
    const walking = new AddedTokenMatcher([...tokens, { content: "\u0001never", id: 99 }]);
    const piece = fc.oneof(fc.constantFrom(...contents, "a", "b", " ", "<|", "😀", "\ud83d", "\ude00"), fc.string({ maxLength: 4 }));
    fc.assert(fc.property(fc.array(piece, { maxLength: 20 }).map((p) => p.join("").replaceAll("\u0001", "")), (text) => {
      expect(split(searching, text)).toEqual(split(walking, text));
    }), { numRuns: 500 });
  }
});
