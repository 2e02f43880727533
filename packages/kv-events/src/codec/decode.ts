// Decoder for vLLM's KVEventBatch payloads (msgpack), both encodings:
//  - array (msgspec array_like=True): [ts, events, data_parallel_rank?], events tagged as ["BlockStored", ...]
//  - map (newer vLLM): {ts, events, data_parallel_rank?}, events as {type: "BlockStored", ...}
// Optional trailing fields may be missing (msgspec omit_defaults). Unknown tags and malformed
// events are skipped and counted in DecodeStats; a malformed batch throws KvDecodeError.
import { Unpackr } from "msgpackr";
import { decodeFast } from "./fast-decode.ts";
import { toHash } from "./hash.ts";
import {
  type BlockRemoved,
  type BlockStored,
  type DecodeStats,
  type KvEvent,
  type KvEventBatch,
  KvDecodeError,
  type Medium,
} from "./types.ts";

// int64AsType "bigint": u64 / i64 msgpack values decode exactly (never as lossy doubles).
// useRecords false + mapsAsObjects: plain msgpack, maps as objects (keys are strings in vLLM).
const unpackr = new Unpackr({ int64AsType: "bigint", useRecords: false, mapsAsObjects: true, moreTypes: false });

const NO_STATS: DecodeStats = { skippedEvents: 0 };

/** Decodes one KVEventBatch payload; throws KvDecodeError when the batch itself is malformed. */
export function decodeBatch(payload: Uint8Array, stats: DecodeStats = NO_STATS): KvEventBatch {
  return decodeFast(payload) ?? decodeGeneric(payload, stats);
}

/** The msgpackr path: any well-typed msgpack, with per-event skipping and counting. */
export function decodeGeneric(payload: Uint8Array, stats: DecodeStats = NO_STATS): KvEventBatch {
  let root: unknown;
  try {
    root = unpackr.unpack(payload);
  } catch (e) {
    throw new KvDecodeError(`msgpack: ${(e as Error)?.message ?? String(e)}`);
  }
  let ts: unknown, rawEvents: unknown, rank: unknown;
  if (Array.isArray(root)) {
    ts = root[0];
    rawEvents = root[1];
    rank = root[2];
  } else if (isObject(root)) {
    ts = root.ts;
    rawEvents = root.events;
    rank = root.data_parallel_rank;
  } else {
    throw new KvDecodeError("batch is neither an array nor a map");
  }
  if (typeof ts === "bigint") ts = Number(ts);
  if (typeof ts !== "number") throw new KvDecodeError("batch ts is not a number");
  if (!Array.isArray(rawEvents)) throw new KvDecodeError("batch events is not a list");
  const dataParallelRank = optInt(rank);
  if (dataParallelRank === undefined) throw new KvDecodeError("data_parallel_rank is not an int");
  const events: KvEvent[] = [];
  for (let i = 0; i < rawEvents.length; i++) {
    const ev = decodeEvent(rawEvents[i]);
    if (ev) events.push(ev);
    else stats.skippedEvents++;
  }
  return { ts, events, dataParallelRank };
}

function decodeEvent(raw: unknown): KvEvent | undefined {
  if (Array.isArray(raw)) {
    switch (raw[0]) {
      case "BlockStored":
        return stored(raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], raw.length > 7, raw[7], raw[8], raw[9], raw[10], raw[11]);
      case "BlockRemoved":
        return removed(raw[1], raw[2], raw.length > 3, raw[3]);
      case "AllBlocksCleared":
        return { type: "AllBlocksCleared" };
      default:
        return undefined;
    }
  }
  if (isObject(raw)) {
    switch (raw.type) {
      case "BlockStored":
        return stored(
          raw.block_hashes, raw.parent_block_hash, raw.token_ids, raw.block_size, raw.lora_id, raw.medium,
          "lora_name" in raw || "extra_keys" in raw || "group_idx" in raw || "kv_cache_spec_kind" in raw ||
            "kv_cache_spec_sliding_window" in raw,
          raw.lora_name, raw.extra_keys, raw.group_idx, raw.kv_cache_spec_kind, raw.kv_cache_spec_sliding_window,
        );
      case "BlockRemoved":
        return removed(raw.block_hashes, raw.medium, "group_idx" in raw, raw.group_idx);
      case "AllBlocksCleared":
        return { type: "AllBlocksCleared" };
      default:
        return undefined;
    }
  }
  return undefined;
}

function stored(
  hashes: unknown, parent: unknown, tokens: unknown, blockSize: unknown, loraId: unknown, medium: unknown,
  hasExtras: boolean, loraName: unknown, extraKeys: unknown, groupIdx: unknown, specKind: unknown, specWindow: unknown,
): BlockStored | undefined {
  const blockHashes = hashList(hashes);
  if (!blockHashes) return undefined;
  let parentBlockHash: bigint | null = null;
  if (parent != null) {
    const p = toHash(parent);
    if (p === undefined) return undefined;
    parentBlockHash = p;
  }
  if (!Array.isArray(tokens)) return undefined;
  for (let i = 0; i < tokens.length; i++) if (typeof tokens[i] !== "number") return undefined;
  const bs = optInt(blockSize);
  if (bs == null || bs <= 0) return undefined;
  const lora = optInt(loraId);
  const med = optMedium(medium);
  if (lora === undefined || med === undefined) return undefined;
  const ev: BlockStored = {
    type: "BlockStored", blockHashes, parentBlockHash, tokenIds: tokens as number[], blockSize: bs, loraId: lora, medium: med,
  };
  if (hasExtras) {
    if (loraName !== undefined) ev.loraName = typeof loraName === "string" ? loraName : null;
    if (extraKeys !== undefined) ev.extraKeys = extraKeys;
    if (groupIdx !== undefined) ev.groupIdx = optInt(groupIdx) ?? null;
    if (specKind !== undefined) ev.kvCacheSpecKind = typeof specKind === "string" ? specKind : null;
    if (specWindow !== undefined) ev.kvCacheSpecSlidingWindow = optInt(specWindow) ?? null;
  }
  return ev;
}

function removed(hashes: unknown, medium: unknown, hasGroup: boolean, groupIdx: unknown): BlockRemoved | undefined {
  const blockHashes = hashList(hashes);
  const med = optMedium(medium);
  if (!blockHashes || med === undefined) return undefined;
  const ev: BlockRemoved = { type: "BlockRemoved", blockHashes, medium: med };
  if (hasGroup && groupIdx !== undefined) ev.groupIdx = optInt(groupIdx) ?? null;
  return ev;
}

function hashList(v: unknown): bigint[] | undefined {
  if (!Array.isArray(v)) return undefined;
  const out = new Array<bigint>(v.length);
  for (let i = 0; i < v.length; i++) {
    const h = toHash(v[i]);
    if (h === undefined) return undefined;
    out[i] = h;
  }
  return out;
}

/** null/absent → null; an integer → number; anything else → undefined (malformed). */
function optInt(v: unknown): number | null | undefined {
  if (v == null) return null;
  if (typeof v === "number") return Number.isInteger(v) ? v : undefined;
  if (typeof v === "bigint") return Number(v);
  return undefined;
}

function optMedium(v: unknown): Medium | null | undefined {
  if (v == null) return null;
  return typeof v === "string" ? v : undefined;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !(v instanceof Uint8Array);
}
