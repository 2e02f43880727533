// Public entry of @kv-epp/index-wasm: the KV index (WebAssembly over linear memory) and block identity.
// Convenience forms for tests and the simulation: ./helpers.ts (`@kv-epp/index-wasm/helpers`); the
// request-body JSON scanner, a module of its own: ./json.ts (`@kv-epp/index-wasm/json`).
export type { BatchOutcome, DumpEvent, IndexStats, RejectReason, StoredBlock, WorkerRef } from "./types.ts";
export { KvIndex, IndexTrappedError, MAX_RESERVE } from "./kv-index.ts";
export type { StoredBatchBuilder } from "./batch-builder.ts";
export { MatchList } from "./match-list.ts";
export { computeBlockHashes, BLOCK_HASH_SEED, type BlockTokens } from "./block-hash.ts";
export {
  encodeExtraKeys, eventBlockExtras, requestBlockExtras,
  type BlockExtraKeys, type BlockExtras, type ExtraKey, type MmExtraKey, type MmItem,
} from "./extra-keys.ts";
export { fromWireExtraKeys, newExtraKeyTally, type ExtraKeyTally } from "./wire-extra-keys.ts";
