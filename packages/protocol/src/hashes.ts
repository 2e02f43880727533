// The two hashes a block has. Both are u64 and always bigint in TypeScript, never a JS number (a
// double loses bits above 2^53).
//
// Each is a bigint tagged with its kind, so the compiler tells them apart: a TokensHash passed where a
// BlockHash is wanted (or the other way round) is a type error. The tag is optional: a plain bigint (a
// literal, a decoded wire value, an element of a BigUint64Array) is accepted as either, since the place
// that reads it from the wire or a typed array is the one that knows which hash it is. Nothing exists at
// run time; both are bigints.

declare const hashKind: unique symbol;

/**
 * The engine's hash of a block: vLLM's opaque `block_hash` from its KV events (its own hash of the
 * parent hash, tokens and extra keys). It names a block only among one rank's blocks.
 */
export type BlockHash = bigint & { readonly [hashKind]?: "block" };

/**
 * Our hash of a block's tokens, chained over its prefix (XXH3 in index-wasm): what a request's token
 * ids hash to, so a request can be matched to blocks whatever engine hash they were stored under.
 */
export type TokensHash = bigint & { readonly [hashKind]?: "tokens" };

/**
 * One full block as a rank stores it. `copies` (absent: 1) is how many copies the rank holds; 0 in a
 * dump: a block the rank no longer holds whose hash still names the prefix of the held blocks below it.
 */
export type StoredBlock = { blockHash: BlockHash; tokensHash: TokensHash; copies?: number };
