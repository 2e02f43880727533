// vLLM KV-event batch as this repo sees it. Field names follow vLLM's kv_events.py
// (BlockStored / BlockRemoved / AllBlocksCleared inside a KVEventBatch), camel-cased.
// Every block hash is a u64 BigInt: int hashes arrive as msgpack ints (possibly >= 2^63
// or negative in old versions: folded with asUintN(64)); bytes hashes fold to the low
// 64 bits of the big-endian digest.

import type { BlockHash } from "@kv-epp/protocol";

/** Where the block lives. Absent (null) means GPU. Compared case-insensitively (isGpuMedium). */
export type Medium = "GPU" | "CPU" | "STORAGE" | (string & {});

/**
 * One entry of a block's extra keys as msgpack carries it: vLLM writes the LoRA name and the cache
 * salt as strings, a multimodal item as its identifier or an (identifier, block-relative offset)
 * tuple, a prompt-embeds digest as bytes. 64-bit msgpack ints arrive as bigint.
 */
export type ExtraKeyValue = string | number | bigint | boolean | null | Uint8Array | ExtraKeyValue[] | { [k: string]: ExtraKeyValue };
/** vLLM's `extra_keys`: one entry per block of `block_hashes`, null for a block without any. */
export type ExtraKeys = (ExtraKeyValue[] | null)[];

export type BlockStored = {
  type: "BlockStored";
  blockHashes: BlockHash[];
  parentBlockHash: BlockHash | null;
  tokenIds: number[];
  /** 0 with no tokens: an offloading connector's hash-only placeholder (vLLM #43468). */
  blockSize: number;
  loraId: number | null;
  medium: Medium | null;
  loraName?: string | null;
  extraKeys?: ExtraKeys | null;
  groupIdx?: number | null;
  kvCacheSpecKind?: string | null;
  kvCacheSpecSlidingWindow?: number | null;
  /** "LOCAL" | "REMOTE" on offload tiers (vLLM #48281). */
  locality?: string | null;
  /** The secondary offloading tier that published it (vLLM #52067); absent: the engine's own cache. */
  ownership?: string | null;
  /**
   * TensorRT-LLM's multimodal keys (its streaming KV events, TensorRT-LLM #17023): per block, the
   * multimodal segments it holds. vLLM puts these in extraKeys instead.
   */
  mmKeys?: (MmKey[] | null)[] | null;
  /** The request that caused the store (vLLM #51381, SGLang metadata); not part of identity. */
  sessionId?: string | null;
  /** SGLang's salt: its top-level `cache_salt` or `metadata.cache_salt` (vLLM puts it in extraKeys[0]). */
  cacheSalt?: string | null;
  /**
   * Set when `token_ids` came as SGLang's EAGLE bigram pairs `[[t0,t1],[t1,t2],..,[tn-1,tn]]` (its radix
   * keys under EAGLE/EAGLE3/NEXTN/MTP speculative decoding): `tokenIds` holds the pairs' first tokens
   * (t0..tn-1, one per position, as plain requests are tokenized) and this the last pair's second, the
   * token after the event's blocks. Encoders writing an SGLang shape write bigram pairs when it is set.
   */
  bigramNextTokenId?: number;
};

export type BlockRemoved = {
  type: "BlockRemoved";
  blockHashes: BlockHash[];
  medium: Medium | null;
  groupIdx?: number | null;
  locality?: string | null;
  ownership?: string | null;
};

/** One multimodal segment of a block (TensorRT-LLM's tagged `mm_key` struct): content hash (hex), block-relative start. */
export type MmKey = { hash: string; startOffset: number; uuid: string | null };

export type AllBlocksCleared = { type: "AllBlocksCleared" };

export type KvEvent = BlockStored | BlockRemoved | AllBlocksCleared;

export type KvEventBatch = { ts: number; events: KvEvent[]; dataParallelRank: number | null };

/**
 * Which wire shape to emit (test/fixtures/README.md names the versions):
 * - `vllm`: today's vLLM, an array batch `[ts, events, data_parallel_rank]` whose events are tagged maps
 *   with default-valued optional fields omitted;
 * - `vllm-map`: a map batch too (the structs without `array_like` at all);
 * - `vllm-array`: older vLLM, `array_like` everywhere: every field written, defaults included (msgspec#720);
 * - `sglang-map`: SGLang today, an array batch `[ts, events, attn_dp_rank]` whose events are tagged maps
 *   (medium, cache_salt and session_id only when set);
 * - `sglang`: older SGLang's array_like structs (7-element BlockStored, a metadata map at position 7 when salted).
 */
export type EventEncoding = "vllm" | "vllm-map" | "vllm-array" | "sglang-map" | "sglang";
export const EVENT_ENCODINGS: readonly EventEncoding[] = ["vllm", "vllm-map", "vllm-array", "sglang-map", "sglang"];
/** How block hashes are emitted: msgpack ints (u64) or bytes (32-byte digest). */
export type HashMode = "int" | "bytes";

export class KvDecodeError extends Error {
  override name = "KvDecodeError";
}

/**
 * Mutable tally the decoder bumps. `skippedEvents` = `unknownTypes` + `malformedEvents` (events dropped
 * from a batch that is otherwise applied); `unknownFields` counts map keys and array positions past the
 * ones this codec knows, read and skipped (newer producers add fields: never a reason to drop).
 */
export type DecodeStats = { skippedEvents: number; unknownTypes: number; malformedEvents: number; unknownFields: number };

/** Why the decoder dropped an event (the EPP's dynamo_epp_kv_events_dropped_total{reason}). */
export type DropReason = "unknown_type" | "malformed";

export function newDecodeStats(): DecodeStats {
  return { skippedEvents: 0, unknownTypes: 0, malformedEvents: 0, unknownFields: 0 };
}

/** GPU residency: a null medium, or "GPU" in any case (vLLM writes "GPU", other producers vary). */
export function isGpuMedium(m: Medium | null | undefined): boolean {
  return m == null || m === "GPU" || m.toUpperCase() === "GPU";
}
