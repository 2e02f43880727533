// Encoder producing the bytes vLLM (msgspec) emits, so the mock worker is indistinguishable
// from a real worker on the wire. Written by hand rather than with msgpackr because msgpackr
// cannot reproduce msgspec's choices (measured by the golden fixtures in test/codec.test.ts):
// it writes integers above 2^32 as float64 and every BigInt as 9-byte int64, and writes an
// integral ts as an int; msgspec writes the narrowest (u)int and always a float64 ts.
import { hashToDigest } from "./hash.ts";
import type { BlockRemoved, BlockStored, EventEncoding, HashMode, KvEventBatch } from "./types.ts";

export type EncodeOptions = { encoding?: EventEncoding; hashMode?: HashMode };

export function encodeBatch(b: KvEventBatch, opts: EncodeOptions = {}): Uint8Array {
  const w = new Writer(256 + estimate(b));
  const enc = opts.encoding ?? "vllm";
  const bytes = opts.hashMode === "bytes";
  if (enc === "vllm-map") {
    // omit_defaults: data_parallel_rank (default None) only when set.
    const hasRank = b.dataParallelRank != null;
    w.mapHeader(hasRank ? 3 : 2);
    w.str("ts");
    w.f64(b.ts);
    w.str("events");
  } else {
    // array_like writes every field: the rank slot is always there (nil when unset).
    w.arrayHeader(3);
    w.f64(b.ts);
  }
  w.arrayHeader(b.events.length);
  for (const ev of b.events) {
    if (ev.type === "BlockStored") {
      if (enc === "vllm-array") storedArray(w, ev, bytes);
      else if (enc === "sglang") storedSglang(w, ev, bytes);
      else if (enc === "sglang-map") storedSglangMap(w, ev, bytes);
      else storedMap(w, ev, bytes);
    } else if (ev.type === "BlockRemoved") {
      if (enc === "vllm-array") removedArray(w, ev, bytes);
      else if (enc === "sglang") removedSglang(w, ev, bytes);
      else if (enc === "sglang-map") removedSglangMap(w, ev, bytes);
      else removedMap(w, ev, bytes);
    } else if (enc === "vllm-array" || enc === "sglang") {
      w.arrayHeader(1);
      w.str("AllBlocksCleared");
    } else {
      w.mapHeader(1);
      w.str("type");
      w.str("AllBlocksCleared");
    }
  }
  if (enc === "vllm-map") {
    if (b.dataParallelRank != null) {
      w.str("data_parallel_rank");
      w.int(b.dataParallelRank);
    }
  } else w.optInt(b.dataParallelRank);
  return w.done();
}

function estimate(b: KvEventBatch): number {
  let n = 0;
  for (const ev of b.events) if (ev.type !== "AllBlocksCleared") n += ev.blockHashes.length * 34 + (ev.type === "BlockStored" ? ev.tokenIds.length * 5 : 0);
  return n;
}

function storedHead(w: Writer, ev: BlockStored, bytes: boolean, fields: number, sglang = false): void {
  w.arrayHeader(fields);
  w.str("BlockStored");
  hashes(w, ev.blockHashes, bytes);
  optHash(w, ev.parentBlockHash, bytes);
  sglang ? sglangTokens(w, ev) : ints(w, ev.tokenIds);
  w.int(ev.blockSize);
  w.optInt(ev.loraId);
  w.optStr(ev.medium);
}

// Older vLLM, array_like: all 11 fields after the tag, defaults included (msgspec#720: omit_defaults
// does nothing for array_like structs).
function storedArray(w: Writer, ev: BlockStored, bytes: boolean): void {
  storedHead(w, ev, bytes, 12);
  w.optStr(ev.loraName);
  w.any(ev.extraKeys ?? null);
  w.optInt(ev.groupIdx);
  w.optStr(ev.kvCacheSpecKind);
  w.optInt(ev.kvCacheSpecSlidingWindow);
}

