// Decoder for KVEventBatch payloads (msgpack) in every shape vLLM and SGLang send:
//  - batch: an array [ts, events, data_parallel_rank?] (msgspec array_like) or a map {ts, events, ...};
//  - events: tagged maps {type: "BlockStored", ...} (vLLM today) or tagged arrays ["BlockStored", ...]
//    (older vLLM and SGLang; array_like writes every field, older versions simply have fewer).
// Unknown map keys and positions past the known ones are skipped and counted (newer producers add
// fields). Unknown tags and malformed events are skipped and counted in DecodeStats by reason; a
// malformed batch throws KvDecodeError.
import { Unpackr } from "msgpackr";
import { decodeFast } from "./fast-decode.ts";
import { mmKeys } from "./mm-keys.ts";
import { unpackUntrusted } from "./msgpack-shape.ts";
import { toHash } from "./hash.ts";
import {
  type BlockRemoved,
  type BlockStored,
  type DecodeStats,
  type DropReason,
  type ExtraKeys,
  type KvEvent,
  type KvEventBatch,
  KvDecodeError,
  newDecodeStats,
} from "./types.ts";

// int64AsType "bigint": u64 / i64 msgpack values decode exactly (never as lossy doubles).
// useRecords false + mapsAsObjects: plain msgpack, maps as objects (keys are strings in vLLM).
const unpackr = new Unpackr({ int64AsType: "bigint", useRecords: false, mapsAsObjects: true, moreTypes: false });

/** Decodes one KVEventBatch payload; throws KvDecodeError when the batch itself is malformed. */
export function decodeBatch(payload: Uint8Array, stats: DecodeStats = newDecodeStats()): KvEventBatch {
  const fast = decodeFast(payload);
  if (!fast) return decodeGeneric(payload, stats);
  stats.unknownFields += fast.unknownFields;
  return fast.batch;
}

/** The msgpackr path: any well-typed msgpack, with per-event skipping and counting. */
export function decodeGeneric(payload: Uint8Array, stats: DecodeStats = newDecodeStats()): KvEventBatch {
  let root: unknown;
  try {
    root = unpackUntrusted(unpackr, payload);
  } catch (e) {
    throw new KvDecodeError(`msgpack: ${(e as Error)?.message ?? String(e)}`);
  }
  let ts: unknown, rawEvents: unknown, rank: unknown;
  if (Array.isArray(root)) {
    ts = root[0];
    rawEvents = root[1];
    rank = root[2];
    if (root.length > 3) stats.unknownFields += root.length - 3;
  } else if (isObject(root)) {
    ts = root.ts;
    rawEvents = root.events;
    rank = root.data_parallel_rank;
    stats.unknownFields += unknownKeys(root, BATCH_KEYS);
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
    const ev = decodeEvent(rawEvents[i], stats);
    if (typeof ev !== "string") {
      events.push(ev);
      continue;
    }
    stats.skippedEvents++;
    if (ev === "unknown_type") stats.unknownTypes++;
    else stats.malformedEvents++;
  }
  return { ts, events, dataParallelRank };
}

const BATCH_KEYS = new Set(["ts", "events", "data_parallel_rank"]);
const STORED_KEYS = new Set([
  "type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx",
  "kv_cache_spec_kind", "kv_cache_spec_sliding_window", "locality", "ownership", "mm_keys", "session_id", "cache_salt", "metadata",
]);
const REMOVED_KEYS = new Set(["type", "block_hashes", "medium", "group_idx", "locality", "ownership"]);
const CLEARED_KEYS = new Set(["type"]);

function unknownKeys(o: Record<string, unknown>, known: Set<string>): number {
  let n = 0;
  for (const k in o) if (!known.has(k)) n++;
  return n;
}

/** Positional field names after the tag (vLLM's declaration order; SGLang shares the first six). */
const STORED_FIELDS = [
  "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys",
  "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window",
] as const;
const REMOVED_FIELDS = ["block_hashes", "medium", "group_idx"] as const;

function decodeEvent(raw: unknown, stats: DecodeStats): KvEvent | DropReason {
  if (Array.isArray(raw)) {
    if (raw[0] === "AllBlocksCleared") {
      stats.unknownFields += raw.length - 1;
      return { type: "AllBlocksCleared" };
    }
    const names = raw[0] === "BlockStored" ? STORED_FIELDS : raw[0] === "BlockRemoved" ? REMOVED_FIELDS : undefined;
    if (!names) return typeof raw[0] === "string" ? "unknown_type" : "malformed";
    if (raw.length - 1 > names.length) stats.unknownFields += raw.length - 1 - names.length;
    const fields: Record<string, unknown> = { type: raw[0] };
    for (let i = 0; i < names.length && i + 1 < raw.length; i++) fields[names[i]!] = raw[i + 1];
    // SGLang (>= 0.5.18) puts a metadata map where vLLM has lora_name.
    if (isObject(fields.lora_name)) {
      fields.metadata = fields.lora_name;
      delete fields.lora_name;
    }
    return fromFields(fields) ?? "malformed";
  }
  if (!isObject(raw)) return "malformed";
  const known = raw.type === "BlockStored" ? STORED_KEYS : raw.type === "BlockRemoved" ? REMOVED_KEYS : raw.type === "AllBlocksCleared" ? CLEARED_KEYS : undefined;
  if (!known) return typeof raw.type === "string" ? "unknown_type" : "malformed";
  const ev = fromFields(raw);
  if (ev) stats.unknownFields += unknownKeys(raw, known);
  return ev ?? "malformed";
}

