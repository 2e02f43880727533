// The `/dump` body's wire constants (docs/CONTRACTS.md §7), for the writers (recovery's TypeScript writer,
// the index's in-module JSON), the parser, the handler and the client.

export const DUMP_PATH = "/dump";
export const DUMP_CONTENT_TYPE = "application/json";

/**
 * The body's JSON field names: `{"<model>:<tenant>":{"block_size":n,"events":[RouterEvent...],"cursors":[...]}}`,
 * a RouterEvent `{"worker_id":s,"event":{"event_id":n,"data":{"stored":{"parent_hash":h|null,"blocks":[
 * {"block_hash":h,"tokens_hash":h,"copies":n}...]}}},"dp_rank":n}` and a cursor
 * `{"worker_id":s,"dp_rank":n,"seq":h|null,"baseline":h|null,"complete":b}`.
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
} as const;

/** Target size of one chunk the recovery writer emits (a large event may make one bigger). */
export const DUMP_CHUNK_BYTES = 64 * 1024;

/** Default chunk size of the index's in-module JSON (KvIndex.dumpJsonChunks). */
export const DUMP_JSON_CHUNK_BYTES = 256 * 1024;
