// Convenience forms over KvIndex's one face, for tests, benches and the simulation (`@kv-epp/index-wasm/helpers`):
// events as objects in, matches as Maps out. Each is the face underneath (the batch builder,
// findMatchesInto), so what they observe is what production callers get; the EPP does not use them.
import type { BlockHash } from "@kv-epp/protocol";
import type { KvIndex } from "./kv-index.ts";
import { MatchList } from "./match-list.ts";
import type { BatchOutcome, RejectReason, StoredBlock, WorkerRef } from "./types.ts";

export type IndexEvent =
  | { kind: "stored"; worker: WorkerRef; parentHash: BlockHash | null; blocks: StoredBlock[] }
  | { kind: "removed"; worker: WorkerRef; hashes: BlockHash[] }
  | { kind: "cleared"; worker: WorkerRef };

/**
 * What one event did. `blocks` counts residencies added (stored) or dropped (removed: a block's last
 * copy); `unknown` counts removals of blocks the worker did not hold.
 */
export type ApplyOutcome =
  | { kind: "applied"; blocks: number; unknown: number }
  | { kind: "rejected"; reason: RejectReason; blocks: number };

export type MatchResult = {
  /** workerKey → number of leading query blocks the worker holds (only workers with >= 1). */
  scores: Map<string, number>;
  /** workerKey → number of blocks the worker holds in this index (for the workers in `scores`). */
  treeSizes: Map<string, number>;
};

/** Adds events, as objects, to the index's batch builder (not applied yet). */
export function addEvents(b: ReturnType<KvIndex["batch"]>, events: readonly IndexEvent[]): void {
  for (const e of events) {
    if (e.kind === "stored") {
      const { blocks } = e;
      const copies = blocks.some((x) => x.copies !== undefined && x.copies !== 1) ? blocks.map((x) => x.copies ?? 1) : undefined;
      b.stored(e.worker, e.parentHash, blocks.map((x) => x.blockHash), blocks.map((x) => x.tokensHash), copies);
    } else if (e.kind === "removed") b.removed(e.worker, e.hashes);
    else b.cleared(e.worker);
  }
}

/** Applies events in one batch; `events` counts every event given (a clear of an unknown worker is one). */
export function applyEvents(index: KvIndex, events: readonly IndexEvent[]): BatchOutcome {
  const b = index.batch();
  if (b.events > 0) throw new Error("applyEvents: the index's batch builder has events pending");
  addEvents(b, events);
  return { ...b.apply(), events: events.length };
}

/** One event as its own batch, with its outcome. */
export function applyEvent(index: KvIndex, e: IndexEvent): ApplyOutcome {
  const b = index.batch();
  const r = applyEvents(index, [e]);
  if (r.rejected > 0) return { kind: "rejected", reason: b.rejectReason!, blocks: r.blocks };
  return { kind: "applied", blocks: r.blocks, unknown: r.unknown };
}

export function applyStored(index: KvIndex, w: WorkerRef, parentHash: BlockHash | null, blocks: StoredBlock[]): ApplyOutcome {
  return applyEvent(index, { kind: "stored", worker: w, parentHash, blocks });
}

export function applyRemoved(index: KvIndex, w: WorkerRef, hashes: BlockHash[]): ApplyOutcome {
  return applyEvent(index, { kind: "removed", worker: w, hashes });
}

const list = new MatchList();

/** findMatchesInto as two fresh Maps keyed by workerKey (allocates: not for the request path). */
export function findMatches(index: KvIndex, query: Parameters<KvIndex["findMatchesInto"]>[0]): MatchResult {
  index.findMatchesInto(query, list);
  return list.toMaps();
}
