// vLLM KV-event batch as this repo sees it. Field names follow vLLM's kv_events.py
// (BlockStored / BlockRemoved / AllBlocksCleared inside a KVEventBatch), camel-cased.
// Every block hash is a u64 BigInt: int hashes arrive as msgpack ints (possibly >= 2^63
// or negative in old versions: folded with asUintN(64)); bytes hashes fold to the low
// 64 bits of the big-endian digest.

/** Where the block lives. Absent (null) means GPU. Newer tiers pass through as strings. */
export type Medium = "GPU" | "CPU" | "STORAGE" | (string & {});

export type BlockStored = {
  type: "BlockStored";
  blockHashes: bigint[];
  parentBlockHash: bigint | null;
  tokenIds: number[];
  blockSize: number;
  loraId: number | null;
  medium: Medium | null;
  loraName?: string | null;
  extraKeys?: unknown;
  groupIdx?: number | null;
  kvCacheSpecKind?: string | null;
  kvCacheSpecSlidingWindow?: number | null;
};

export type BlockRemoved = {
  type: "BlockRemoved";
  blockHashes: bigint[];
  medium: Medium | null;
  groupIdx?: number | null;
};

export type AllBlocksCleared = { type: "AllBlocksCleared" };

export type KvEvent = BlockStored | BlockRemoved | AllBlocksCleared;

export type KvEventBatch = { ts: number; events: KvEvent[]; dataParallelRank: number | null };

/** Which msgpack shape to emit: vLLM's array_like structs, or newer vLLM's maps. */
export type EventEncoding = "array" | "map";
/** How block hashes are emitted: msgpack ints (u64) or bytes (32-byte digest). */
export type HashMode = "int" | "bytes";

export class KvDecodeError extends Error {
  override name = "KvDecodeError";
}

/** Mutable tally the decoder bumps for events it skips (unknown tag, malformed fields). */
export type DecodeStats = { skippedEvents: number };
