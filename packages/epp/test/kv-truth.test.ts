import { expect, test } from "bun:test";
import { describeDiff, diffIndexViews, type IndexView } from "./kv-truth.ts";

const view = (entries: [string, [bigint, bigint | null, bigint, number][]][]): IndexView =>
  new Map(entries.map(([name, blocks]) => [name, new Map(blocks.map(([h, parent, tokensHash, copies]) => [h, { parent, tokensHash, copies }]))]));

test("equal views compare equal, and an empty rank equals an absent one", () => {
  const a = view([["w/0", [[2n ** 64n - 1n, null, 7n, 1]]], ["w/1", []]]);
  const b = view([["w/0", [[2n ** 64n - 1n, null, 7n, 1]]]]);
  expect(diffIndexViews(a, b)).toMatchObject({ equal: true, blocks: 1 });
});

test("missing, extra and differing blocks (parent, tokens hash, copies) are each counted", () => {
  const want = view([["w/0", [[1n, null, 10n, 1], [2n, 1n, 20n, 2], [3n, 2n, 30n, 1], [4n, null, 40n, 1]]]]);
  const got = view([["w/0", [[1n, null, 10n, 1], [2n, 1n, 20n, 1], [3n, 1n, 30n, 1]]], ["x/0", [[9n, null, 90n, 1]]]]);
  const d = diffIndexViews(want, got);
  expect(d).toMatchObject({ equal: false, missing: 1, extra: 1, differing: 2, blocks: 4, copies: 5 });
  expect(describeDiff(d)).toContain("x/0: extra block 9");
  // u64 values stay exact in the report.
  expect(describeDiff(diffIndexViews(view([["w/0", [[2n ** 64n - 1n, null, 1n, 1]]]]), new Map()))).toContain("18446744073709551615");
});
