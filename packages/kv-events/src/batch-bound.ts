// How large one KV-event message can really be, so the listener's bound admits every real batch.
//
// vLLM publishes one KVEventBatch per engine step (the scheduler takes the block pool's event queue
// each step). A step may compute up to max_num_batched_tokens tokens, and nothing stops an operator
// from setting that at the model's context (a ~1M-token prompt prefilled in one step; libzmq has no
// message size limit of its own). For T tokens that step's batch holds, per KV cache group that
// publishes (a hybrid model's full-attention and sliding-window groups each publish their own stores):
//  - the stores' token_ids: up to 5 bytes a token (uint32 ids, vocabularies past 65535);
//  - per block of B tokens: its hash (9 bytes as an int, 34 as a 32-byte digest), its extra_keys entry
//    (nil, or a LoRA name, salt, multimodal identifiers: `extraKeyBytes`);
//  - per block evicted to make room: one BlockRemoved map of its own (`{type, block_hashes: [h],
//    medium, group_idx}`: 55 bytes of keys, tag and values besides the hash).
// The per-event fixed parts (keys of a store, the batch header) are small against these and are
// covered by a per-block allowance. With kv_cache_report_mode "full" a step also re-announces the
// prefix it reused, which is bounded by the same T when T is taken as the context length.
export type BatchShape = {
  /** Tokens whose blocks one batch can announce (a step's new and re-announced tokens). */
  tokens: number;
  /** The smallest block size in use (more blocks: more per-block bytes). */
  blockSize: number;
  /** KV cache groups that publish their own events. */
  groups: number;
  /** Bytes of one hash on the wire: 9 (u64 int) or 34 (32-byte digest as bin 8). */
  hashBytes: number;
  /** Bytes of one block's extra_keys entry. */
  extraKeyBytes: number;
};

const TOKEN_BYTES = 5;
const REMOVED_EVENT_BYTES = 55;
const PER_BLOCK_ALLOWANCE = 16;

/** The largest batch `shape` describes, in bytes. */
export function batchBound(s: BatchShape): number {
  const blocks = Math.ceil(s.tokens / s.blockSize);
  const perBlock = s.hashBytes + s.extraKeyBytes + (REMOVED_EVENT_BYTES + s.hashBytes) + PER_BLOCK_ALLOWANCE;
  return s.groups * (s.tokens * TOKEN_BYTES + blocks * perBlock);
}

/**
 * The batch the listener must admit by default: a 1M-token (2^20) step of a hybrid model (two groups
 * publishing), 16-token blocks, bytes-mode hashes, 64-byte extra keys on every block (a LoRA name and a
 * multimodal identifier), and as many evictions as stores: 2 x (5 MiB + 65536 x 203 B) ≈ 35.4 MiB.
 */
export const REFERENCE_STEP: BatchShape = { tokens: 2 ** 20, blockSize: 16, groups: 2, hashBytes: 34, extraKeyBytes: 64 };

/**
 * The listener's default bound: REFERENCE_STEP rounded up to a power of two (64 MiB). It costs nothing
 * until a message that large arrives (the parser grows a large frame's buffer as its bytes arrive, never
 * at the size a header declares), so the bound on memory is this times the ranks receiving such a
 * message at once; --kv-max-message-bytes lowers or raises it.
 */
export const DEFAULT_KV_MAX_MESSAGE_SIZE = 2 ** Math.ceil(Math.log2(batchBound(REFERENCE_STEP)));
