// The `/dump` body's wire constants (docs/CONTRACTS.md §7), for the writers (recovery's TypeScript writer,
// the index's in-module JSON), the parser, the handler and the client.

export const DUMP_PATH = "/dump";
export const DUMP_CONTENT_TYPE = "application/json";

/**
 * The body's JSON field names: `{"<model>:<tenant>":{"block_size":n,"events":[RouterEvent...],"cursors":[...]}}`,
 * a RouterEvent `{"worker_id":s,"event":{"event_id":n,"data":{"stored":{"parent_hash":h|null,"blocks":[
 * {"block_hash":h,"tokens_hash":h,"copies":n}...]}}},"dp_rank":n}` and a cursor
 * `{"worker_id":s,"dp_rank":n,"seq":h|null,"baseline":h|null,"complete":b,"epoch":s}` (`epoch` only when known).
 */
export const DUMP_FIELDS = {
  blockSize: "block_size",
  events: "events",
  cursors: "cursors",
  workerId: "worker_id",
  dpRank: "dp_rank",
  event: "event",
  eventId: "event_id",
  data: "data",
  stored: "stored",
  parentHash: "parent_hash",
  blocks: "blocks",
  blockHash: "block_hash",
  tokensHash: "tokens_hash",
  copies: "copies",
  seq: "seq",
  baseline: "baseline",
  complete: "complete",
  epoch: "epoch",
  adapters: "adapters",
} as const;

/**
 * The binary `/dump` body (docs/CONTRACTS.md §7 "binary"), served when the request's Accept names it: the
 * magic, then frames of `type u32 | length u32 | payload` (little-endian), an END frame last. Unknown frame
 * types are skipped by length, as unknown JSON keys are.
 */
export const DUMP_BINARY_CONTENT_TYPE = "application/vnd.kv-epp.dump.v1";
export const DUMP_BINARY_MAGIC = "KVDUMP\u0000\u0001";
export const DUMP_FRAME = { model: 1, worker: 2, events: 3, cursors: 4, adapters: 5, cursorEpochs: 6, end: 15 } as const;
/** Flags of a binary stored event's header word (low u32; the high u32 is the block count). */
export const DUMP_EVENT_FLAGS = { hasParent: 1, hasCopies: 2 } as const;
/** Flags of a binary cursor entry. */
export const DUMP_CURSOR_FLAGS = { complete: 1, seq: 2, baseline: 4 } as const;

/** Target size of one chunk the recovery writer emits (a large event may make one bigger). */
export const DUMP_CHUNK_BYTES = 64 * 1024;

/** Default chunk size of the index's in-module JSON (KvIndex.dumpJsonChunks). */
export const DUMP_JSON_CHUNK_BYTES = 256 * 1024;
