// Schema-directed msgpack reader for KVEventBatch, the hot path of decodeBatch().
// Why hand-written: bench:events measured msgpackr's generic unpack as the bottleneck of the
// PUB→SUB→decode path (~1.6M block events/s on the dev box, under the 2M target); reading the
// known shape directly (no intermediate generic arrays, tags compared as bytes, u64 hashes
// read straight to BigInt) is several times faster. It handles well-formed batches only:
// anything unexpected returns undefined and decodeBatch() falls back to the msgpackr path,
// which owns error reporting and per-event skipping. test/fuzz.test.ts checks both agree.
import { mmKeys } from "./mm-keys.ts";
import { foldHashBytes } from "./hash.ts";
import type { BlockRemoved, BlockStored, ExtraKeys, ExtraKeyValue, KvEvent, KvEventBatch } from "./types.ts";

class Bail extends Error {}
const BAIL = new Bail();

let buf: Uint8Array = new Uint8Array(0);
let dv: DataView = new DataView(buf.buffer);
let pos = 0;
let end = 0;
/** Map keys (and batch positions) read and skipped as unknown in the current payload. */
let unknown = 0;

/** A well-formed batch and how many fields it carried that this reader skipped as unknown. */
export type FastDecoded = { batch: KvEventBatch; unknownFields: number };

/** Decodes a well-formed batch, or returns undefined (use the generic path). */
export function decodeFast(payload: Uint8Array): FastDecoded | undefined {
  buf = payload;
  dv = new DataView(payload.buffer, payload.byteOffset, payload.byteLength);
  pos = 0;
  end = payload.length;
  unknown = 0;
  try {
    const b = readBatch();
    return pos === end ? { batch: b, unknownFields: unknown } : undefined;
  } catch (e) {
    if (e === BAIL) return undefined;
    throw e;
  } finally {
    buf = EMPTY;
  }
}

const EMPTY = new Uint8Array(0);

function byte(): number {
  if (pos >= end) throw BAIL;
  return buf[pos++]!;
}

function need(n: number): void {
  if (pos + n > end) throw BAIL;
}

/** Array or map header: returns n (>= 0) for arrays, ~n (< 0) for maps. */
function containerHeader(): number {
  const b = byte();
  if (b >= 0x90 && b <= 0x9f) return b & 0x0f;
  if (b >= 0x80 && b <= 0x8f) return ~(b & 0x0f);
  let n: number;
  switch (b) {
    case 0xdc: need(2); n = dv.getUint16(pos); pos += 2; break;
    case 0xdd: need(4); n = dv.getUint32(pos); pos += 4; break;
    case 0xde: need(2); n = dv.getUint16(pos); pos += 2; return ~fits(n);
    case 0xdf: need(4); n = dv.getUint32(pos); pos += 4; return ~fits(n);
    default: throw BAIL;
  }
  return fits(n);
}

/**
 * `n` when n elements can follow (each takes at least a byte): the lists are allocated at their
 * declared length, and 32 bytes declaring 81M elements cost 1.6 s.
 */
function fits(n: number): number {
  if (n > end - pos) throw BAIL;
  return n;
}

function arrayHeader(): number {
  const n = containerHeader();
  if (n < 0) throw BAIL;
  return n;
}

function strLen(b: number): number {
  if (b >= 0xa0 && b <= 0xbf) return b & 0x1f;
  let n: number;
  switch (b) {
    case 0xd9: need(1); return buf[pos++]!;
    case 0xda: need(2); n = dv.getUint16(pos); pos += 2; return n;
    case 0xdb: need(4); n = dv.getUint32(pos); pos += 4; return n;
  }
  return -1;
}

const td = new TextDecoder("utf-8", { fatal: true });

