import { expect, test } from "bun:test";
import type { BlockHash, StoredBlock, TokensHash } from "../src/index.ts";

// The type checker (`bunx tsc --noEmit -p .`) is this test's real judge: each @ts-expect-error line must
// stay an error, or the check fails.
test("a tokens hash is not a block hash and the other way round; plain bigints (wire values, literals) are either", () => {
  const block: BlockHash = 0xffff_ffff_ffff_ffffn;
  const tokens: TokensHash = 7n;
  // @ts-expect-error the engine's block hash where our tokens hash is wanted
  const wrongTokens: TokensHash = block;
  // @ts-expect-error our tokens hash where the engine's block hash is wanted
  const wrongBlock: BlockHash = tokens;
  // @ts-expect-error the two fields of a block swapped
  const swapped: StoredBlock = { blockHash: tokens, tokensHash: block };
  const fromWire: StoredBlock = { blockHash: BigInt("18446744073709551615"), tokensHash: new BigUint64Array([9n])[0]! };
  // at run time both are plain bigints
  expect([typeof block, typeof tokens, wrongTokens, wrongBlock, swapped.blockHash, fromWire.blockHash]).toEqual(["bigint", "bigint", block, tokens, tokens, 2n ** 64n - 1n]);
});
