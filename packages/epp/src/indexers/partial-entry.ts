// vLLM's partial prefix-cache entries (hybrid models served with --prefix-match-unit, vLLM #45939/#46384).
//
// With a match unit u smaller than a group's physical block size B, vLLM hashes every prompt at u
// granularity (each hash chains over the whole prefix; a B block's hash is the one at its last u
// boundary). A prompt whose cached tail ends inside a physical block gets a partial entry:
// BlockPool.cache_partial_block publishes BlockStored(block_hashes=[hash at the tail's end],
// parent_block_hash=hash one unit earlier, token_ids=the last u tokens, block_size=u, group_idx of the
// full-attention group). Nothing else marks it: it is a one-block store whose block_size is the unit.
//
// It is not indexed: the index matches in whole B blocks, and the entry's parent is usually a u
// boundary no event announced (vLLM's own open issue #58119; #58121, open, would add the skipped tokens),
// so the tokens from the block's start up to the entry are not on the wire. A request containing exactly
// those tokens is a partial hit on the engine but at most a fraction of one block for the overlap score,
// which counts blocks. Skipping it loses that fraction and nothing else: full stores chain to the
// previous physical boundary, never to a partial entry, and vLLM removes the partial hash on promotion
// or eviction with a BlockRemoved the index ignores as unknown. What matters is that it never defines the
// block size: arriving first (a warm-up, a health check) it used to switch the index to u.
//
// Judged by the group's block size once a full store showed it, else by the index's: an entry arriving
// first is recognised only when the configured block size is the physical one (vLLM's cache_config_info
// block_size), not the match unit; configured as the unit, it looks like a one-block store.
import type { BlockStored } from "@kv-epp/kv-events";

/**
 * A one-block store of a size that divides and is below `blockSize` (the store's group's block size as
 * its full stores showed it, else the index's): a partial entry. A multi-block store is never one, nor a
 * one-token store: a match unit is a full-attention block size (16, 32), while a one-token block is
 * SGLang's default --page-size 1 (a single-token radix node), refused as another block size is.
 */
export function isPartialEntry(e: BlockStored, blockSize: number): boolean {
  const u = e.blockSize;
  return e.blockHashes.length === 1 && u > 1 && e.tokenIds.length === u && u < blockSize && blockSize % u === 0;
}
