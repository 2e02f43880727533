import type { RouterEvent, StreamCursor, WorkerRef } from "@kv-epp/protocol";
import type { DumpBatch } from "./dump/batch.ts";

// The narrow interface through which recovery sees the index (docs/ARCHITECTURE.md: recovery knows the index only
// through "apply events, dump events"). u64 values are always bigint, never JS numbers (docs/CONTRACTS.md §3).
// The events and cursors themselves (RouterEvent, StoredBlock, StreamCursor) are @kv-epp/protocol's.

/**
 * One indexer as the dump sees it: `"<model>:<tenant>"`, its block size, its events parents-first.
 * `eventsJson`, when present, is used by the writer instead of `events`: the same events already as JSON
 * bytes, exactly as the writer would format them (compact RouterEvents separated by commas, no enclosing
 * brackets, event_id from 0), in chunks of about `chunkBytes`. KvIndex.dumpJsonChunks({ chunkBytes })
 * produces exactly that from inside the WASM module (measured: the sender's bottleneck otherwise).
 */
export type DumpModel = {
  key: string;
  blockSize: number;
  events: Iterable<RouterEvent>;
  eventsJson?: (chunkBytes: number) => Iterable<Uint8Array>;
  /**
   * The model's stream cursors, asked for once its events have been produced (each rank's cursor read
   * when that rank's blocks were). Absent: the dump carries no `cursors` for this model.
   */
  cursors?: () => Iterable<StreamCursor>;
  /**
   * The binary body's fast path (KvIndex.dumpBinaryChunks): for each worker rank with blocks its ref, then
   * runs of whole stored events in the binary layout (docs/CONTRACTS.md §7 "binary"). Absent: the binary
   * writer encodes `events`.
   */
  eventsBinary?: (chunkBytes: number) => Iterable<WorkerRef | Uint8Array>;
  /** Blocks and residencies the model holds now: announced in the binary body so a receiver may presize. */
  sizes?: () => { blocks: number; residencies: number };
  /** LoRA adapter names the producer serves this model's blocks under (learned from events' lora_name). */
  adapters?: () => Iterable<string>;
};

/** Producer side. Iterated lazily while the body streams, so the iterables may interleave with live writes. */
export interface DumpSource {
  models(): Iterable<DumpModel>;
}

/** Consumer side: a fresh staging area per attempt, so a failed attempt leaves the index as it was. */
export interface DumpTarget {
  begin(): DumpStaging;
}

export interface DumpStaging {
  apply(key: string, blockSize: number, e: RouterEvent): void;
  /**
   * Optional fast path: when present, the dump client hands most events over in typed batches (hashes in
   * BigUint64Arrays, a few hundred events per call, in order) instead of one `apply` each; `apply` still
   * receives the rare events that precede their model's block_size, always before that model's batches.
   * The batch is reused: read it during the call only.
   */
  applyBatch?(key: string, blockSize: number, batch: DumpBatch): void;
  /** A model's `cursors`, once per model that has them (never for a dump from a producer without). */
  cursors?(key: string, cursors: StreamCursor[]): void;
  /**
   * Optional bulk path of a binary dump: a run of whole stored events of one worker rank in the wire layout
   * (headers already checked by the parser), e.g. for KvIndex.applyDumpEvents. Valid during the call only.
   * Without it a binary dump's events arrive through `apply`.
   */
  applyEvents?(key: string, blockSize: number, worker: WorkerRef, events: Uint8Array): void;
  /**
   * Optional: the sizes a binary dump announces for a model, before its events. A hint from the peer: a
   * staging may presize from it, within its own budget, never beyond.
   */
  expect?(key: string, blockSize: number, sizes: { blocks: number; residencies: number }): void;
  /** A model's LoRA adapter names, when the dump has them. */
  adapters?(key: string, names: string[]): void;
  /**
   * Optional: false for a model this replica does not serve. Its whole object is skipped by the parser
   * (nothing staged, nothing remembered), so extra models in a dump cost no memory.
   */
  accepts?(key: string): boolean;
  /**
   * Optional: bytes this staging holds now (e.g. the linear memory of its indexes). The dump client
   * checks it against its budget after every chunk and fails the attempt past it.
   */
  stagedBytes?(): number;
  commit(): void;
  abort(): void;
}

/** A recovery peer: `id` is stable across updates (the endpoint address), `url` the selection-http base URL. */
export type Peer = { id: string; url: string };

/** Why a replica starts empty although recovery was configured. */
export type EmptyBootstrapReason = "no_serving_peer" | "all_peers_left" | "peers_failing" | "deadline";

export type RecoveryOutcome =
  | { kind: "recovered"; peer: string; events: number; bytes: number; ms: number }
  | { kind: "empty_bootstrap"; reason: EmptyBootstrapReason }
  | { kind: "recovery_disabled" };

export type RecoveryStateName = RecoveryOutcome["kind"];
export const RECOVERY_STATES: readonly RecoveryStateName[] = ["recovered", "empty_bootstrap", "recovery_disabled"];