function removedArray(w: Writer, ev: BlockRemoved, bytes: boolean): void {
  w.arrayHeader(4);
  w.str("BlockRemoved");
  hashes(w, ev.blockHashes, bytes);
  w.optStr(ev.medium);
  w.optInt(ev.groupIdx);
}

// SGLang: BlockStored ends at medium (7 elements); with a salt or session id it carries its metadata
// map as an 8th (BlockStoredWithMetadata), whose None fields are omitted.
function storedSglang(w: Writer, ev: BlockStored, bytes: boolean): void {
  const meta: [string, string][] = [];
  if (ev.cacheSalt != null) meta.push(["cache_salt", ev.cacheSalt]);
  if (ev.sessionId != null) meta.push(["session_id", ev.sessionId]);
  storedHead(w, ev, bytes, meta.length > 0 ? 8 : 7, true);
  if (meta.length === 0) return;
  w.mapHeader(meta.length);
  for (const [k, v] of meta) {
    w.str(k);
    w.str(v);
  }
}

function removedSglang(w: Writer, ev: BlockRemoved, bytes: boolean): void {
  w.arrayHeader(3);
  w.str("BlockRemoved");
  hashes(w, ev.blockHashes, bytes);
  w.optStr(ev.medium);
}

// Map form (vLLM today): tag field "type" first, then declaration order; fields without a default
// (lora_id, medium, lora_name) always present, defaulted ones only when set (omit_defaults). locality
// and session_id come last, only when set (fields added after the definitions test/fixtures cite).
function storedMap(w: Writer, ev: BlockStored, bytes: boolean): void {
  storedMapHead(w, ev, bytes, [
    ["medium", ev.medium],
    ["lora_name", ev.loraName ?? null],
    ...setFields([
      ["extra_keys", ev.extraKeys], ["group_idx", ev.groupIdx], ["kv_cache_spec_kind", ev.kvCacheSpecKind],
      ["kv_cache_spec_sliding_window", ev.kvCacheSpecSlidingWindow], ["locality", ev.locality], ["ownership", ev.ownership], ["session_id", ev.sessionId],
    ]),
  ]);
}

function removedMap(w: Writer, ev: BlockRemoved, bytes: boolean): void {
  removedMapHead(w, ev, bytes, [["medium", ev.medium], ...setFields([["group_idx", ev.groupIdx], ["locality", ev.locality], ["ownership", ev.ownership]])]);
}

// SGLang's map form (sgl-project/sglang#37482): tagged maps in declaration order, but medium has a
// default (None) there, so it is omitted when unset like cache_salt and session_id. lora_name (SGLang's
// KvEventLoraNames, after #37482) likewise, last: its place among the fields is not in the sources cited.
function storedSglangMap(w: Writer, ev: BlockStored, bytes: boolean): void {
  storedMapHead(w, ev, bytes, setFields([["medium", ev.medium], ["cache_salt", ev.cacheSalt], ["session_id", ev.sessionId], ["lora_name", ev.loraName]]), true);
}

function removedSglangMap(w: Writer, ev: BlockRemoved, bytes: boolean): void {
  removedMapHead(w, ev, bytes, setFields([["medium", ev.medium]]));
}

type Field = [string, unknown];

/** The fields whose value is set (omit_defaults drops the ones left at their None default). */
function setFields(fields: Field[]): Field[] {
  return fields.filter(([, v]) => v != null);
}

/** A BlockStored map: the tag and the six fields every producer writes, then `rest` in order. */
function storedMapHead(w: Writer, ev: BlockStored, bytes: boolean, rest: Field[], sglang = false): void {
  w.mapHeader(6 + rest.length);
  w.str("type");
  w.str("BlockStored");
  w.str("block_hashes");
  hashes(w, ev.blockHashes, bytes);
  w.str("parent_block_hash");
  optHash(w, ev.parentBlockHash, bytes);
  w.str("token_ids");
  sglang ? sglangTokens(w, ev) : ints(w, ev.tokenIds);
  w.str("block_size");
  w.int(ev.blockSize);
  w.str("lora_id");
  w.optInt(ev.loraId);
  fields(w, rest);
}

