// The dump as JSON: RouterEvents of the recovery `/dump` body written from a dumpWorker() snapshot
// straight into linear memory. Measured on the 1M-residency recovery bench: the TypeScript path
// (DumpEvent objects, BigInts, then digits from doubles) made the sender the bottleneck; here a block is
// two u64 -> decimal conversions and a few fixed-byte stores. The caller owns the state (so several
// dumps of one index may run at once) and the output buffer; emission stops after the step that reaches
// `limit` and resumes from the state, so a chain of any length streams in bounded chunks.
//
// Rows (from dumpWorker) and the caller's state: dump-layout.ts, shared with the TypeScript face. The
// output needs 64 bytes of slack past each step (fixed strings are copied as whole 16-byte words).
import { DUMP_JSON_BLOCK, DUMP_JSON_BLOCKS, DUMP_JSON_COPIES, DUMP_JSON_PARENT, DUMP_JSON_TOKENS } from "../../protocol/src/dump-json";
import { ROW_BYTES, ROW_COPIES, ROW_FLAGS, ROW_HASH, ROW_HAS_PARENT, ROW_NEW_EVENT, ROW_PARENT, ROW_TOKENS, STATE_EVENT_ID, STATE_FLAGS, STATE_INSIDE, STATE_LEN, STATE_POS, STATE_PREFIX, STATE_PREFIX_LEN, STATE_ROWS, STATE_SUFFIX, STATE_SUFFIX_LEN, STATE_WROTE } from "./dump-layout";
import { alloc } from "./pages";

let digits2: usize = 0; // "00".."99"
// The fixed fragments (dump-json in @kv-epp/protocol) in linear memory, and their lengths.
let jsonParent: usize = 0, parentLen: usize = 0;
let jsonBlocks: usize = 0, blocksLen: usize = 0;
let jsonBlock: usize = 0, blockLen: usize = 0; // with a leading comma, which the first block skips
let jsonTokens: usize = 0, tokensLen: usize = 0;
let jsonCopies: usize = 0, copiesLen: usize = 0;
let jsonNull: usize = 0; // `null`

/** `s` as ASCII in linear memory, after a comma when `comma`; padded so 16-byte copies never read past it. */
function asciiConst(s: string, comma: bool = false): usize {
  const at: i32 = comma ? 1 : 0;
  const n = s.length + at;
  const p = alloc(<usize>(n + 16)); // small: TLSF
  memory.fill(p, 0, <usize>(n + 16));
  if (comma) store<u8>(p, 0x2c);
  for (let i = 0; i < s.length; i++) store<u8>(p + <usize>(i + at), <u8>s.charCodeAt(i));
  return p;
}

export function initJson(): void {
  digits2 = alloc(200);
  for (let i: u32 = 0; i < 100; i++) {
    store<u8>(digits2 + (<usize>i << 1), <u8>(48 + i / 10));
    store<u8>(digits2 + (<usize>i << 1) + 1, <u8>(48 + i % 10));
  }
  jsonParent = asciiConst(DUMP_JSON_PARENT);
  parentLen = <usize>DUMP_JSON_PARENT.length;
  jsonBlocks = asciiConst(DUMP_JSON_BLOCKS);
  blocksLen = <usize>DUMP_JSON_BLOCKS.length;
  jsonBlock = asciiConst(DUMP_JSON_BLOCK, true);
  blockLen = <usize>DUMP_JSON_BLOCK.length + 1;
  jsonTokens = asciiConst(DUMP_JSON_TOKENS);
  tokensLen = <usize>DUMP_JSON_TOKENS.length;
  jsonCopies = asciiConst(DUMP_JSON_COPIES);
  copiesLen = <usize>DUMP_JSON_COPIES.length;
  // a block's fragments are copied as one 16-byte word each (copy16)
  if (blockLen > 16 || tokensLen > 16 || copiesLen > 16) unreachable();
  jsonNull = asciiConst("null");
}

@inline function copy16(o: usize, p: usize): void {
  store<u64>(o, load<u64>(p));
  store<u64>(o, load<u64>(p, 8), 8);
}
@inline function put2(o: usize, n: u32): void { store<u16>(o, load<u16>(digits2 + (<usize>n << 1))); }

/** Exactly 8 digits (zero-padded) of n < 10^8. */
@inline function write8(o: usize, n: u32): usize {
  const a = n / 10000, b = n - a * 10000;
  const a1 = a / 100, b1 = b / 100;
  put2(o, a1); put2(o + 2, a - a1 * 100); put2(o + 4, b1); put2(o + 6, b - b1 * 100);
  return o + 8;
}

