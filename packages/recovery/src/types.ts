import type { RouterEvent, StreamCursor, WorkerRef } from "@kv-epp/protocol";

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

/** The sizes a binary dump announces for a model: a hint from the peer, never trusted to size memory unchecked. */
export type DumpSizes = { blocks: number; residencies: number };

/** What a model's dump carries beside its events, each part when the dump has it. */
export type DumpExtras = { cursors?: StreamCursor[]; adapters?: string[] };

/**
 * One attempt's staging. Whatever the body (JSON or binary), its content arrives the same way: per model
 * `model` once, before its events, then its events as runs of one worker rank each (event-run.ts: the binary
 * event layout, which KvIndex.applyDumpEvents applies in one call), then its extras. Calls of one model come
 * in body order; a throw fails the attempt (reason "apply") and the staging is aborted.
 */
export interface DumpStaging {
  /** false for a model this replica does not serve: its whole object is skipped unparsed (nothing staged or remembered). */
  accepts(key: string): boolean;
  /** A model's block size, before its events; `sizes` when the body announces them (presize within budget only). */
  model(key: string, blockSize: number, sizes?: DumpSizes): void;
  /** A run of whole stored events of one worker rank of a model begun; the bytes are valid during the call only. */
  events(key: string, worker: WorkerRef, run: Uint8Array): void;
  /** A model's stream cursors or LoRA adapter names, after its events. */
  extras(key: string, extras: DumpExtras): void;
  /** Bytes this staging holds now (e.g. its indexes' linear memory): checked against the budget after every chunk. */
  stagedBytes(): number;
  commit(): void;
  abort(): void;
}

/**
 * The `/dump` body a client asks for: "binary" (the default) prefers the binary body and still takes JSON
 * from a peer that only speaks JSON; "json" asks for JSON only, as a client from before the binary body did.
 */
export type DumpFormat = "binary" | "json";

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