function str(): string {
  const n = strLen(byte());
  if (n < 0) throw BAIL;
  need(n);
  const start = pos;
  pos += n;
  if (n <= 24) {
    // Short ASCII (tags, keys, media) without a TextDecoder call.
    let s = "";
    for (let i = start; i < start + n; i++) {
      const c = buf[i]!;
      if (c >= 0x80) return utf8(start, n);
      s += String.fromCharCode(c);
    }
    return s;
  }
  return utf8(start, n);
}

function utf8(start: number, n: number): string {
  try {
    return td.decode(buf.subarray(start, start + n));
  } catch {
    throw BAIL;
  }
}

function nil(): boolean {
  if (pos < end && buf[pos] === 0xc0) {
    pos++;
    return true;
  }
  return false;
}

/** An integer that fits a JS number (64-bit wire forms bail: the generic path handles them). */
function int(): number {
  const b = byte();
  if (b < 0x80) return b;
  if (b >= 0xe0) return b - 0x100;
  let v: number;
  switch (b) {
    case 0xcc: need(1); return buf[pos++]!;
    case 0xcd: need(2); v = dv.getUint16(pos); pos += 2; return v;
    case 0xce: need(4); v = dv.getUint32(pos); pos += 4; return v;
    case 0xd0: need(1); v = dv.getInt8(pos); pos += 1; return v;
    case 0xd1: need(2); v = dv.getInt16(pos); pos += 2; return v;
    case 0xd2: need(4); v = dv.getInt32(pos); pos += 4; return v;
  }
  throw BAIL;
}

function optInt(): number | null {
  return nil() ? null : int();
}

function optStr(): string | null {
  return nil() ? null : str();
}

function hash(): bigint {
  const b = byte();
  if (b < 0x80) return BigInt(b);
  let n: number;
  switch (b) {
    case 0xcf: {
      need(8);
      const v = dv.getBigUint64(pos);
      pos += 8;
      return v;
    }
    case 0xcc: need(1); return BigInt(buf[pos++]!);
    case 0xcd: need(2); n = dv.getUint16(pos); pos += 2; return BigInt(n);
    case 0xce: need(4); n = dv.getUint32(pos); pos += 4; return BigInt(n);
    case 0xd3: {
      need(8);
      const v = dv.getBigUint64(pos); // two's complement read unsigned = the u64 fold
      pos += 8;
      return v;
    }
    case 0xc4: need(1); n = buf[pos++]!; break;
    case 0xc5: need(2); n = dv.getUint16(pos); pos += 2; break;
    case 0xc6: need(4); n = dv.getUint32(pos); pos += 4; break;
    default:
      if (b >= 0xe0 || (b >= 0xd0 && b <= 0xd2)) {
        pos--;
        return BigInt.asUintN(64, BigInt(int()));
      }
      throw BAIL;
  }
  need(n);
  const h = foldHashBytes(buf.subarray(pos, pos + n));
  pos += n;
  return h;
}

function hashList(): bigint[] {
  const n = arrayHeader();
  const out = new Array<bigint>(n);
  for (let i = 0; i < n; i++) out[i] = hash();
  return out;
}

function optHash(): bigint | null {
  return nil() ? null : hash();
}

/** token_ids: plain ints, or SGLang's EAGLE bigram pairs (see decode.ts tokenIds); `ev` gets the tail token. */
function tokenList(ev: { bigramNextTokenId?: number }): number[] {
  const h = pos < end ? buf[pos]! : -1;
  const first = h > 0x90 && h <= 0x9f ? pos + 1 : h === 0xdc ? pos + 3 : h === 0xdd ? pos + 5 : -1;
  return first >= 0 && first < end && buf[first] === 0x92 ? bigrams(ev) : intList();
}

function bigrams(ev: { bigramNextTokenId?: number }): number[] {
  const n = arrayHeader();
  const out = new Array<number>(n);
  let prev = -1;
  for (let i = 0; i < n; i++) {
    if (byte() !== 0x92) throw BAIL;
    const a = int();
    if (i > 0 && a !== prev) throw BAIL;
    out[i] = a;
    prev = int();
  }
  if (n > 0) ev.bigramNextTokenId = prev;
  return out;
}