/** The digits of n < 10^8 without leading zeros. */
function writeSmall(o: usize, n: u32): usize {
  const len: u32 = n < 10 ? 1 : n < 100 ? 2 : n < 1000 ? 3 : n < 10000 ? 4 : n < 100000 ? 5 : n < 1000000 ? 6 : n < 10000000 ? 7 : 8;
  let e = o + <usize>len;
  while (n >= 100) {
    const q = n / 100;
    e -= 2;
    put2(e, n - q * 100);
    n = q;
  }
  if (n >= 10) { e -= 2; put2(e, n); } else store<u8>(e - 1, <u8>(48 + n));
  return o + <usize>len;
}

/** Exact decimal of a u64 (at most 20 digits). */
function writeU64(o: usize, v: u64): usize {
  if (v < 100000000) return writeSmall(o, <u32>v);
  const hi = v / 100000000;
  const lo = <u32>(v - hi * 100000000);
  if (hi < 100000000) o = writeSmall(o, <u32>hi);
  else {
    const top = <u32>(hi / 100000000); // < 184468
    o = writeSmall(o, top);
    o = write8(o, <u32>(hi - <u64>top * 100000000));
  }
  return write8(o, lo);
}

/**
 * One block `{"block_hash":e,"tokens_hash":t}` (with `,"copies":n` before the brace unless n is 1), with
 * a leading comma unless it is the event's first.
 */
@inline function writeBlock(o: usize, r: usize, first: bool): usize {
  copy16(o, jsonBlock + (first ? 1 : 0));
  o += first ? blockLen - 1 : blockLen;
  o = writeU64(o, load<u64>(r, ROW_HASH));
  copy16(o, jsonTokens);
  o = writeU64(o + tokensLen, load<u64>(r, ROW_TOKENS));
  const copies = load<u32>(r, ROW_COPIES);
  if (copies != 1) {
    copy16(o, jsonCopies);
    o = writeSmall(o + copiesLen, copies);
  }
  store<u8>(o, 0x7d);
  return o + 1;
}

export function dumpJson(st: usize, o: usize, limit: usize): usize {
  const rows = <usize>load<u32>(st, STATE_ROWS), len = load<u32>(st, STATE_LEN);
  let pos = load<u32>(st, STATE_POS), flags = load<u32>(st, STATE_FLAGS);
  let eventId = load<u64>(st, STATE_EVENT_ID);
  const prefix = <usize>load<u32>(st, STATE_PREFIX), prefixLen = <usize>load<u32>(st, STATE_PREFIX_LEN);
  const suffix = <usize>load<u32>(st, STATE_SUFFIX), suffixLen = <usize>load<u32>(st, STATE_SUFFIX_LEN);
  while (o < limit) {
    if (flags & STATE_INSIDE) {
      // inside an event: the next row continues it unless it starts an event of its own
      if (pos < len) {
        const r = rows + <usize>pos * ROW_BYTES;
        if ((load<u32>(r, ROW_FLAGS) & ROW_NEW_EVENT) == 0) {
          o = writeBlock(o, r, false);
          pos++;
          continue;
        }
      }
      memory.copy(o, suffix, suffixLen);
      o += suffixLen;
      flags = STATE_WROTE;
      continue;
    }
    if (pos >= len) break;
    const r = rows + <usize>pos * ROW_BYTES;
    if (flags & STATE_WROTE) { store<u8>(o, 0x2c); o++; }
    memory.copy(o, prefix, prefixLen);
    o = writeU64(o + prefixLen, eventId++);
    memory.copy(o, jsonParent, parentLen);
    o += parentLen;
    if (load<u32>(r, ROW_FLAGS) & ROW_HAS_PARENT) o = writeU64(o, load<u64>(r, ROW_PARENT));
    else { store<u32>(o, load<u32>(jsonNull)); o += 4; }
    memory.copy(o, jsonBlocks, blocksLen);
    o = writeBlock(o + blocksLen, r, true);
    pos++;
    flags = STATE_INSIDE | STATE_WROTE;
  }
  store<u32>(st, pos, STATE_POS);
  store<u32>(st, flags, STATE_FLAGS);
  store<u64>(st, eventId, STATE_EVENT_ID);
  return o;
}
