import type { BlockHash, StoredBlock, WorkerRef } from "@kv-epp/protocol";

export type { StoredBlock, WorkerRef } from "@kv-epp/protocol";

/**
 * A stored event of the dump: applying the dump in order to an empty index rebuilds it. Blocks carry
 * `copies` when it is not 1 (0: on the path of held blocks, not held itself).
 */
export type DumpEvent = { worker: WorkerRef; parentHash: BlockHash | null; blocks: StoredBlock[] };

/**
 * unknown-parent: the parent hash is not held by that worker (event dropped whole).
 * hash-conflict: a block hash the worker already holds under another prefix (event cut there).
 */
export type RejectReason = "unknown-parent" | "hash-conflict";

/**
 * What a batch did: its events; `blocks` counts residencies added (stored) or dropped (removed: a
 * block's last copy; cleared); `unknown` counts removals of blocks the worker did not hold; `rejected`
 * stored events (see RejectReason).
 */
export type BatchOutcome = { events: number; blocks: number; unknown: number; rejected: number };

export type IndexStats = {
  /** distinct sequence identities (tree nodes) */
  blocks: number;
  /** (block, worker) pairs with at least one copy */
  residencies: number;
  workers: number;
  /** bytes of linear memory the index occupies */
  bytes: number;
  /** bytes held by live index structures (tables at their current capacity) */
  bytesInUse: number;
  /** table rebuilds since creation (growth or tombstone sweeps): each stops ingestion while it re-places every entry */
  tableRebuilds: number;
  /** stored events rejected (unknown parent or hash conflict), since creation */
  rejected: number;
  /** removals of blocks the worker did not hold, since creation */
  unknownRemovals: number;
};
