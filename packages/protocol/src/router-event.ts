import type { BlockHash, StoredBlock } from "./hashes.ts";
import type { WorkerRef } from "./rank.ts";

/** One `stored` event of a `/dump` body (docs/CONTRACTS.md §7): blocks a rank holds, under a parent. */
export type RouterEvent = WorkerRef & {
  eventId: number;
  parentHash: BlockHash | null;
  blocks: StoredBlock[];
};

/**
 * Where a replica's view of one rank stands in that rank's KV-event stream, read together with the
 * rank's blocks: `seq` is the last batch applied (null: none yet); `complete` says the view has followed
 * the stream without an unrepaired gap, reset or restart since `baseline`, the seq from which it is known
 * to equal the worker's cache (its first batch 0, an AllBlocksCleared, or a peer's complete cursor it
 * recovered from). `epoch`: the publisher's lifetime id of the stream `seq` belongs to, null when its
 * publisher sends none (vLLM today) or no batch was applied yet; another epoch is another process.
 */
export type StreamCursor = WorkerRef & { seq: bigint | null; baseline: bigint | null; complete: boolean; epoch: string | null };
