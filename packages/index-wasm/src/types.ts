import type { StoredBlock, WorkerRef } from "@kv-epp/protocol";

// The index's events and results. Worker ranks (WorkerRef, workerKey) and blocks (StoredBlock: the
// engine's block hash and our tokens hash) are @kv-epp/protocol's: a live BlockStored stores one copy of
// each block; a dump carries the count, and 0 for a block the rank no longer holds whose hash still names
// the prefix of the blocks below.

export type IndexEvent =
  | { kind: "stored"; worker: WorkerRef; parentHash: bigint | null; blocks: StoredBlock[] }
  | { kind: "removed"; worker: WorkerRef; hashes: bigint[] }
  | { kind: "cleared"; worker: WorkerRef };

/**
 * A stored event of the dump: applying the dump in order to an empty index rebuilds it. Blocks carry
 * `copies` when it is not 1 (0: on the path of held blocks, not held itself).
 */
export type DumpEvent = { worker: WorkerRef; parentHash: bigint | null; blocks: StoredBlock[] };

/**
 * What one event did. `blocks` counts residencies added (stored) or dropped (removed: a block's last
 * copy); `unknown` counts removals of blocks the worker did not hold.
 */
export type ApplyOutcome =
  | { kind: "applied"; blocks: number; unknown: number }
  | { kind: "rejected"; reason: RejectReason; blocks: number };

/**
 * unknown-parent: the parent hash is not held by that worker (event dropped whole).
 * hash-conflict: a block hash the worker already holds under another prefix (event cut there).
 */
export type RejectReason = "unknown-parent" | "hash-conflict";

export type BatchOutcome = { events: number; blocks: number; unknown: number; rejected: number };

export type MatchResult = {
  /** workerKey → number of leading query blocks the worker holds (only workers with >= 1). */
  scores: Map<string, number>;
  /** workerKey → number of blocks the worker holds in this index (for the workers in `scores`). */
  treeSizes: Map<string, number>;
};

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
  /** stored events rejected (unknown parent or hash conflict), since creation */
  rejected: number;
  /** removals of blocks the worker did not hold, since creation */
  unknownRemovals: number;
};