function intList(): number[] {
  const n = arrayHeader();
  const out = new Array<number>(n);
  for (let i = 0; i < n; i++) {
    // Inline the common widths of token ids (fixint, uint16, uint32).
    const b = pos < end ? buf[pos]! : -1;
    if (b >= 0 && b < 0x80) {
      out[i] = b;
      pos++;
    } else if (b === 0xcd && pos + 3 <= end) {
      out[i] = (buf[pos + 1]! << 8) | buf[pos + 2]!;
      pos += 3;
    } else if (b === 0xce && pos + 5 <= end) {
      out[i] = dv.getUint32(pos + 1);
      pos += 5;
    } else out[i] = int();
  }
  return out;
}

/** Any msgpack value but ext (extra_keys, metadata, unknown fields), as msgpackr reads it. */
function any(depth = 0): unknown {
  if (depth > 32) throw BAIL;
  const b = pos < end ? buf[pos]! : -1;
  if (b === 0xc0) return pos++, null;
  if (b === 0xc2 || b === 0xc3) return pos++, b === 0xc3;
  if (b === 0xcb || b === 0xca) {
    pos++;
    const w = b === 0xcb ? 8 : 4;
    need(w);
    const v = w === 8 ? dv.getFloat64(pos) : dv.getFloat32(pos);
    pos += w;
    return v;
  }
  if (b === 0xcf || b === 0xd3) {
    // msgpackr (int64AsType "bigint") gives every 64-bit-wide int as a bigint.
    pos++;
    need(8);
    const v = b === 0xcf ? dv.getBigUint64(pos) : dv.getBigInt64(pos);
    pos += 8;
    return v;
  }
  if (b === 0xc4 || b === 0xc5 || b === 0xc6) {
    pos++;
    let n: number;
    if (b === 0xc4) { need(1); n = buf[pos++]!; }
    else if (b === 0xc5) { need(2); n = dv.getUint16(pos); pos += 2; }
    else { need(4); n = dv.getUint32(pos); pos += 4; }
    need(n);
    const out = buf.slice(pos, pos + n);
    pos += n;
    return out;
  }
  if ((b >= 0xa0 && b <= 0xbf) || b === 0xd9 || b === 0xda || b === 0xdb) return str();
  if ((b >= 0x80 && b <= 0x9f) || (b >= 0xdc && b <= 0xdf)) {
    const n = containerHeader();
    if (n >= 0) {
      const out = new Array<unknown>(n);
      for (let i = 0; i < n; i++) out[i] = any(depth + 1);
      return out;
    }
    const obj: Record<string, unknown> = {};
    for (let i = 0; i < ~n; i++) {
      const k = str();
      if (k === "__proto__") throw BAIL;
      obj[k] = any(depth + 1);
    }
    return obj;
  }
  return int();
}

/** vLLM's extra_keys: nil, or a list whose entries are nil or lists. */
function extraKeys(): ExtraKeys | null {
  if (nil()) return null;
  const n = arrayHeader();
  const out = new Array<ExtraKeyValue[] | null>(n);
  for (let i = 0; i < n; i++) {
    if (nil()) {
      out[i] = null;
      continue;
    }
    const m = arrayHeader();
    const e = new Array<ExtraKeyValue>(m);
    for (let j = 0; j < m; j++) e[j] = any(1) as ExtraKeyValue;
    out[i] = e;
  }
  return out;
}

function readBatch(): KvEventBatch {
  const h = containerHeader();
  let ts = NaN;
  let events: KvEvent[] | undefined;
  let rank: number | null = null;
  if (h >= 0) {
    if (h < 2 || h > 3) throw BAIL;
    ts = float();
    events = eventList();
    if (h === 3) rank = optInt();
  } else {
    for (let i = 0; i < ~h; i++) {
      const k = str();
      if (k === "ts") ts = float();
      else if (k === "events") events = eventList();
      else if (k === "data_parallel_rank") rank = optInt();
      else {
        unknown++;
        any(1);
      }
    }
  }
  if (!events || Number.isNaN(ts)) throw BAIL;
  return { ts, events, dataParallelRank: rank };
}

