import type { ExtraKeyValue } from "@kv-epp/kv-events";
import type { WorkerRole } from "@kv-epp/protocol";
import type { RankParts } from "../faults.ts";

/**
 * `GET /admin/cache`: what every rank really holds, read in one synchronous step per request so each
 * rank's blocks and its `next_seq` agree (the blocks are the cache after the batch `next_seq - 1`, unless
 * publishing is paused or a batch failed to send). u64 hashes are exact decimal strings (JSON numbers
 * lose everything above 2^53); they are the values `/dump` and the index carry (int mode publishes them,
 * bytes mode publishes digests that fold back to them).
 */

export type TruthBlock = {
  block_hash: string;
  parent_hash: string | null;
  /** The block's tokens: a consumer derives its own local hash from them. */
  token_ids: number[];
  /** vLLM's extra keys of the block (LoRA name, media pairs, salt on a root block); null when none. */
  extra_keys: ExtraKeyValue[] | null;
  copies: number;
};
export type TruthRank = { rank: number; next_seq: string; paused: boolean; restarts: number; blocks: TruthBlock[] };
/** `role`: the worker's P/D role (`--role`; null without one), so a test can hold each role's caches to its own index. */
export type CacheTruth = { role: WorkerRole | null; block_size: number; capacity_blocks: number; ranks: TruthRank[] };

export function cacheTruth(ranks: readonly RankParts[], role: WorkerRole | undefined): CacheTruth {
  const first = ranks[0]!.engine.cache;
  return {
    role: role ?? null,
    block_size: first.blockSize,
    capacity_blocks: first.capacityBlocks,
    ranks: ranks.map(({ engine, events }) => {
      const s = events.state();
      return {
        rank: engine.rank,
        next_seq: s.nextSeq,
        paused: s.paused,
        restarts: s.restarts,
        blocks: engine.cache.snapshot().map((b) => ({
          block_hash: b.hash.toString(),
          parent_hash: b.parent === null ? null : b.parent.toString(),
          token_ids: Array.from(b.tokenIds),
          extra_keys: b.extraKeys,
          copies: b.copies,
        })),
      };
    }),
  };
}