function removedMapHead(w: Writer, ev: BlockRemoved, bytes: boolean, rest: Field[]): void {
  w.mapHeader(2 + rest.length);
  w.str("type");
  w.str("BlockRemoved");
  w.str("block_hashes");
  hashes(w, ev.blockHashes, bytes);
  fields(w, rest);
}

function fields(w: Writer, rest: Field[]): void {
  for (const [k, v] of rest) {
    w.str(k);
    w.any(v);
  }
}

function hashes(w: Writer, hs: readonly bigint[], bytes: boolean): void {
  w.arrayHeader(hs.length);
  for (const h of hs) bytes ? w.bin(hashToDigest(h)) : w.u64(h);
}

function optHash(w: Writer, h: bigint | null, bytes: boolean): void {
  if (h == null) w.nil();
  else if (bytes) w.bin(hashToDigest(h));
  else w.u64(h);
}

/**
 * SGLang's token_ids: plain, or under EAGLE bigram keys one `(t[j], t[j+1])` tuple per position
 * (mem_cache/events.py record_store; msgspec writes a tuple as a 2-element array).
 */
function sglangTokens(w: Writer, ev: BlockStored): void {
  const next = ev.bigramNextTokenId;
  if (next === undefined) return ints(w, ev.tokenIds);
  const t = ev.tokenIds;
  w.arrayHeader(t.length);
  for (let j = 0; j < t.length; j++) {
    w.arrayHeader(2);
    w.int(t[j]!);
    w.int(j + 1 < t.length ? t[j + 1]! : next);
  }
}

function ints(w: Writer, xs: readonly number[]): void {
  w.arrayHeader(xs.length);
  for (const x of xs) w.int(x);
}

const te = new TextEncoder();