function float(): number {
  if (pos < end && buf[pos] === 0xcb) {
    pos++;
    need(8);
    const v = dv.getFloat64(pos);
    pos += 8;
    return v;
  }
  return int();
}

function eventList(): KvEvent[] {
  const n = arrayHeader();
  const out = new Array<KvEvent>(n);
  for (let i = 0; i < n; i++) {
    const h = containerHeader();
    out[i] = h >= 0 ? arrayEvent(h) : mapEvent(~h);
  }
  return out;
}

function arrayEvent(n: number): KvEvent {
  if (n === 0) throw BAIL;
  const tag = str();
  if (tag === "BlockStored") {
    if (n < 5 || n > 12) throw BAIL;
    const tail: { bigramNextTokenId?: number } = {};
    const ev: BlockStored = {
      type: "BlockStored", blockHashes: hashList(), parentBlockHash: optHash(), tokenIds: tokenList(tail), blockSize: int(),
      loraId: n > 5 ? optInt() : null, medium: n > 6 ? optStr() : null,
    };
    if (ev.blockSize < 0) throw BAIL;
    if (n > 7) {
      // SGLang (>= 0.5.18) puts its metadata map where vLLM has lora_name.
      const b = pos < end ? buf[pos]! : -1;
      if ((b >= 0x80 && b <= 0x8f) || b === 0xde || b === 0xdf) metadata(ev, ~containerHeader());
      else ev.loraName = optStr();
    }
    if (n > 8) ev.extraKeys = extraKeys();
    if (n > 9) ev.groupIdx = optInt();
    if (n > 10) ev.kvCacheSpecKind = optStr();
    if (n > 11) ev.kvCacheSpecSlidingWindow = optInt();
    if (tail.bigramNextTokenId !== undefined) ev.bigramNextTokenId = tail.bigramNextTokenId;
    return ev;
  }
  if (tag === "BlockRemoved") {
    if (n < 2 || n > 4) throw BAIL;
    const ev: BlockRemoved = { type: "BlockRemoved", blockHashes: hashList(), medium: n > 2 ? optStr() : null };
    if (n > 3) ev.groupIdx = optInt();
    return ev;
  }
  if (tag === "AllBlocksCleared" && n === 1) return { type: "AllBlocksCleared" };
  throw BAIL; // unknown tags and longer shapes: the generic path handles them
}

/** SGLang's BlockStoredMetadata: cache_salt and session_id are kept, other keys read and dropped. */
function metadata(ev: BlockStored, n: number): void {
  let salt: string | null | undefined, session: string | null | undefined;
  for (let i = 0; i < n; i++) {
    const k = str();
    if (k === "cache_salt") salt = optStr();
    else if (k === "session_id") session = optStr();
    else any(1);
  }
  if (session !== undefined) ev.sessionId = session;
  if (salt !== undefined) ev.cacheSalt = salt;
}

// Map keys: bit flags for "present", so an omitted default stays absent (as in the generic path).
const K_LORA_NAME = 1, K_EXTRA = 2, K_GROUP = 4, K_KIND = 8, K_WINDOW = 16, K_LOCALITY = 32, K_SESSION = 64, K_SALT = 128, K_OWNERSHIP = 256, K_MM = 512;