function fromFields(f: Record<string, unknown>): KvEvent | undefined {
  switch (f.type) {
    case "BlockStored":
      return stored(f);
    case "BlockRemoved":
      return removed(f);
    case "AllBlocksCleared":
      return { type: "AllBlocksCleared" };
    default:
      return undefined;
  }
}

/**
 * Plain token ids, or SGLang's EAGLE bigram pairs `[[t0,t1],[t1,t2],..]` (mem_cache/events.py writes
 * `(raw[j], raw[j+1])` per key position when its radix key is bigram): the pairs must chain, and give
 * their first tokens plus the last pair's second. undefined: neither.
 */
function tokenIds(v: unknown): { ids: number[]; next?: number } | undefined {
  if (!Array.isArray(v)) return undefined;
  if (v.length === 0 || !Array.isArray(v[0])) {
    for (let i = 0; i < v.length; i++) if (typeof v[i] !== "number") return undefined;
    return { ids: v as number[] };
  }
  const ids = new Array<number>(v.length);
  let prev: number | undefined;
  for (let i = 0; i < v.length; i++) {
    const p = v[i];
    if (!Array.isArray(p) || p.length !== 2 || typeof p[0] !== "number" || typeof p[1] !== "number") return undefined;
    if (prev !== undefined && p[0] !== prev) return undefined;
    ids[i] = p[0];
    prev = p[1];
  }
  return { ids, next: prev };
}

function stored(f: Record<string, unknown>): BlockStored | undefined {
  const blockHashes = hashList(f.block_hashes);
  if (!blockHashes) return undefined;
  let parentBlockHash: bigint | null = null;
  if (f.parent_block_hash != null) {
    const p = toHash(f.parent_block_hash);
    if (p === undefined) return undefined;
    parentBlockHash = p;
  }
  const tokens = tokenIds(f.token_ids);
  if (!tokens) return undefined;
  const bs = optInt(f.block_size);
  if (bs == null || bs < 0) return undefined;
  const lora = optInt(f.lora_id);
  const medium = optStr(f.medium);
  if (lora === undefined || medium === undefined) return undefined;
  const ev: BlockStored = {
    type: "BlockStored", blockHashes, parentBlockHash, tokenIds: tokens.ids, blockSize: bs, loraId: lora, medium,
  };
  if ("lora_name" in f && (ev.loraName = optStr(f.lora_name)) === undefined) return undefined;
  if ("extra_keys" in f) {
    const k = extraKeys(f.extra_keys);
    if (k === undefined) return undefined;
    ev.extraKeys = k;
  }
  if ("group_idx" in f && (ev.groupIdx = optInt(f.group_idx)) === undefined) return undefined;
  if ("kv_cache_spec_kind" in f && (ev.kvCacheSpecKind = optStr(f.kv_cache_spec_kind)) === undefined) return undefined;
  if ("kv_cache_spec_sliding_window" in f && (ev.kvCacheSpecSlidingWindow = optInt(f.kv_cache_spec_sliding_window)) === undefined) return undefined;
  if ("locality" in f && (ev.locality = optStr(f.locality)) === undefined) return undefined;
  if ("ownership" in f && (ev.ownership = optStr(f.ownership)) === undefined) return undefined;
  if ("mm_keys" in f && (ev.mmKeys = mmKeys(f.mm_keys)) === undefined) return undefined;
  const meta = isObject(f.metadata) ? f.metadata : {};
  const session = "session_id" in f ? f.session_id : meta.session_id;
  if (session !== undefined && (ev.sessionId = optStr(session)) === undefined) return undefined;
  const salt = "cache_salt" in f ? f.cache_salt : meta.cache_salt;
  if (salt !== undefined && (ev.cacheSalt = optStr(salt)) === undefined) return undefined;
  if (tokens.next !== undefined) ev.bigramNextTokenId = tokens.next;
  return ev;
}

function removed(f: Record<string, unknown>): BlockRemoved | undefined {
  const blockHashes = hashList(f.block_hashes);
  const medium = optStr(f.medium);
  if (!blockHashes || medium === undefined) return undefined;
  const ev: BlockRemoved = { type: "BlockRemoved", blockHashes, medium };
  if ("group_idx" in f && (ev.groupIdx = optInt(f.group_idx)) === undefined) return undefined;
  if ("locality" in f && (ev.locality = optStr(f.locality)) === undefined) return undefined;
  if ("ownership" in f && (ev.ownership = optStr(f.ownership)) === undefined) return undefined;
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

/** A list (one entry per block) of lists or nulls; bins as plain Uint8Array (msgpackr gives Buffers). */
function extraKeys(v: unknown): ExtraKeys | null | undefined {
  if (v == null) return null;
  if (!Array.isArray(v)) return undefined;
  for (let i = 0; i < v.length; i++) {
    const e = v[i];
    if (e === null) continue;
    if (!Array.isArray(e)) return undefined;
    v[i] = e.map(plainBytes);
  }
  return v as ExtraKeys;
}

function plainBytes(v: unknown): unknown {
  if (v instanceof Uint8Array) return new Uint8Array(v);
  if (Array.isArray(v)) return v.map(plainBytes);
  return v;
}

/** null/absent → null; an integer → number; anything else → undefined (malformed). */
function optInt(v: unknown): number | null | undefined {
  if (v == null) return null;
  if (typeof v === "number") return Number.isInteger(v) ? v : undefined;
  if (typeof v === "bigint") return Number(v);
  return undefined;
}

function optStr(v: unknown): string | null | undefined {
  if (v == null) return null;
  return typeof v === "string" ? v : undefined;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !(v instanceof Uint8Array) && !Array.isArray(v);
}