/** Minimal growable msgpack writer with msgspec's width choices. */
class Writer {
  private buf: Uint8Array;
  private dv: DataView;
  private pos = 0;
  constructor(size: number) {
    this.buf = new Uint8Array(size);
    this.dv = new DataView(this.buf.buffer);
  }
  done(): Uint8Array {
    return this.buf.subarray(0, this.pos);
  }
  private need(n: number): void {
    if (this.pos + n <= this.buf.length) return;
    const next = new Uint8Array(Math.max(this.buf.length * 2, this.pos + n));
    next.set(this.buf.subarray(0, this.pos));
    this.buf = next;
    this.dv = new DataView(next.buffer);
  }
  private u8(b: number): void {
    this.need(1);
    this.buf[this.pos++] = b;
  }
  nil(): void {
    this.u8(0xc0);
  }
  f64(x: number): void {
    this.need(9);
    this.buf[this.pos] = 0xcb;
    this.dv.setFloat64(this.pos + 1, x);
    this.pos += 9;
  }
  int(x: number): void {
    if (!Number.isSafeInteger(x)) return x === Math.trunc(x) ? this.i64(BigInt(x)) : this.f64(x);
    this.need(9);
    const b = this.buf, p = this.pos, dv = this.dv;
    if (x >= 0) {
      if (x < 0x80) { b[p] = x; this.pos += 1; }
      else if (x < 0x100) { b[p] = 0xcc; b[p + 1] = x; this.pos += 2; }
      else if (x < 0x10000) { b[p] = 0xcd; dv.setUint16(p + 1, x); this.pos += 3; }
      else if (x < 0x100000000) { b[p] = 0xce; dv.setUint32(p + 1, x); this.pos += 5; }
      else { b[p] = 0xcf; dv.setBigUint64(p + 1, BigInt(x)); this.pos += 9; }
    } else {
      if (x >= -32) { b[p] = x & 0xff; this.pos += 1; }
      else if (x >= -0x80) { b[p] = 0xd0; dv.setInt8(p + 1, x); this.pos += 2; }
      else if (x >= -0x8000) { b[p] = 0xd1; dv.setInt16(p + 1, x); this.pos += 3; }
      else if (x >= -0x80000000) { b[p] = 0xd2; dv.setInt32(p + 1, x); this.pos += 5; }
      else { b[p] = 0xd3; dv.setBigInt64(p + 1, BigInt(x)); this.pos += 9; }
    }
  }
  /** A u64 hash, in the narrowest unsigned width (as msgspec writes Python ints). */
  u64(h: bigint): void {
    if (h < 0x100000000n) return this.int(Number(h));
    this.need(9);
    this.buf[this.pos] = 0xcf;
    this.dv.setBigUint64(this.pos + 1, BigInt.asUintN(64, h));
    this.pos += 9;
  }
  private i64(x: bigint): void {
    if (x >= 0n) return this.u64(x);
    this.need(9);
    this.buf[this.pos] = 0xd3;
    this.dv.setBigInt64(this.pos + 1, BigInt.asIntN(64, x));
    this.pos += 9;
  }
  optInt(x: number | null | undefined): void {
    x == null ? this.nil() : this.int(x);
  }
  optStr(s: string | null | undefined): void {
    s == null ? this.nil() : this.str(s);
  }
  str(s: string): void {
    const bytes = te.encode(s);
    const n = bytes.length;
    if (n < 32) this.u8(0xa0 | n);
    else if (n < 0x100) { this.u8(0xd9); this.u8(n); }
    else if (n < 0x10000) { this.u8(0xda); this.need(2); this.dv.setUint16(this.pos, n); this.pos += 2; }
    else { this.u8(0xdb); this.need(4); this.dv.setUint32(this.pos, n); this.pos += 4; }
    this.raw(bytes);
  }
  bin(bytes: Uint8Array): void {
    const n = bytes.length;
    if (n < 0x100) { this.u8(0xc4); this.u8(n); }
    else if (n < 0x10000) { this.u8(0xc5); this.need(2); this.dv.setUint16(this.pos, n); this.pos += 2; }
    else { this.u8(0xc6); this.need(4); this.dv.setUint32(this.pos, n); this.pos += 4; }
    this.raw(bytes);
  }
  private raw(bytes: Uint8Array): void {
    this.need(bytes.length);
    this.buf.set(bytes, this.pos);
    this.pos += bytes.length;
  }
  arrayHeader(n: number): void {
    this.header(n, 0x90, 0xdc, 0xdd);
  }
  mapHeader(n: number): void {
    this.header(n, 0x80, 0xde, 0xdf);
  }
  private header(n: number, fix: number, h16: number, h32: number): void {
    this.need(5);
    if (n < 16) this.buf[this.pos++] = fix | n;
    else if (n < 0x10000) { this.buf[this.pos] = h16; this.dv.setUint16(this.pos + 1, n); this.pos += 3; }
    else { this.buf[this.pos] = h32; this.dv.setUint32(this.pos + 1, n); this.pos += 5; }
  }
  /** Generic values (extra_keys): tuples/lists, strings, ints, floats, bytes, maps. */
  any(v: unknown): void {
    if (v == null) this.nil();
    else if (typeof v === "boolean") this.u8(v ? 0xc3 : 0xc2);
    else if (typeof v === "number") Number.isInteger(v) ? this.int(v) : this.f64(v);
    else if (typeof v === "bigint") this.i64(v);
    else if (typeof v === "string") this.str(v);
    else if (v instanceof Uint8Array) this.bin(v);
    else if (Array.isArray(v)) {
      this.arrayHeader(v.length);
      for (const x of v) this.any(x);
    } else if (typeof v === "object") {
      const entries = Object.entries(v as Record<string, unknown>);
      this.mapHeader(entries.length);
      for (const [k, x] of entries) {
        this.str(k);
        this.any(x);
      }
    } else this.nil();
  }
}