function mapEvent(n: number): KvEvent {
  let type: string | undefined;
  const ev: Partial<BlockStored> & { medium?: string | null } = {};
  let has = 0;
  let metaSalt: string | null | undefined, metaSession: string | null | undefined;
  for (let i = 0; i < n; i++) {
    const k = str();
    switch (k) {
      case "type": type = str(); break;
      case "block_hashes": ev.blockHashes = hashList(); break;
      case "parent_block_hash": ev.parentBlockHash = optHash(); break;
      case "token_ids": ev.tokenIds = tokenList(ev); break;
      case "block_size": ev.blockSize = int(); break;
      case "lora_id": ev.loraId = optInt(); break;
      case "medium": ev.medium = optStr(); break;
      case "lora_name": ev.loraName = optStr(); has |= K_LORA_NAME; break;
      case "extra_keys": ev.extraKeys = extraKeys(); has |= K_EXTRA; break;
      case "group_idx": ev.groupIdx = optInt(); has |= K_GROUP; break;
      case "kv_cache_spec_kind": ev.kvCacheSpecKind = optStr(); has |= K_KIND; break;
      case "kv_cache_spec_sliding_window": ev.kvCacheSpecSlidingWindow = optInt(); has |= K_WINDOW; break;
      case "locality": ev.locality = optStr(); has |= K_LOCALITY; break;
      case "ownership": ev.ownership = optStr(); has |= K_OWNERSHIP; break;
      case "mm_keys": {
        const m = mmKeys(any(1));
        if (m === undefined) throw BAIL;
        ev.mmKeys = m;
        has |= K_MM;
        break;
      }
      case "session_id": ev.sessionId = optStr(); has |= K_SESSION; break;
      case "cache_salt": ev.cacheSalt = optStr(); has |= K_SALT; break;
      case "metadata": {
        const m: BlockStored = { type: "BlockStored", blockHashes: [], parentBlockHash: null, tokenIds: [], blockSize: 0, loraId: null, medium: null };
        if (nil()) break;
        const h = containerHeader();
        if (h >= 0) throw BAIL;
        metadata(m, ~h);
        metaSalt = m.cacheSalt;
        metaSession = m.sessionId;
        break;
      }
      default: // a field this reader does not know: skipped and counted, as the generic path does
        unknown++;
        any(1);
    }
  }
  if (type === "BlockStored") {
    if (!ev.blockHashes || !ev.tokenIds || ev.blockSize === undefined || ev.blockSize < 0) throw BAIL;
    const out: BlockStored = {
      type, blockHashes: ev.blockHashes, parentBlockHash: ev.parentBlockHash ?? null, tokenIds: ev.tokenIds, blockSize: ev.blockSize,
      loraId: ev.loraId ?? null, medium: ev.medium ?? null,
    };
    if (has & K_LORA_NAME) out.loraName = ev.loraName;
    if (has & K_EXTRA) out.extraKeys = ev.extraKeys;
    if (has & K_GROUP) out.groupIdx = ev.groupIdx;
    if (has & K_KIND) out.kvCacheSpecKind = ev.kvCacheSpecKind;
    if (has & K_WINDOW) out.kvCacheSpecSlidingWindow = ev.kvCacheSpecSlidingWindow;
    if (has & K_LOCALITY) out.locality = ev.locality;
    if (has & K_OWNERSHIP) out.ownership = ev.ownership;
    if (has & K_MM) out.mmKeys = ev.mmKeys;
    if (has & K_SESSION) out.sessionId = ev.sessionId;
    else if (metaSession !== undefined) out.sessionId = metaSession;
    if (has & K_SALT) out.cacheSalt = ev.cacheSalt;
    else if (metaSalt !== undefined) out.cacheSalt = metaSalt;
    if (ev.bigramNextTokenId !== undefined) out.bigramNextTokenId = ev.bigramNextTokenId;
    return out;
  }
  if (type === "BlockRemoved") {
    if (!ev.blockHashes) throw BAIL;
    const out: BlockRemoved = { type, blockHashes: ev.blockHashes, medium: ev.medium ?? null };
    if (has & K_GROUP) out.groupIdx = ev.groupIdx;
    if (has & K_LOCALITY) out.locality = ev.locality;
    if (has & K_OWNERSHIP) out.ownership = ev.ownership;
    return out;
  }
  if (type === "AllBlocksCleared") return { type: "AllBlocksCleared" };
  throw BAIL;
}
